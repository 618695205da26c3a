// The GPT head's loss: mean softmax cross-entropy over the first `vocab`
// columns of logits that may be padded for alignment.
//
// Shapes: logits [N, P] (P >= vocab; columns from vocab on are padding and
// take no part), targets [N] int64 in [0, vocab).
//
// On a CUDA tensor in a build with ob's kernels (OB_WITH_CUDA_KERNELS), two
// fused kernels (fused_loss.h): the forward reads the logits once in their
// dtype (bf16 or fp32) and keeps each row's log-sum-exp; the backward
// writes the gradient of the padded logits in their dtype (zero in the
// padding) from one more read. Everywhere else, log-softmax in fp32 and the
// negative log-likelihood, as ATen computes them. Both compute in fp32 and
// agree to rounding (model_test compares them where a GPU is present).
//
// Failure: a kernel that cannot be launched throws c10::Error; a target
// outside [0, vocab) gives a NaN loss on the fused path (ATen's asserts).
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace ob::model {

torch::Tensor CrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab);

// Whether CrossEntropy takes the fused kernels for tensors on `device`.
bool FusedCrossEntropyOn(const torch::Device& device);

// ATen's path whatever the device: the reference the fused one is tested
// against.
torch::Tensor ReferenceCrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab);

}  // namespace ob::model
