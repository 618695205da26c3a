// The loss detectors: a non-finite loss (NaN, ±Inf) and loss spikes.
//
// The loss is a job figure: every rank of a step reports the same global
// loss (older streams: the last stage only, NaN elsewhere). So a non-finite
// loss at step k is news at once from a rank that has reported a finite
// loss before in this generation (whatever the other ranks report); from
// any other rank it is news only if no
// rank reports a finite loss for step k, which is decided when step k + 2
// arrives (or a new generation, or the end of the stream). One
// EVENT_LOSS_NAN (critical) per episode: steps in a row with a non-finite
// loss are one episode, and a finite loss between two of them starts a new
// one. A new generation (a rollback, a recovery) starts afresh.
//
// Spikes: the job's loss series, one value per step (the first finite one
// reported), against the median and MAD of the previous loss_window values
// (at least 20): z = (loss − median) / max(1.4826·MAD, 1% of |median|).
// z ≥ spike_z raises EVENT_LOSS_SPIKE (warning); the next needs z to have
// fallen below spike_z / 2 in between. Falling losses never count.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "ob/metrics.pb.h"
#include "ob/watch/state.h"

namespace ob::watch {

class LossDetector {
 public:
  explicit LossDetector(const DetectorOptions& o) : o_(o), window_(o.loss_window) {}
  // `r` has just taken in step record `m` of the newest generation.
  void OnStep(const RankState& r, const pb::Metrics& m, int64_t now_ms,
              std::vector<pb::Event>* out);
  // A new generation began: undecided steps of the old one are decided.
  void OnGeneration(int64_t now_ms, std::vector<pb::Event>* out);
  // End of the stream: decides what is still undecided.
  void Finish(int64_t now_ms, std::vector<pb::Event>* out);

 private:
  struct Step {
    int finite = 0, non_finite = 0;
    bool raised = false;
    double loss = 0, grad_norm = 0;   // the first non-finite report
    std::string host;
    int rank = 0;
    uint64_t generation = 0;
  };
  // Raises EVENT_LOSS_NAN for `step` unless it continues a reported episode.
  void Raise(uint64_t step, Step& s, bool decided_later, int64_t now_ms, std::vector<pb::Event>* out);
  // Decides the steps before `step` (all with UINT64_MAX) and forgets them.
  void DecideBefore(uint64_t step, int64_t now_ms, std::vector<pb::Event>* out);
  void Spike(const RankState& r, double loss, int64_t now_ms, std::vector<pb::Event>* out);

  DetectorOptions o_;
  // Steps of the newest generation whose loss is undecided, and the steps
  // with a finite loss and the last raised one, for episodes.
  std::map<uint64_t, Step> steps_;
  std::set<uint64_t> finite_steps_;
  bool raised_any_ = false;
  uint64_t last_raised_ = 0;
  // The spike series: one loss per step, in step order.
  Window window_;
  bool have_last_ = false;
  uint64_t last_step_ = 0;  // of the last value
  bool spike_active_ = false;
};

}  // namespace ob::watch
