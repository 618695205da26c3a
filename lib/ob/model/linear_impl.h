// The dense layers' private parts (linear.h): the gradient sums and the
// products that linear.cc (Linear), mlp.cc (GeluMlp) and layer_norm.cc
// (LayerNorm) share, and the cuBLAS and cuBLASLt calls of a CUDA build
// (cublas_products.cc). Nothing outside lib/ob/model includes it.
#pragma once

#include <torch/torch.h>

namespace ob::model::detail {

// The products of bf16 operands on the CPU, as the GPU's GEMM computes
// them: widened to fp32, summed in fp32 (see linear.cc). x·wᵀ + b (b may be
// undefined), and a·b as torch::matmul.
torch::Tensor CpuWideAffine(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b);
torch::Tensor CpuWideProduct(const torch::Tensor& a, const torch::Tensor& b);

// p.grad() += update, or p.grad() = update where it is not defined yet, as
// autograd's accumulation does.
// These three sum now, or, inside a DeferWeightGradients scope
// (weight_grads.h), keep what the sum reads for its W pass; the Sum…
// versions always sum now.
void AddToGradient(const torch::Tensor& p, const torch::Tensor& update);
// True where `p`'s gradient is an fp32 tensor of its shape on `on`'s device
// that a product can add into.
bool SummableGradient(const torch::Tensor& p, const torch::Tensor& on);
// w.grad() += dyᵀ·x for dy [N, out], x [N, in] (both bf16 or both fp32),
// and b.grad() += Σ_rows dy, accumulated in fp32.
void AddWeightGradient(const torch::Tensor& w, const torch::Tensor& dy, const torch::Tensor& x);
void AddBiasGradient(const torch::Tensor& b, const torch::Tensor& dy);
void SumIntoGradient(const torch::Tensor& p, const torch::Tensor& update);
void SumWeightGradient(const torch::Tensor& w, const torch::Tensor& dy, const torch::Tensor& x);
void SumBiasGradient(const torch::Tensor& b, const torch::Tensor& dy);

// `p` in `dtype`, without a graph: the current ComputeCopies' copy, else
// autocast's cached cast where it makes one.
torch::Tensor InDtype(const torch::Tensor& p, at::ScalarType dtype);

#ifdef OB_WITH_CUDA_KERNELS
// g [out, in] fp32 += dyᵀ·x for dy [N, out], x [N, in] (bf16 or fp32), in
// one cuBLAS GEMM; g [out] fp32 += Σ_rows dy likewise (cublas_products.cc).
void CublasAccumulate(torch::Tensor& g, const torch::Tensor& dy, const torch::Tensor& x);
void CublasAccumulateBias(torch::Tensor& g, const torch::Tensor& dy);
// cuBLASLt's GELU epilogues for the MLP (cublas_products.cc): false, having
// launched nothing, where cuBLASLt has no algorithm (or OB_LT_GELU=0).
// pre = x·wᵀ + b and h = gelu(pre), both [N, out] bf16, for x [N, in],
// w [out, in], b [out] (bf16).
bool LtGeluForward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, torch::Tensor& pre,
                   torch::Tensor& h);
// dpre = (dy·w) ∘ gelu'(pre) [N, mid] bf16 and db = Σ_rows dpre [mid] (fp32
// or bf16), for dy [N, out], w [out, mid], pre [N, mid].
bool LtGeluBackward(const torch::Tensor& dy, const torch::Tensor& w, const torch::Tensor& pre,
                    torch::Tensor& dpre, torch::Tensor& db);
#endif

}  // namespace ob::model::detail
