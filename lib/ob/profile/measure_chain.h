// The timing of layers behind MeasureProfile (measured.cc): samples and
// their typical value, random inputs for a layer, a step's chain of layers
// timed forward and backward, and an AdamW update measured. Shared with
// background_load.cc, whose processes train the same layers. Nothing
// outside lib/ob/profile includes it.
//
// Shapes: embed takes token ids [b, s] (int64) and gives [b, s, h]; a block
// maps [b, s, h] to [b, s, h]; the head takes [b, s, h] and targets [b, s]
// and gives the scalar mean cross-entropy loss.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "ob/model/gpt.h"
#include "ob/profile/measured.h"

namespace ob::profile::detail {

using Clock = std::chrono::steady_clock;

struct Samples {
  std::vector<double> v;
  double Median() const {
    auto s = v;
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  }
  double Mean() const {
    double sum = 0;
    for (double x : v) sum += x;
    return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
  }
  // On a GPU the median (event-timed, the repeats barely differ); on the
  // CPU the mean: its timings are skewed right by preemption, interrupts
  // and page faults, which a run pays as often as the repeats did (the
  // mean of gpt-tiny's layers is 4-7% above their median on this
  // project's 2-vCPU machine, 50 repeats), and under --concurrency a short
  // operation is preempted in some repeats and not in others, where the
  // median would pick one of the two.
  double Typical(const MeasureOptions& o) const {
    return o.concurrency > 1 || o.device.rfind("cuda", 0) != 0 ? Mean() : Median();
  }
  // (max − min) / median: how far the samples spread.
  double Spread() const {
    auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    double m = Median();
    return m > 0 ? (*hi - *lo) / m : 0.0;
  }
};

// Bytes of memory currently in use on `dev`: the CUDA caching allocator's
// count, or on CPU glibc's in-use heap (all arenas) plus mmapped blocks,
// which is where LibTorch's CPU allocator gets its memory.
int64_t InUseBytes(const torch::Device& dev);
uint64_t TensorBytes(const torch::Tensor& t);
double Seconds(Clock::time_point since);

struct LayerInputs {
  torch::Tensor input;    // ids for embed, activations otherwise
  torch::Tensor targets;  // ids (used by the head only)
};

// Random inputs (and targets) of a layer of `kind` for a micro-batch of b
// sequences of s tokens.
LayerInputs MakeInputs(const model::GptConfig& c, pb::LayerKind kind, int b, int s, const torch::Device& dev);

// Runs warm-ups and timed repetitions of a step's pass through every layer
// (embed to head) at one micro-batch size: the forwards in order, each layer's output the
// next one's input, then the backwards in reverse, each fed the gradient
// the layer after it computed, timing every layer's forward and backward
// on its own, and counts the bytes each forward leaves alive. Chained, as
// a stage runs them, because a layer timed alone in a loop keeps its
// weights and gradients in the caches between repeats, where in a step the
// other layers have evicted them: gpt-tiny's layers timed alone summed to
// 0.80-0.88 of what a worker computing them in one stage measured on this
// project's CPU (issue 14).
std::vector<pb::LayerCost> MeasureChain(const model::GptConfig& c, std::vector<model::PlannerLayer>& layers,
                                        int b, int s, const torch::Device& dev, const MeasureOptions& o);

// Optimizer state measured, not assumed: AdamW steps on the layer's
// gradients, then the bytes of every state tensor they created. Each timed
// step also takes the gradients' norms (one multi-tensor kernel, read by
// the host), as the workers do before clipping (stage_worker_reduce.cc);
// *update_seconds gets the median.
uint64_t OptimizerStateBytes(model::PlannerLayer& layer, const torch::Device& dev, const MeasureOptions& o,
                             double* update_seconds);

}  // namespace ob::profile::detail
