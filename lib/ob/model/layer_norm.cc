// LayerNorm (see linear.h): a layer norm over compute copies of its gain
// and bias whose backward adds their gradients into the fp32 ones, on a
// GPU by norm_grad.cu's kernels.
#include "ob/model/linear.h"

#include <algorithm>
#include <atomic>

#include "ob/model/compute_copies.h"
#include "ob/model/kernel_switch.h"
#include "ob/model/linear_impl.h"
#include "ob/torch_compat.h"

#ifdef OB_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "ob/model/norm_grad.h"
#endif

namespace ob::model {
namespace {

using namespace detail;  // linear_impl.h
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::atomic<int64_t> norm_kernels{0};

#ifdef OB_WITH_CUDA_KERNELS
// dgamma/dbeta of a layer norm summed into w's and b's fp32 gradients by
// norm_grad.cu's kernels, where they apply: bf16 x and dy contiguous on a
// GPU, 16-byte aligned, a multiple of 8 columns, fp32 statistics, and fp32
// gradients to add into (OB_LN_KERNEL=0: never). False: nothing done.
bool NormKernelGradients(const torch::Tensor& dy, const torch::Tensor& x, const torch::Tensor& mean,
                         const torch::Tensor& rstd, const torch::Tensor& w, const torch::Tensor& b) {
  static const bool enabled = KernelSwitchedOn("OB_LN_KERNEL");
  if (!enabled || !x.is_cuda() || x.scalar_type() != torch::kBFloat16 || dy.scalar_type() != torch::kBFloat16 ||
      !x.is_contiguous() || !dy.is_contiguous() || dy.sizes() != x.sizes() || w.dim() != 1 ||
      mean.scalar_type() != torch::kFloat || rstd.scalar_type() != torch::kFloat || !mean.is_contiguous() ||
      !rstd.is_contiguous() || !SummableGradient(w, x) || !SummableGradient(b, x) || dy.device() != x.device()) {
    return false;
  }
  const int64_t cols = w.size(0), rows = x.numel() / std::max<int64_t>(cols, 1);
  if (cols == 0 || cols % 8 != 0 || x.size(-1) != cols || mean.numel() != rows || rstd.numel() != rows ||
      reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 != 0 || reinterpret_cast<uintptr_t>(dy.data_ptr()) % 16 != 0) {
    return false;
  }
  c10::cuda::CUDAGuard device(x.device());
  auto scratch = torch::empty({cuda::LayerNormScratchFloats(rows, cols)}, x.options().dtype(torch::kFloat));
  const char* error = cuda::LayerNormParamGradients(
      dy.data_ptr(), x.data_ptr(), mean.data_ptr<float>(), rstd.data_ptr<float>(), rows, cols,
      scratch.data_ptr<float>(), const_cast<torch::Tensor&>(w).mutable_grad().data_ptr<float>(),
      const_cast<torch::Tensor&>(b).mutable_grad().data_ptr<float>(),
      c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(error == nullptr, "layer norm: gain and bias gradients: ", error);
  norm_kernels.fetch_add(1, std::memory_order_relaxed);
  return true;
}
#endif

// A layer norm over the last dimensions `shape` of x (in the compute
// dtype) with gain and bias copies wc, bc in it; the gradients of the fp32
// gain and bias w, b are added into theirs.
struct LayerNormFn : public torch::autograd::Function<LayerNormFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& b, const torch::Tensor& wc, const torch::Tensor& bc,
                               std::vector<int64_t> shape, double eps) {
    compat::AutocastOff off;
    auto [y, mean, rstd] = at::native_layer_norm(x, shape, wc, bc, eps);
    ctx->save_for_backward({x, mean, rstd, w, b, wc, bc});
    ctx->saved_data["shape"] = shape;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    compat::AutocastOff off;
    const auto s = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["shape"].toIntVector();
    const torch::Tensor &x = s[0], &w = s[3], &b = s[4];
    const auto dy = grad[0].to(x.scalar_type()).contiguous();
    bool want_w = w.requires_grad(), want_b = b.requires_grad();
#ifdef OB_WITH_CUDA_KERNELS
    if (want_w && want_b && NormKernelGradients(dy, x, s[1], s[2], w, b)) want_w = want_b = false;  // summed
#endif
    const bool want_x = ctx->needs_input_grad(0);
    if (!want_x && !want_w && !want_b) return variable_list(7);
    auto [dx, dw, db] =
        at::native_layer_norm_backward(dy, x, shape, s[1], s[2], s[5], s[6], {want_x, want_w, want_b});
    // fp32 += bf16 in one kernel, where autograd casts and then adds.
    if (dw.defined()) AddToGradient(w, dw);
    if (db.defined()) AddToGradient(b, db);
    return {dx, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor LayerNorm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                        const std::vector<int64_t>& shape, double eps) {
  const auto dtype = compat::AutocastDtype(x);
  if (!dtype || x.scalar_type() != *dtype || w.scalar_type() == *dtype) {
    return torch::layer_norm(x, shape, w, b, eps);
  }
  const bool graph = torch::GradMode::is_enabled() && w.requires_grad() && b.requires_grad() && w.is_leaf() &&
                     b.is_leaf();
  if (!graph) {  // as autograd would, from the copies or autocast's casts
    auto wc = ComputeWeight(w, *dtype), bc = ComputeWeight(b, *dtype);
    compat::AutocastOff off;
    return torch::layer_norm(x, shape, wc, bc, eps);
  }
  return LayerNormFn::apply(x, w, b, InDtype(w, *dtype), InDtype(b, *dtype), shape, eps);
}

int64_t LayerNormKernelCount() { return norm_kernels.load(std::memory_order_relaxed); }

}  // namespace ob::model
