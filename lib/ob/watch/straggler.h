// The straggler detector: a rank persistently slower than the ranks it
// should match.
//
// Each completed step (after the warm-up) gives a rank's compute time per
// micro-batch, (forward + backward) / num_microbatches — communication is
// left out because it is mostly waiting for someone else. A rank's figure
// is the median of its last straggler_window values (at least 3), so a few
// hiccups move nothing. It is compared with a reference from the other
// ranks of the same generation, in this order of preference:
//   0 replicas: ranks holding the same layers (same first_layer and
//     last_layer: the same stage in other pipelines); the reference is the
//     median of their medians;
//   1 layer-normalised: no replica; every rank's median divided by its
//     layer count, against the median of all other ranks' (needs two);
//   2 all ranks: the stream carries no layer ranges; raw medians against
//     the median of all other ranks'.
// A step votes "slow" when the ratio is at least straggler_ratio, and the
// same ratio against the job's own recent baseline — the same reference
// built from the peers' medians over the last kBaselineWindows ×
// straggler_window steps (at least 2 windows of them) — is too. A slowdown
// every rank shares moves the peers' short medians with the rank's and is
// not voted; contention that slows some ranks for a while and then others
// (more workers than cores) leaves every rank's baseline between fast and
// slow, so a rank slow for now is not slow against it; a real straggler is
// slow against both. And a straggler holds the job up: the job's step time
// (the median over its ranks of their last straggler_window steps) must be
// at least 1 + (straggler_ratio − 1) / 2 times its baseline (the same over
// the baseline steps); contention that only moves the slowness from rank
// to rank leaves the job's pace as it was. (Both baselines gate the start
// of an episode only: by its re-reports they have taken the slowdown in.)
// With a
// single replica, which cannot tell which of the two is off, the rank must
// also be slow by half that margin per layer against all other ranks. When at
// least straggler_votes of the last straggler_window votes are slow the
// detector raises EVENT_STRAGGLER for that rank and its host and starts a
// fresh vote, so successive events rest on disjoint votes. While the rank
// stays slow it is reported again after straggler_window steps, again
// after as many, then after 2, 4, … up to 32 windows; a window without a
// confirmation ends the episode.
#pragma once

#include <vector>

#include "ob/metrics.pb.h"
#include "ob/watch/state.h"

namespace ob::watch {

inline constexpr int kBaselineWindows = 8;

class StragglerDetector {
 public:
  explicit StragglerDetector(const DetectorOptions& o) : o_(o) {}
  // `r` has just taken in a step record of the newest generation.
  void OnStep(RunState& run, RankState& r, int64_t now_ms, std::vector<pb::Event>* out);

 private:
  DetectorOptions o_;
};

}  // namespace ob::watch
