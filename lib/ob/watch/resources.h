// Throughput regression and memory growth.
//
// Throughput is a job figure (every rank reports the global tokens/s of its
// step), so the detector follows one series: the first report of each step
// of the newest generation, after the warm-up. A step is low when its
// tokens/s is below (1 − throughput_drop) × the median of the previous
// throughput_window steps (at least 10 of them); 5 low steps among the last
// 8 raise EVENT_THROUGHPUT_DROP (warning, rank −1), so a few hiccups do not.
// The next needs 8 steps in a row that are not low. A new generation starts a new baseline: fewer
// hosts legitimately train more slowly.
//
// Memory growth is per rank: memory_bytes of its steps (0 = not measured,
// skipped) in a window of memory_window steps, cut into five blocks; when
// the block medians rise strictly from each block to the next and the last
// is at least (1 + memory_growth) × the first, EVENT_MEMORY_GROWTH
// (warning) names the rank. It is raised again only after a further rise by
// memory_growth and a whole window later.
#pragma once

#include <vector>

#include "ob/metrics.pb.h"
#include "ob/watch/state.h"

namespace ob::watch {

class ThroughputDetector {
 public:
  explicit ThroughputDetector(const DetectorOptions& o)
      : o_(o), baseline_(o.throughput_window), vote_(5, 8) {}
  void OnStep(const RankState& r, int64_t now_ms, std::vector<pb::Event>* out);
  void OnGeneration();

 private:
  DetectorOptions o_;
  Window baseline_;
  KOfN vote_;
  bool have_last_ = false;
  uint64_t last_step_ = 0;
  uint64_t steps_ = 0;        // in this generation
  bool active_ = false;
  int clear_run_ = 0;         // consecutive steps that were not low
};

class MemoryDetector {
 public:
  explicit MemoryDetector(const DetectorOptions& o) : o_(o) {}
  void OnStep(RankState& r, int64_t now_ms, std::vector<pb::Event>* out);

 private:
  DetectorOptions o_;
};

}  // namespace ob::watch
