// What ob-watch knows about a run: the detectors' thresholds, one RankState
// per (generation, rank), and the job-wide figures the detectors, the
// terminal summary and the Prometheus page read.
//
// Series are kept per (generation, rank) and named by host: a generation
// renumbers ranks, so rank 3 of generation 1 and rank 3 of generation 2 may
// be different processes on different hosts. Only the newest generation is
// watched; the previous one is kept for display until a newer one arrives.
// Thread-safety: plain values; whoever owns the Watcher guards them.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>

#include "ob/metrics.pb.h"
#include "ob/watch/stats.h"

namespace ob::watch {

// Thresholds and windows (ob-watch(1) documents each flag and default).
struct DetectorOptions {
  // Liveness: a rank silent (no step, no heartbeat) this long hangs.
  double hang_timeout_s = 3.0;
  // No completed step on any rank this long is a job-wide stall; 0: the
  // larger of 4 × hang_timeout_s and 5 × the median step time.
  double stall_timeout_s = 0;
  // After a worker exits with an error, the master recovers: silence is
  // expected for this long and is not a hang.
  double recovery_grace_s = 10.0;
  // Steps of each generation (per rank) that no timing detector looks at:
  // the first step includes restoring state and warming caches.
  int warmup_steps = 3;
  // Straggler: the median compute (forward + backward) per micro-batch of
  // the last `straggler_window` steps ≥ ratio × the reference's, in at
  // least `straggler_votes` of the last `straggler_window` steps.
  double straggler_ratio = 1.3;
  int straggler_window = 8;
  int straggler_votes = 5;
  // Loss spike: robust z-score (median/MAD of the last loss_window losses,
  // σ at least 1% of the median) at or above spike_z.
  double spike_z = 6.0;
  int loss_window = 50;
  // Throughput: tokens/s below (1 − throughput_drop) × the median of the
  // last throughput_window steps in 5 of the last 8 steps.
  double throughput_drop = 0.3;
  int throughput_window = 50;
  // Memory: memory_bytes rising through all five blocks of the last
  // memory_window steps and by at least memory_growth in total.
  double memory_growth = 0.1;
  int memory_window = 100;
};

struct RankKey {
  uint64_t generation = 0;
  uint32_t rank = 0;
  bool operator<(const RankKey& o) const {
    return generation != o.generation ? generation < o.generation : rank < o.rank;
  }
};

struct RankState {
  // Identity, from its records.
  std::string host;
  uint64_t generation = 0;
  uint32_t rank = 0, pipeline = 0, stage = 0;
  uint32_t first_layer = 0, last_layer = 0, microbatches = 0;

  // Liveness (watcher clock, ms).
  int64_t first_heard_ms = 0, last_heard_ms = 0, last_progress_ms = 0;
  bool exited = false;        // an exit record arrived (any status)
  bool hang_reported = false; // the current silence was reported

  // The last completed step and its figures.
  bool have_step = false;
  uint64_t last_step = 0;
  uint64_t steps_seen = 0;    // step records in this generation
  double step_seconds = 0, compute_seconds = 0, communication_seconds = 0;
  double tokens_per_second = 0, loss = 0, grad_norm = 0;
  uint64_t memory_bytes = 0;
  bool loss_seen_finite = false;  // so a non-finite loss from it is news

  // Straggler: per-micro-batch compute of the last straggler_window steps,
  // the ratios of its median to the reference, and the vote over them.
  Window recent_compute{8};
  // The same over kBaselineWindows × straggler_window steps: the job's own
  // recent baseline, which a slowdown that moves from rank to rank (CPU
  // contention) never leaves.
  Window baseline_compute{64};
  // Its step time (which every rank of a data-parallel job shares: each
  // waits for the slowest), short and long, for the job's own baseline.
  Window recent_step{8};
  Window baseline_step{64};
  Window recent_ratio{8};
  KOfN straggler_vote{5, 8};
  int straggler_events = 0;       // raised in the current episode
  uint64_t straggler_observed = 0;  // votes since the last event

  // Memory growth.
  Window memory{100};
  double memory_reported_level = 0;  // block median when last reported
  uint64_t memory_steps_since_report = 0;
};

struct RunState {
  uint64_t records = 0;
  // The run of the newest record that named one (Metrics.run): its events
  // carry it, and ob-watch --act's requests name it.
  std::string run;
  uint64_t generation = 0;           // newest seen
  int64_t now_ms = 0;                // the watcher's clock
  std::map<RankKey, RankState> ranks;
  uint64_t max_step = 0;             // highest completed step, any rank
  bool have_progress = false;
  int64_t last_progress_ms = 0;      // a step record last arrived
  // When the newest generation first reported a completed step (for
  // EVENT_RECOVERY), and the last failure before it.
  bool recovery_pending = false;
  bool recovery_first_step_seen = false;
  uint64_t recovery_first_step = 0;
  int64_t recovery_first_step_ms = 0;
  int64_t failure_ms = 0;
  int64_t recovering_since_ms = -1;  // an error exit in the newest generation
  // The first failure (error exit or hang) of the newest generation, so
  // that the failures it causes in its peers are told apart from it.
  int64_t generation_failure_ms = 0;
  std::string generation_failure;    // "node3 rank 2 hung"
  bool stall_reported = false;
  Window job_step_seconds{50};
  // Crashes per host, by generation (a crash loop spans generations).
  std::map<std::string, std::set<uint64_t>> crash_generations;
  // Hangs the master judged, per host, by generation.
  std::map<std::string, std::set<uint64_t>> hang_generations;

  std::map<pb::EventKind, uint64_t> event_counts;
  std::deque<pb::Event> recent_events;  // the last kRecentEvents

  static constexpr size_t kRecentEvents = 20;

  // The ranks of the newest generation.
  template <typename F>
  void ForEachCurrent(F f) {
    for (auto it = ranks.lower_bound({generation, 0});
         it != ranks.end() && it->first.generation == generation; ++it)
      f(it->second);
  }
};

}  // namespace ob::watch
