// x·wᵀ + b for the GPT's dense layers, with the weight's gradient summed
// into its gradient by the product itself (Megatron-LM's "gradient
// accumulation fusion").
//
// Shapes: x [..., in], w [out, in] (fp32 master weights under autocast),
// b [out] or undefined; result [..., out] in autocast's dtype where autocast
// is on for x's device, else in x's.
//
// Why: under bf16 autocast, autograd gives each micro-batch's weight
// gradient in bf16, casts it to fp32 (the backward of autocast's cast) and
// adds it to the fp32 gradient: two element-wise kernels per parameter per
// micro-batch, ~2,300 launches and ~14 ms of a 236 ms gpt2-medium step on
// an H100, and the bias gradient is rounded to bf16 on the way. Here the
// backward adds dyᵀ·x into w.grad() in one product: on a GPU (a build with
// OB_WITH_CUDA_KERNELS) a cuBLAS GEMM that reads the bf16 operands and
// accumulates into the fp32 gradient (beta = 1); on the CPU addmm_ of the
// operands widened to fp32, the same arithmetic (a product of two bf16
// values is exact in fp32). The bias gradient is summed in fp32.
// Autograd is handed no gradient for w and b: a gradient that is not yet
// defined is made here, as autograd would make it.
//
// Taken when grad mode is on and w (and b) are leaves that require grad;
// otherwise, and for no-grad forwards, torch::linear.
// REQUIRES: no other thread reads or writes w.grad() and b.grad() during
// backward (as for autograd's own accumulation).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace ob::model {

torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b);

// The GPT's MLP, gelu_tanh(x·w1ᵀ + b1)·w2ᵀ + b2 (b2 may be undefined: a
// tensor-parallel shard's, added after the reduction), with Linear's
// gradient sums, as one autograd function: on a GPU (OB_WITH_CUDA_KERNELS,
// bf16) the first product's epilogue adds the bias and applies GELU, and
// the backward's product through the second weight applies GELU's
// gradient and sums the first bias's gradient in its epilogue (cuBLASLt's
// GELU_AUX_BIAS and DGELU_BGRAD, tanh GELU), where two element-wise
// kernels over [N, 4h] and a reduction ran a block a micro-batch (10.4 ms
// of GELU in a 236 ms gpt2-medium step on an H100). Elsewhere, or where
// cuBLASLt has no algorithm for the shapes (or OB_LT_GELU=0), ATen's
// product, gelu and gelu_backward: on the CPU the same operations as
// Linear, gelu, Linear. Keeps what autograd would (x, the pre-activation
// and the activation). Bias gradients everywhere (Linear too) are summed
// into fp32 gradients; on a GPU by a product with a column of ones.
// With `recompute_activation` (selective recomputation, recompute.h) it
// keeps x and the pre-activation only, and its backward computes the
// activation again (the same kernel: the same values; a GPU then runs the
// GELU outside the product's epilogue, whose fp32 GELU a bf16
// pre-activation would not reproduce).
torch::Tensor GeluMlp(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& b1,
                      const torch::Tensor& w2, const torch::Tensor& b2, bool recompute_activation = false);
// layer_norm(x, shape, w, b, eps) for x in autocast's dtype and fp32 gain
// and bias w, b: the kernel reads their compute copies (ComputeCopies, or
// autocast's casts), and the backward adds their bf16 gradients into the
// fp32 ones (one kernel each, where autograd's cast and add took two: 392
// launches a gpt2-medium step of four micro-batches). Same values as
// autograd's. On a GPU (OB_WITH_CUDA_KERNELS, bf16, fp32 gradients to add
// into) norm_grad.cu's kernels sum the gain's and bias's gradients in fp32
// straight into them instead (OB_LN_KERNEL=0: ATen's kernel and the adds).
// Without autocast, or x not in its dtype, torch::layer_norm.
torch::Tensor LayerNorm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                        const std::vector<int64_t>& shape, double eps);
// Whether Linear and GeluMlp sum weight and bias gradients into the fp32
// gradients by cuBLAS (beta = 1) for tensors on `device`: a build with
// OB_WITH_CUDA_KERNELS, a GPU, and not OB_GEMM_ACCUMULATE=0 (then ATen's
// product in the operands' dtype and an add, autograd's arithmetic).
bool GradientGemmsOn(const torch::Device& device);
// How many of LayerNorm's backwards (this process's) ran norm_grad.cu's
// kernels: tests and benches see whether the GPU took them.
int64_t LayerNormKernelCount();

// How many of GeluMlp's forwards and backwards (this process's) ran
// cuBLASLt's epilogues: tests and benches see whether the GPU took them.
std::pair<int64_t, int64_t> GeluMlpEpilogueCounts();

}  // namespace ob::model
