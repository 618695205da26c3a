// The head's softmax cross-entropy as two CUDA kernels (built with nvcc where
// the CUDA toolkit is found; see lib/CMakeLists.txt), for the GPT's loss over
// a vocabulary of tens of thousands of words.
//
// Shapes: logits [rows, ld] row-major, of which the first `vocab` columns
// are the words (ld >= vocab: the head's product runs over a vocabulary
// padded for alignment); targets [rows] int64; lse and loss [rows] fp32.
//
// Why: ATen's log-softmax of bf16 logits casts them to fp32 first, and its
// backward fills a zero tensor, scatters, and casts back: for gpt2-medium on
// an H100 about 7.5 ms a micro-batch of 8 x 1024 tokens, ten passes over
// 1.6 GB of fp32. Here the forward reads the logits once (an online max and
// sum of exponentials per row) and keeps only the rows' log-sum-exp; the
// backward reads them once more and writes the gradient in their dtype:
// three passes over the bf16 logits in all.
//
// Plain C++ interface (no LibTorch here), so that nvcc compiles only this.
// Thread-safety: the functions only queue work on `stream`.
// Failure: a launch error comes back as its message; nullptr is success.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace ob::model::cuda {

enum class LogitsType { kFloat32, kBFloat16 };

// lse[r] = log Σ_{j<vocab} exp(logits[r,j]); loss[r] = lse[r] − logits[r,
// targets[r]], or NaN where targets[r] is not in [0, vocab).
const char* CrossEntropyForward(LogitsType type, const void* logits, int64_t rows, int64_t ld, int64_t vocab,
                                const int64_t* targets, float* lse, float* loss, CUstream_st* stream);

// grad[r,j] = (*grad_loss) · scale · (exp(logits[r,j] − lse[r]) − [j = targets[r]])
// for j < vocab, 0 for vocab <= j < ld; grad has the logits' type and layout.
// grad_loss is a device pointer (the loss's incoming gradient: no host sync).
const char* CrossEntropyBackward(LogitsType type, const void* logits, int64_t rows, int64_t ld, int64_t vocab,
                                 const int64_t* targets, const float* lse, const float* grad_loss, float scale,
                                 void* grad, CUstream_st* stream);

}  // namespace ob::model::cuda
