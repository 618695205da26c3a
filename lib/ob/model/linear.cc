// The dense layers' product and its fused weight-gradient accumulation (see linear.h).
#include "ob/model/linear.h"

#include <limits>

#include "ob/torch_compat.h"

#ifdef OB_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublas_v2.h>
#endif

namespace ob::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

#ifdef OB_WITH_CUDA_KERNELS
// g [out, in] fp32 += dyᵀ·x for dy [N, out], x [N, in] (bf16 or fp32), in
// one GEMM. In cuBLAS's column-major terms g is [in, out] = x[in, N] ·
// dy[N, out] (x as stored, dy transposed).
void CublasAccumulate(torch::Tensor& g, const torch::Tensor& dy, const torch::Tensor& x) {
  const int64_t rows = x.size(0), in = x.size(1), out = dy.size(1);
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  TORCH_CHECK(rows <= kMax && in <= kMax && out <= kMax, "linear: a product larger than cuBLAS's int sizes");
  const auto type = x.scalar_type() == torch::kBFloat16 ? CUDA_R_16BF : CUDA_R_32F;
  const float one = 1.f;
  c10::cuda::CUDAGuard device(g.device());
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();  // bound to the current stream
  const cublasStatus_t status =
      cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(in), static_cast<int>(out),
                   static_cast<int>(rows), &one, x.data_ptr(), type, static_cast<int>(in), dy.data_ptr(), type,
                   static_cast<int>(out), &one, g.data_ptr(), CUDA_R_32F, static_cast<int>(in),
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS, "linear: cublasGemmEx of the weight gradient failed (status ",
              static_cast<int>(status), ")");
}
#endif

// p.grad() += update, or p.grad() = update where it is not defined yet, as
// autograd's accumulation does.
void AddToGradient(const torch::Tensor& p, const torch::Tensor& update) {
  auto& g = const_cast<torch::Tensor&>(p).mutable_grad();
  if (g.defined()) {
    g.add_(update);
  } else {
    g = update.to(p.scalar_type()).clone(at::MemoryFormat::Contiguous);
  }
}

// w.grad() += dyᵀ·x for dy [N, out], x [N, in] (both bf16 or both fp32), accumulated
// in fp32, in the product itself where the gradient is an fp32 tensor of
// w's shape.
void AddWeightGradient(const torch::Tensor& w, const torch::Tensor& dy, const torch::Tensor& x) {
  auto& g = const_cast<torch::Tensor&>(w).mutable_grad();
  const bool in_place = g.defined() && g.scalar_type() == torch::kFloat && g.sizes() == w.sizes() &&
                        g.device() == x.device() && g.is_contiguous();
#ifdef OB_WITH_CUDA_KERNELS
  if (in_place && g.is_cuda() && (x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kFloat)) {
    CublasAccumulate(g, dy, x);
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
  AddToGradient(w, torch::mm(dy.t().to(torch::kFloat), x.to(torch::kFloat)));
}

// dx for dy, the weight and bias gradients summed (b may be undefined).
torch::Tensor Backward(AutogradContext* ctx, const torch::Tensor& dy_out, const torch::Tensor& x,
                       const torch::Tensor& w, const torch::Tensor& b, const torch::Tensor& wc) {
  compat::AutocastOff off;
  const int64_t in = x.size(-1), out = wc.size(0);
  auto dy = dy_out.to(x.scalar_type());
  torch::Tensor dx;
  if (ctx->needs_input_grad(0)) dx = torch::matmul(dy, wc);
  auto dy2 = dy.reshape({-1, out}).contiguous();
  if (w.requires_grad()) AddWeightGradient(w, dy2, x.reshape({-1, in}).contiguous());
  if (b.defined() && b.requires_grad()) AddToGradient(b, dy2.sum(0, false, torch::kFloat));
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
    return torch::linear(x, wc, bc);
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
    return torch::linear(x, wc);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto s = ctx->get_saved_variables();
    return {Backward(ctx, grad[0], s[0], s[1], torch::Tensor(), s[2]), torch::Tensor(), torch::Tensor()};
  }
};

// `p` in `dtype`, without a graph: autocast's cached copy where it makes one.
torch::Tensor InDtype(const torch::Tensor& p, at::ScalarType dtype) {
  return (p.scalar_type() == dtype ? p : compat::CachedCast(p, dtype)).detach();
}

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

}  // namespace ob::model
