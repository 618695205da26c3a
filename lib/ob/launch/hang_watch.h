// Hangs with nobody dead (design §5, "Failure"): under NCCL a
// stuck peer makes no collective throw, so the master judges each rank by
// the progress its training loop reports, not by whether its process or
// heartbeat thread lives. Every worker record (steps and the heartbeats its
// own thread sends every 500 ms) carries the rank's progress counter
// (advanced after every forward, backward, receive and collective the loop
// completes; by the worker once per step at least) and whether the loop is
// waiting for a peer (Metrics.progress, Metrics.waiting; worker.h).
//
// A rank in PHASE_TRAINING whose counter has not moved for `timeout_ms`
// (`first_step_timeout_ms` before it completed its first step of the
// generation: joining, warm-up and a first step may be slow) makes the
// generation hung; the bound is at least kStepsOfSilence times the median
// of the job's recent step times (over generations), so that a job whose
// steps are slow (a loaded machine, a large model while the counter only
// moves once per step) is not taken for hung. Who is named: of the ranks whose counters have not moved
// for at least `quiet_ms` (stopped), those not waiting for a peer (the
// others wait for them); if every stopped rank is waiting, the one(s) with
// the least progress (last completed step, then counter). One verdict per
// generation.
//
// Pure and torch-free; times are the caller's clock in ms. Not thread-safe:
// the master's loop owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace ob::launch {

struct HangOptions {
  int64_t timeout_ms = 3000;             // ob-launch --hang-timeout
  int64_t first_step_timeout_ms = 30000; // before the rank's first completed step
  int64_t quiet_ms = 1000;               // "stopped", for the naming
};

inline constexpr int kStepsOfSilence = 3;     // median step times before a hang
inline constexpr size_t kStepWindow = 32;     // recent step times kept

class HangWatch {
 public:
  explicit HangWatch(HangOptions o = {}) : o_(o) {}
  const HangOptions& options() const { return o_; }

  // A new generation of `ranks` ranks: everything forgotten.
  void Reset(size_t ranks);
  // A record of `rank` at `now_ms`: its phase (pb::WorkerPhase), counter and
  // waiting flag; `step` >= 0 when it reports a completed step (its number).
  // `step_seconds`: the step's duration (step records).
  void Record(uint32_t rank, int phase, uint64_t progress, bool waiting, int64_t step, int64_t now_ms,
              double step_seconds = 0);
  // The bound after a first step: timeout_ms or kStepsOfSilence median steps.
  int64_t Limit() const;
  // The rank's process exited: no longer judged.
  void Exited(uint32_t rank);

  struct Named {
    uint32_t rank = 0;
    int64_t stalled_ms = 0;   // its counter has not moved for this long
    uint64_t progress = 0;
    bool waiting = false;
    int64_t step = 0;         // the step it is in (its last completed + 1)
    // e.g. "no progress for 3.1 s in step 21 (its counter at 84), not
    // waiting for a peer; ranks 0, 2, 3 wait"
    std::string why;
  };
  struct Verdict {
    std::vector<Named> ranks;  // named, ascending by rank; never empty
    int64_t stalled_ms = 0;    // the longest of theirs
  };
  // The verdict at `now_ms`, once per generation (nullopt: nothing yet, or
  // already given); with `peek`, a verdict does not count as given.
  std::optional<Verdict> Check(int64_t now_ms, bool peek = false);

 private:
  struct Rank {
    bool heard = false, exited = false, stepped = false, waiting = false;
    int phase = 0;
    uint64_t progress = 0;
    int64_t last_step = -1;    // last completed step (-1 none this generation)
    int64_t moved_ms = 0;      // when the counter last changed
  };
  HangOptions o_;
  std::vector<Rank> ranks_;
  bool judged_ = false;
  std::deque<double> steps_;  // recent step times, every rank, across generations
};

}  // namespace ob::launch
