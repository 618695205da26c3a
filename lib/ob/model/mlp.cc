// GeluMlp (see linear.h): the GPT's MLP as one autograd function, its
// GELU in the products' cuBLASLt epilogues on a GPU (cublas_products.cc),
// its gradients summed as Linear's (linear_impl.h).
#include "ob/model/linear.h"

#include <atomic>

#include "ob/model/linear_impl.h"
#include "ob/torch_compat.h"

namespace ob::model {
namespace {

using namespace detail;  // linear_impl.h
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::atomic<int64_t> lt_forwards{0}, lt_backwards{0};

// The MLP's forward, x [..., in] in the compute dtype and w1c, b1c, w2c,
// b2c (b2c may be undefined) its weights in it: pre = x·w1cᵀ + b1c, h =
// gelu(pre), the result h·w2cᵀ + b2c. Saves what the backward reads: x,
// pre and h, as autograd would for the three operations; with `recompute`
// an undefined tensor in h's place (the backward computes it again).
torch::Tensor MlpForward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w1c,
                         const torch::Tensor& b1c, const torch::Tensor& w2c, const torch::Tensor& b2c,
                         std::vector<torch::Tensor> keep, bool recompute) {
  compat::AutocastOff off;
  auto x2 = x.reshape({-1, x.size(-1)}).contiguous();
  torch::Tensor pre, h;
  bool fused = false;
#ifdef OB_WITH_CUDA_KERNELS
  fused = !recompute && LtGeluForward(x2, w1c, b1c, pre, h);
  if (fused) lt_forwards.fetch_add(1, std::memory_order_relaxed);
#endif
  if (!fused) {
    pre = CpuWideAffine(x2, w1c, b1c);
    h = at::gelu(pre, "tanh");
  }
  auto y = CpuWideAffine(h, w2c, b2c);
  ctx->saved_data["recompute"] = recompute;
  keep.insert(keep.begin(), {x2, pre, recompute ? torch::Tensor() : h});
  ctx->save_for_backward(keep);
  auto shape = x.sizes().vec();
  shape.back() = y.size(-1);
  return y.view(shape);
}

// Its backward: dx for dy, the four (or three) parameters' gradients summed.
torch::Tensor MlpBackward(AutogradContext* ctx, const torch::Tensor& dy_out, const torch::Tensor& x2,
                          const torch::Tensor& pre, torch::Tensor h, const torch::Tensor& w1,
                          const torch::Tensor& b1, const torch::Tensor& w2, const torch::Tensor& b2,
                          const torch::Tensor& w1c, const torch::Tensor& w2c, at::IntArrayRef x_shape) {
  compat::AutocastOff off;
  if (ctx->saved_data["recompute"].toBool()) h = at::gelu(pre, "tanh");  // as the forward computed it
  auto dy = dy_out.to(x2.scalar_type()).reshape({-1, w2c.size(0)}).contiguous();
  torch::Tensor dpre, db1;
  bool fused = false;
#ifdef OB_WITH_CUDA_KERNELS
  fused = LtGeluBackward(dy, w2c, pre, dpre, db1);
  if (fused) lt_backwards.fetch_add(1, std::memory_order_relaxed);
#endif
  if (!fused) dpre = at::gelu_backward(CpuWideProduct(dy, w2c), pre, "tanh");
  if (w2.requires_grad()) AddWeightGradient(w2, dy, h);
  if (b2.defined() && b2.requires_grad()) AddBiasGradient(b2, dy);
  if (w1.requires_grad()) AddWeightGradient(w1, dpre, x2);
  if (b1.requires_grad()) {
    if (fused) {
      AddToGradient(b1, db1.to(torch::kFloat));
    } else {
      AddBiasGradient(b1, dpre);
    }
  }
  if (!ctx->needs_input_grad(0)) return torch::Tensor();
  return CpuWideProduct(dpre, w1c).view(x_shape);
}

// Inputs x, then the parameters (w1, b1, w2[, b2]) whose gradients it sums,
// then their compute-dtype copies.
struct MlpFn : public torch::autograd::Function<MlpFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w1,
                               const torch::Tensor& b1, const torch::Tensor& w2, const torch::Tensor& b2,
                               const torch::Tensor& w1c, const torch::Tensor& b1c, const torch::Tensor& w2c,
                               const torch::Tensor& b2c, bool recompute) {
    ctx->saved_data["shape"] = x.sizes().vec();
    return MlpForward(ctx, x, w1c, b1c, w2c, b2c, {w1, b1, w2, b2, w1c, w2c}, recompute);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto s = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["shape"].toIntVector();
    auto dx = MlpBackward(ctx, grad[0], s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], shape);
    variable_list out(10);
    out[0] = dx;
    return out;
  }
};

struct MlpNoBias2Fn : public torch::autograd::Function<MlpNoBias2Fn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w1,
                               const torch::Tensor& b1, const torch::Tensor& w2, const torch::Tensor& w1c,
                               const torch::Tensor& b1c, const torch::Tensor& w2c, bool recompute) {
    ctx->saved_data["shape"] = x.sizes().vec();
    return MlpForward(ctx, x, w1c, b1c, w2c, torch::Tensor(), {w1, b1, w2, w1c, w2c}, recompute);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto s = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["shape"].toIntVector();
    auto dx = MlpBackward(ctx, grad[0], s[0], s[1], s[2], s[3], s[4], s[5], torch::Tensor(), s[6], s[7], shape);
    variable_list out(8);
    out[0] = dx;
    return out;
  }
};

}  // namespace

torch::Tensor GeluMlp(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& b1,
                      const torch::Tensor& w2, const torch::Tensor& b2, bool recompute_activation) {
  auto composed = [&] {
    auto h = at::gelu(Linear(x, w1, b1), "tanh");
    return Linear(h, w2, b2);
  };
  const bool leaves = w1.is_leaf() && b1.is_leaf() && w2.is_leaf() && (!b2.defined() || b2.is_leaf());
  if (!torch::GradMode::is_enabled() || !w1.requires_grad() || !w2.requires_grad() || !leaves) return composed();
  const auto autocast = compat::AutocastDtype(x);
  if (!autocast && (w1.scalar_type() != x.scalar_type() || w2.scalar_type() != x.scalar_type())) return composed();
  const auto dtype = autocast.value_or(x.scalar_type());
  const auto xc = x.to(dtype);
  if (!b2.defined()) {
    return MlpNoBias2Fn::apply(xc, w1, b1, w2, InDtype(w1, dtype), InDtype(b1, dtype), InDtype(w2, dtype),
                               recompute_activation);
  }
  return MlpFn::apply(xc, w1, b1, w2, b2, InDtype(w1, dtype), InDtype(b1, dtype), InDtype(w2, dtype),
                      InDtype(b2, dtype), recompute_activation);
}

std::pair<int64_t, int64_t> GeluMlpEpilogueCounts() {
  return {lt_forwards.load(std::memory_order_relaxed), lt_backwards.load(std::memory_order_relaxed)};
}

}  // namespace ob::model
