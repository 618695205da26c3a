// 1F1B (PipeDream-Flush, as Megatron-LM runs it): stage i of S runs
// min(S − i − 1, m) warm-up forwards, then alternates one forward and one
// whole backward until every forward has run, then drains the backwards.
// Stage i never holds more than min(S − i, m) micro-batches. A pipeline of
// equal stages idles (S − 1)(F + B + W) of its time (S − 1)/(m + S − 1).
#include <algorithm>
#include <cassert>

#include "ob/schedule/schedule.h"

namespace ob::schedule {
namespace one_f_one_b {  // named: a unity build puts the schedules in one file

std::vector<Op> Order(const Chain& chain, int stage, int microbatches) {
  const int stages = chain.stages;
  assert(0 <= stage && stage < stages && chain.chunks == 1);
  std::vector<Op> ops;
  if (microbatches <= 0) return ops;
  ops.reserve(2 * static_cast<size_t>(microbatches));
  const int warmup = std::min(stages - stage - 1, microbatches);
  int next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward) ops.push_back({Op::kForward, next_forward});
  while (next_forward < microbatches) {
    ops.push_back({Op::kForward, next_forward++});
    ops.push_back({Op::kBackward, next_backward++});
  }
  while (next_backward < microbatches) ops.push_back({Op::kBackward, next_backward++});
  return ops;
}

}  // namespace one_f_one_b

extern const Schedule kOneFOneB{
    "1f1b",
    "one forward, one backward: stage i holds S - i micro-batches; idle (S-1)/(m+S-1) of a step",
    false,
    &one_f_one_b::Order,
};

}  // namespace ob::schedule
