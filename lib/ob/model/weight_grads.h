// The weight gradients of a backward, kept to be summed later: the W pass
// of a zero-bubble schedule (schedule/schedule.h). While a
// DeferWeightGradients scope is alive, the backwards of Linear, GeluMlp
// and LayerNorm (linear.h) compute their input gradients as always but,
// instead of summing their weights' and biases' gradients, keep what those
// sums read (the layer's input and output gradient, or the finished
// update) in a WeightGradients; Run sums them later, with the very same
// arithmetic in the same order, so the gradients are bit for bit those of
// an undivided backward. Every other parameter (embeddings, the head,
// RMSNorm gains) gets its gradient from autograd in the backward itself.
//
// What a WeightGradients holds is the memory a micro-batch keeps between
// its B and its W: the planner's weight_input_bytes.
//
// Thread-safety: one scope at a time per process (the backward of a CUDA
// tensor runs on autograd's device thread, not the caller's, so the scope
// is process-wide); a WeightGradients is used by one thread at a time.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace ob::model {

class WeightGradients {
 public:
  // Sums the kept gradients into their parameters, in the order their
  // backward reached them, and forgets them. With `unit` >= 0 only those
  // kept under that unit (SetUnit), the rest stay.
  void Run(int unit = -1);
  // The unit (a stage's segment, for the gradient buckets) under which the
  // next gradients are kept; -1 (the default): none.
  void SetUnit(int unit) { unit_ = unit; }
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }
  // Bytes of the distinct tensors it holds.
  uint64_t bytes() const;

  // What a deferred sum needs (linear.cc).
  enum class Kind { kWeight, kBias, kAdd };
  void Keep(Kind kind, const torch::Tensor& param, const torch::Tensor& a, const torch::Tensor& b = {});

 private:
  struct Entry {
    Kind kind;
    torch::Tensor param, a, b;  // kWeight: dy, x; kBias: dy; kAdd: the update
    int unit;
  };
  std::vector<Entry> entries_;
  int unit_ = -1;
};

// Defers into `into` for its lifetime: the backwards this thread runs, and
// those autograd's device threads run while it is the process's only
// scope. REQUIRES: no other scope alive on this thread; on a GPU, none in
// the process (one worker a process).
class DeferWeightGradients {
 public:
  explicit DeferWeightGradients(WeightGradients* into);
  ~DeferWeightGradients();
  DeferWeightGradients(const DeferWeightGradients&) = delete;
  DeferWeightGradients& operator=(const DeferWeightGradients&) = delete;
};

// The WeightGradients a scope defers into now; nullptr: none.
WeightGradients* DeferringWeightGradients();

}  // namespace ob::model
