// Synthetic metrics streams with known faults, for ob-watch's tests, its
// accuracy benchmark and its documentation: a data-parallel set of
// pipelines whose ranks report steps and heartbeats as ob-launch's workers
// do, with seeded noise, and faults injected at given steps.
//
// Model: rank r holds stage s of pipeline p on host "node<r+1>" (one rank
// per host); stages split `layers` planner layers evenly. A rank's compute
// per step is the nominal one × (1 ± noise, uniform) × its slow factor, with
// rare hiccups (× 1.5–2.5, `outliers` of rank-steps); forward is a third of
// it. Every rank waits for the slowest: step time = 1.25 × the slowest
// compute + 20 ms, the rest of it communication. Heartbeats every 0.5 s per
// rank. The same SyntheticRun always gives the same records.
//
// Pure; no shared state.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ob/metrics.pb.h"

namespace ob::watch {

struct SyntheticFault {
  enum Kind {
    kSlow,      // rank `rank` computes `value`× slower from `step` until `until`
    kStop,      // rank `rank` stops (SIGSTOP) before `step`: no records after; its
                // peers block and keep beating for 10 s, then the stream ends
    kCrash,     // rank `rank` dies before `step` (killed by signal 9): an exit
                // record, a 1.5 s recovery, a new generation without its pipeline
    kNan,       // the loss is NaN from `step` until `until`
    kSpike,     // the loss is `value`× higher at `step`
    kLeak,      // rank `rank`'s memory grows by `value` bytes a step from `step`
    kSlowJob,   // every rank computes `value`× slower from `step` until `until`
  };
  Kind kind = kSlow;
  int rank = 0;
  uint64_t step = 0;
  double value = 1;
  uint64_t until = std::numeric_limits<uint64_t>::max();
};

struct SyntheticRun {
  int pipelines = 2;
  int stages = 2;
  int layers = 8;              // planner layers (embed, blocks, head)
  int microbatches = 4;        // per pipeline
  uint64_t steps = 200;
  uint64_t seed = 1;
  double compute_seconds = 0.2;  // nominal forward + backward per rank and step
  double noise = 0.10;         // uniform ± fraction
  double outliers = 0.01;      // fraction of rank-steps with a hiccup
  double tokens_per_step = 8192;
  uint64_t memory_bytes = 2ull << 30;  // 0: not measured (CPU)
  int64_t start_unix_ms = 1700000000000;
  std::vector<SyntheticFault> faults;
};

// Records in arrival order (by unix_ms; ties by rank).
std::vector<pb::Metrics> Synthesize(const SyntheticRun& run);
// The same as a delimited stream (io/records.h framing).
std::string SynthesizeStream(const SyntheticRun& run);
// The host of rank `rank` in generation 1.
std::string SyntheticHost(int rank);

}  // namespace ob::watch
