// Compute-dtype copies of the weights (see compute_copies.h).
#include "ob/model/compute_copies.h"

#include "ob/torch_compat.h"

#include <torch/autograd.h>

namespace ob::model {
namespace {

thread_local ComputeCopies* current = nullptr;

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// `copy` (a copy of p, rows padded or not) as a differentiable function of
// p: the gradient of the copy's first p.size(0) rows, in p's dtype.
struct FromCopyFn : public torch::autograd::Function<FromCopyFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& p, const torch::Tensor& copy) {
    ctx->saved_data["rows"] = p.size(0);
    ctx->saved_data["dtype"] = static_cast<int64_t>(p.scalar_type());
    return copy.alias();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const int64_t rows = ctx->saved_data["rows"].toInt();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    torch::Tensor g = grad[0];
    if (g.defined() && g.size(0) != rows) g = g.narrow(0, 0, rows);
    if (g.defined()) g = g.to(dtype);
    return {g, torch::Tensor()};
  }
};

}  // namespace

int64_t PaddedRows(int64_t rows, int64_t multiple) {
  return multiple <= 1 ? rows : (rows + multiple - 1) / multiple * multiple;
}

ComputeCopies::ComputeCopies(const std::vector<torch::Tensor>& params, at::ScalarType dtype,
                             const torch::Tensor& padded, int64_t rows_multiple)
    : dtype_(dtype) {
  torch::NoGradGuard no_grad;
  for (const auto& p : params) {
    if (index_.count(p.unsafeGetTensorImpl()) != 0) continue;
    Copy c;
    c.param = p;
    const bool pad = padded.defined() && padded.unsafeGetTensorImpl() == p.unsafeGetTensorImpl() &&
                     p.dim() == 2 && rows_multiple > 1;
    c.multiple = pad ? rows_multiple : 1;
    auto sizes = p.sizes().vec();
    if (pad) sizes[0] = PaddedRows(sizes[0], rows_multiple);
    c.whole = torch::empty(sizes, p.options().dtype(dtype));
    c.rows = c.whole;
    if (pad && sizes[0] != p.size(0)) {
      c.whole.narrow(0, p.size(0), sizes[0] - p.size(0)).zero_();
      c.rows = c.whole.narrow(0, 0, p.size(0));
    }
    index_.emplace(p.unsafeGetTensorImpl(), copies_.size());
    copies_.push_back(std::move(c));
  }
}

void ComputeCopies::Refresh() {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> to, from;
  to.reserve(copies_.size());
  from.reserve(copies_.size());
  for (auto& c : copies_) {
    to.push_back(c.rows);
    from.push_back(c.param);
  }
  compat::ForeachCopy(to, from);
  for (auto& c : copies_) {
    c.version = c.param._version();
    c.data = c.param.data_ptr();
    c.fresh = true;
  }
}

ComputeCopies::Scope::Scope(ComputeCopies* copies) : previous_(current) { current = copies; }

ComputeCopies* ComputeCopies::Current() { return current; }
ComputeCopies::Scope::~Scope() { current = previous_; }

torch::Tensor ComputeCopies::Find(const torch::Tensor& p, at::ScalarType dtype, int64_t rows_multiple) {
  ComputeCopies* self = current;
  if (self == nullptr || dtype != self->dtype_) return {};
  auto it = self->index_.find(p.unsafeGetTensorImpl());
  if (it == self->index_.end()) return {};
  const Copy& c = self->copies_[it->second];
  // The same weight, unchanged since the copy: its version counter counts
  // every in-place write (the optimizer's, a load's copy_), and a new
  // storage (set_data) would leave the copy of the old one.
  if (!c.fresh || c.param._version() != c.version || c.param.data_ptr() != c.data) {
    self->misses_.fetch_add(1, std::memory_order_relaxed);
    return {};
  }
  if (rows_multiple <= 1) return c.rows;
  return c.multiple == rows_multiple ? c.whole : torch::Tensor();
}

torch::Tensor ComputeWeight(const torch::Tensor& p, at::ScalarType dtype, int64_t rows_multiple) {
  const int64_t rows = p.dim() > 0 ? p.size(0) : 0;
  const int64_t padded = PaddedRows(rows, rows_multiple);
  if (auto copy = ComputeCopies::Find(p, dtype, padded != rows ? rows_multiple : 1); copy.defined()) {
    return FromCopyFn::apply(p, copy);
  }
  auto cast = p.scalar_type() == dtype ? p : compat::CachedCast(p, dtype);
  if (padded == rows) return cast;
  // Padded after the cast: the cast is cached, and the padding moves half
  // the bytes it would in fp32.
  compat::AutocastOff off;
  return torch::constant_pad_nd(cast, {0, 0, 0, padded - rows});
}

}  // namespace ob::model
