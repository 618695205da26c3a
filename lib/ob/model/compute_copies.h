// Compute-dtype copies of a stage's fp32 weights, refreshed by one
// multi-tensor copy a step.
//
// Under bf16 autocast every fp32 weight is cast to bf16 before its first
// use in a step (autocast's cache keeps the cast for the step's other
// micro-batches): one cast kernel per parameter, 302 launches and 4.8 ms of
// a 236 ms gpt2-medium step on an H100, most of them launch-bound. The
// head's weight is worse: it is padded in fp32 and cast again every
// micro-batch, since a padded copy is no leaf for autocast to cache.
// ComputeCopies keeps a bf16 copy of each weight (the head's table padded to
// a multiple of rows, its padding zero) and Refresh() rewrites all of them
// with one _foreach_copy_ (a few multi-tensor kernels on CUDA; LibTorch
// 1.13, which lacks it, copies one by one). While a ComputeCopies::Scope
// lives on a thread, the model's layers (Linear, GeluMlp, the layer norms,
// the head) take their weights from it instead of from autocast's cache.
// The values are those of autocast's cast (both round to nearest even), so
// results are bit for bit the same.
//
// Never stale: each copy records its weight's version counter and storage at
// Refresh(); a weight changed since by an ATen op (an optimizer step, a
// load's copy_) no longer matches, and its users fall back to autocast's
// cast. The fallback is correct, only slower; Misses() counts it. Writes the
// counter cannot see (a collective receiving a recovery's weights) happen
// only between steps, so Refresh() must run, unconditionally, before each
// step's (and evaluation's) forwards: it copies every weight, changed or not.
//
// A stage's copies: GptStageImpl::MakeComputeCopies; any layers':
// MakeComputeCopies (gpt.h).
//
// Memory: 2 bytes a parameter for the run, where autocast's cache held the
// same casts from a step's first forward to the end of its backward: the
// peak (during the backward) is unchanged.
//
// Thread-safety: Refresh() and Scope on the thread that runs the forwards;
// backwards read only what forwards saved.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace ob::model {

// `rows` rounded up to a multiple of `multiple` (itself when multiple <= 1):
// the rows of a padded table.
int64_t PaddedRows(int64_t rows, int64_t multiple);

class ComputeCopies {
 public:
  // Copies of `params` (fp32; each once) in `dtype`; `padded` (may be
  // undefined) is one of them whose copy has its rows padded to a multiple
  // of `rows_multiple` (the head's table). Allocates; Refresh() fills.
  ComputeCopies(const std::vector<torch::Tensor>& params, at::ScalarType dtype,
                const torch::Tensor& padded = {}, int64_t rows_multiple = 1);

  // Copies every weight into its copy, and records its version.
  void Refresh();

  // Makes this the current copies of the calling thread while it lives.
  class Scope {
   public:
    explicit Scope(ComputeCopies* copies);  // nullptr: none (autocast's casts)
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    ComputeCopies* previous_;
  };

  // The calling thread's current copies (nullptr: none): what a
  // recomputation in the backward makes current again (recompute.h).
  static ComputeCopies* Current();

  // How often a user found its weight changed since Refresh() (and cast it).
  int64_t Misses() const { return misses_.load(std::memory_order_relaxed); }

  // The current thread's copy of `p` in `dtype` (its rows padded when it is
  // the padded weight and `rows_multiple` matches, else [rows, ...]), or an
  // undefined tensor: no Scope, another dtype, not one of the weights, or
  // changed since Refresh(). No autograd graph.
  static torch::Tensor Find(const torch::Tensor& p, at::ScalarType dtype, int64_t rows_multiple = 1);

 private:
  struct Copy {
    torch::Tensor param;
    torch::Tensor whole;  // the copy, padded rows included
    torch::Tensor rows;   // its first p.size(0) rows: p's shape
    int64_t multiple = 1;
    uint32_t version = 0;         // param's at Refresh()
    const void* data = nullptr;   // its storage then
    bool fresh = false;
  };
  at::ScalarType dtype_;
  std::vector<Copy> copies_;
  std::unordered_map<const void*, size_t> index_;  // TensorImpl* -> copies_
  std::atomic<int64_t> misses_{0};
};

// `p` (an fp32 weight) in `dtype` for an operation that autograd
// differentiates through (its gradient comes back to p in p's dtype): the
// current ComputeCopies' copy where it has a fresh one, padded when
// `rows_multiple` > 1 (the gradient of the padding is dropped), else
// autocast's cached cast (padded in fp32 first, when asked).
torch::Tensor ComputeWeight(const torch::Tensor& p, at::ScalarType dtype, int64_t rows_multiple = 1);

}  // namespace ob::model
