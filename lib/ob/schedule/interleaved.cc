// Interleaved 1F1B (Narayanan et al., "Efficient Large-Scale Language Model
// Training on GPU Clusters Using Megatron-LM", SC'21), as Megatron-LM runs
// it: each of the S stages holds v model chunks, virtual stage c·S + s on
// stage s (Placement::kLoop), and runs them in groups of S micro-batches:
// the forwards of a group chunk by chunk (0 up to v − 1), its backwards
// chunk by chunk the other way. Stage s warms up with (S − s − 1)·2 +
// (v − 1)·S forwards, then alternates one forward and one whole backward,
// then drains. A fill of (S − 1)(F + B + W)/v: the bubble of 1F1B divided
// by v, for v times the messages. A stage holds at most its warm-up + 1
// chunk-micro-batches, about (1 + 1/v)·S micro-batches' activations on
// stage 0 against 1F1B's S. Megatron-LM requires m to be a multiple of S
// (or at most S); other m are ordered by list scheduling (below).
// schedule_chunks_test checks every S <= 8, v <= 4, m <= 16.
#include <algorithm>
#include <cassert>

#include "ob/schedule/greedy.h"
#include "ob/schedule/schedule.h"

namespace ob::schedule {
namespace interleaved {  // named: a unity build puts the schedules in one file

// The n-th forward (or, with `backward`, backward) of a stage, n < m·v: the
// group of S micro-batches it falls in (the last may be smaller), then the
// chunk within the group (down for backwards), then the micro-batch.
Op Nth(int n, int stages, int chunks, int m, bool backward) {
  const int full = stages * chunks;  // ops in a whole group
  const int group = n / full, start = group * stages;
  const int size = std::min(stages, m - start);  // micro-batches in this group
  const int in = n - group * full;
  const int c = in / size, j = start + in % size;
  return {backward ? Op::kBackward : Op::kForward, j, backward ? chunks - 1 - c : c};
}

detail::Limits Limits(const Chain& chain, int k) { return {chain.size() - k, chain.size() - k}; }

std::vector<Op> Order(const Chain& chain, int stage, int microbatches) {
  assert(0 <= stage && stage < chain.stages && chain.placement == Placement::kLoop);
  std::vector<Op> ops;
  if (microbatches <= 0) return ops;
  // Megatron's order needs whole groups: with m > S not a multiple of S its
  // last group's backwards wait for forwards its warm-up has not reached.
  // Those m get the greedy order of greedy.h over the chain, each virtual
  // stage k holding at most V − k micro-batches (1F1B's count over the
  // chain), whole backwards, the deepest chunk's ops first.
  if (microbatches > chain.stages && microbatches % chain.stages != 0)
    return detail::GreedyOrder("interleaved", &Limits, chain, stage, microbatches, false);
  const int S = chain.stages, v = chain.chunks, total = microbatches * v;
  ops.reserve(2 * static_cast<size_t>(total));
  const int warmup = std::min((S - stage - 1) * 2 + (v - 1) * S, total);
  int f = 0, b = 0;
  for (; f < warmup; ++f) ops.push_back(Nth(f, S, v, microbatches, false));
  while (f < total) {
    ops.push_back(Nth(f++, S, v, microbatches, false));
    ops.push_back(Nth(b++, S, v, microbatches, true));
  }
  while (b < total) ops.push_back(Nth(b++, S, v, microbatches, true));
  return ops;
}

}  // namespace interleaved

extern const Schedule kInterleaved{
    "interleaved",
    "interleaved 1F1B: v model chunks a stage, the fill divided by v for v times the messages; "
    "stage 0 holds about (1 + 1/v)·S micro-batches' activations",
    false,
    &interleaved::Order,
    nullptr,
    2,
    8,
    Placement::kLoop,
};

}  // namespace ob::schedule
