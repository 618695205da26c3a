// Linear (see linear.h): the dense layers' product, whose backward sums the
// weight's gradient into the fp32 gradient in the product itself; and the
// gradient sums and CPU products it shares with mlp.cc and layer_norm.cc
// (linear_impl.h).
#include "ob/model/linear.h"

#include "ob/model/kernel_switch.h"
#include "ob/model/linear_impl.h"

#include <cstdlib>
#include <cstring>

#include "ob/model/compute_copies.h"
#include "ob/model/weight_grads.h"
#include "ob/torch_compat.h"

namespace ob::model {
namespace {

// The products of bf16 operands on the CPU, as the GPU's GEMM computes
// them: widened to fp32 (a product of two bf16 values is exact in fp32),
// summed in fp32 with the bias, the result rounded to bf16 once. LibTorch's
// CPU kernel for bf16 products, on a CPU without AVX-512 BF16, took 3.5
// times as long as an fp32 step's (gpt-tiny on 2x2 workers, 0.39 s a step
// against 0.10). Anything else goes to LibTorch as given.
bool WidenOnCpu(const torch::Tensor& a) { return !a.is_cuda() && a.scalar_type() == torch::kBFloat16; }

torch::Tensor Widened(const torch::Tensor& t) { return t.defined() ? t.to(torch::kFloat) : t; }

}  // namespace

namespace detail {

// x·wᵀ + b (b may be undefined).
torch::Tensor CpuWideAffine(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  if (!WidenOnCpu(x)) return b.defined() ? torch::linear(x, w, b) : torch::linear(x, w);
  auto y = b.defined() ? torch::linear(Widened(x), Widened(w), Widened(b)) : torch::linear(Widened(x), Widened(w));
  return y.to(x.scalar_type());
}

// a·b, as torch::matmul.
torch::Tensor CpuWideProduct(const torch::Tensor& a, const torch::Tensor& b) {
  if (!WidenOnCpu(a)) return torch::matmul(a, b);
  return torch::matmul(Widened(a), Widened(b)).to(a.scalar_type());
}

// p.grad() += update, or p.grad() = update where it is not defined yet, as
// autograd's accumulation does.
void AddToGradient(const torch::Tensor& p, const torch::Tensor& update) {
  if (auto* w = DeferringWeightGradients()) return w->Keep(WeightGradients::Kind::kAdd, p, update);
  SumIntoGradient(p, update);
}

void SumIntoGradient(const torch::Tensor& p, const torch::Tensor& update) {
  auto& g = const_cast<torch::Tensor&>(p).mutable_grad();
  if (g.defined()) {
    g.add_(update);
  } else {
    g = update.to(p.scalar_type()).clone(at::MemoryFormat::Contiguous);
  }
}

// True where `p`'s gradient is an fp32 tensor of its shape on `on`'s device
// that a product can add into.
bool SummableGradient(const torch::Tensor& p, const torch::Tensor& on) {
  const auto& g = p.grad();
  return g.defined() && g.scalar_type() == torch::kFloat && g.sizes() == p.sizes() && g.device() == on.device() &&
         g.is_contiguous();
}

// w.grad() += dyᵀ·x for dy [N, out], x [N, in] (both bf16 or both fp32), accumulated
// in fp32, in the product itself where the gradient is an fp32 tensor of
// w's shape.
void AddWeightGradient(const torch::Tensor& w, const torch::Tensor& dy, const torch::Tensor& x) {
  if (auto* q = DeferringWeightGradients()) return q->Keep(WeightGradients::Kind::kWeight, w, dy, x);
  SumWeightGradient(w, dy, x);
}

void SumWeightGradient(const torch::Tensor& w, const torch::Tensor& dy, const torch::Tensor& x) {
  auto& g = const_cast<torch::Tensor&>(w).mutable_grad();
  const bool in_place = SummableGradient(w, x);
#ifdef OB_WITH_CUDA_KERNELS
  if (in_place && g.is_cuda() && (x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kFloat)) {
    if (GradientGemmsOn(g.device())) {
      CublasAccumulate(g, dy, x);
    } else {  // ATen's product in the operands' dtype, then an add (autograd's arithmetic)
      g.add_(torch::mm(dy.t(), x));
    }
    return;
  }
#endif
  if (in_place) {
    // As the GPU's GEMM does: bf16 operands, their products and sums in fp32
    // (a product of two bf16 values is exact in fp32), the result in fp32;
    // a bf16 product would round each micro-batch's gradient to bf16 first.
    g.addmm_(dy.t().to(torch::kFloat), x.to(torch::kFloat));
    return;
  }
  SumIntoGradient(w, torch::mm(dy.t().to(torch::kFloat), x.to(torch::kFloat)));
}

// b.grad() += Σ_rows dy for dy [N, out], summed in fp32.
void AddBiasGradient(const torch::Tensor& b, const torch::Tensor& dy) {
  if (auto* q = DeferringWeightGradients()) return q->Keep(WeightGradients::Kind::kBias, b, dy);
  SumBiasGradient(b, dy);
}

void SumBiasGradient(const torch::Tensor& b, const torch::Tensor& dy) {
#ifdef OB_WITH_CUDA_KERNELS
  if (GradientGemmsOn(dy.device()) && SummableGradient(b, dy) &&
      (dy.scalar_type() == torch::kBFloat16 || dy.scalar_type() == torch::kFloat)) {
    auto& g = const_cast<torch::Tensor&>(b).mutable_grad();
    CublasAccumulateBias(g, dy);
    return;
  }
#endif
  SumIntoGradient(b, dy.sum(0, false, torch::kFloat));
}

// `p` in `dtype`, without a graph: the current ComputeCopies' copy, else
// autocast's cached cast where it makes one.
torch::Tensor InDtype(const torch::Tensor& p, at::ScalarType dtype) {
  if (p.scalar_type() == dtype) return p.detach();
  if (auto copy = ComputeCopies::Find(p, dtype); copy.defined()) return copy;
  return compat::CachedCast(p, dtype).detach();
}

}  // namespace detail

namespace {

using namespace detail;  // linear_impl.h
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// dx for dy, the weight and bias gradients summed (b may be undefined).
torch::Tensor Backward(AutogradContext* ctx, const torch::Tensor& dy_out, const torch::Tensor& x,
                       const torch::Tensor& w, const torch::Tensor& b, const torch::Tensor& wc) {
  compat::AutocastOff off;
  const int64_t in = x.size(-1), out = wc.size(0);
  auto dy = dy_out.to(x.scalar_type());
  torch::Tensor dx;
  if (ctx->needs_input_grad(0)) dx = CpuWideProduct(dy, wc);
  auto dy2 = dy.reshape({-1, out}).contiguous();
  if (w.requires_grad()) AddWeightGradient(w, dy2, x.reshape({-1, in}).contiguous());
  if (b.defined() && b.requires_grad()) AddBiasGradient(b, dy2);
  return dx;
}

// x in the compute dtype; wc, bc the compute-dtype copies of w, b; w, b the
// parameters whose gradients it sums. (Two functions, with and without a
// bias: LibTorch 1.13's custom functions take no undefined inputs.)
struct LinearFn : public torch::autograd::Function<LinearFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& b, const torch::Tensor& wc, const torch::Tensor& bc) {
    compat::AutocastOff off;
    ctx->save_for_backward({x, w, b, wc});
    return CpuWideAffine(x, wc, bc);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto s = ctx->get_saved_variables();
    return {Backward(ctx, grad[0], s[0], s[1], s[2], s[3]), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

struct LinearNoBiasFn : public torch::autograd::Function<LinearNoBiasFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& wc) {
    compat::AutocastOff off;
    ctx->save_for_backward({x, w, wc});
    return CpuWideAffine(x, wc, torch::Tensor());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto s = ctx->get_saved_variables();
    return {Backward(ctx, grad[0], s[0], s[1], torch::Tensor(), s[2]), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  const bool leaves = w.is_leaf() && (!b.defined() || b.is_leaf());
  if (!torch::GradMode::is_enabled() || !w.requires_grad() || !leaves) return torch::linear(x, w, b);
  // Without autocast the operands must agree already (torch::linear says so).
  const auto autocast = compat::AutocastDtype(x);
  if (!autocast && w.scalar_type() != x.scalar_type()) return torch::linear(x, w, b);
  const auto dtype = autocast.value_or(x.scalar_type());
  if (!b.defined()) return LinearNoBiasFn::apply(x.to(dtype), w, InDtype(w, dtype));
  return LinearFn::apply(x.to(dtype), w, b, InDtype(w, dtype), InDtype(b, dtype));
}

bool GradientGemmsOn(const torch::Device& device) {
  static const bool on = kCudaKernels && KernelSwitchedOn("OB_GEMM_ACCUMULATE");
  return on && device.is_cuda();
}

bool KernelSwitchedOn(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

}  // namespace ob::model
