// Hangs with nobody dead (design/recovery.md): under NCCL a
// stuck peer makes no collective throw, so the master judges each rank by
// the progress its training loop reports, not by whether its process or
// heartbeat thread lives. Every worker record (steps and the heartbeats its
// own thread sends every 500 ms) carries the rank's progress counter
// (advanced after every forward, backward, receive and collective the loop
// completes; by the worker once per step at least) and whether the loop is
// waiting for a peer (Metrics.progress, Metrics.waiting; worker.h).
//
// Slow is not dead (issue 54). Each rank in PHASE_TRAINING has a deadline
// that follows what the job has shown: the longest of
//   - the floor: `timeout_ms` (--hang-timeout) once the rank completed a
//     step of the generation, `first_step_timeout_ms` before;
//   - kGapsOfSilence times the longest interval between two moves of a
//     training rank's counter seen so far in the same period of a
//     generation (its first step in generation 1, its first step after a
//     recovery, the steps after a first step: joining, warm-up and
//     restoring are slower than a step, and a recovery's first step slower
//     than the run's first);
//   - kStepsOfSilence times the median of the job's recent step times.
// A rank whose counter has not moved for its deadline is stopped; the
// generation hangs only when every training rank is stopped: while one
// rank's counter moves, the others wait for a live peer (a slow host, a
// long checkpoint write), not for a stuck one. And when no stopped rank
// waits for a peer, every rank is computing at once: the machine or the
// model is slow, and the deadline is kSlowdownFactor times as long (a
// job of one rank that stalls is still found).
//
// Who is named: of the stopped ranks, those not waiting for a peer (the
// others wait for them); if every one waits, the one(s) with the least
// progress (last completed step, then counter). One verdict per
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
};

inline constexpr int kStepsOfSilence = 3;     // median step times before a hang
inline constexpr int kGapsOfSilence = 4;      // longest intervals between counter moves before a hang
inline constexpr int kSlowdownFactor = 4;     // the deadline when every stopped rank computes
inline constexpr size_t kStepWindow = 32;     // recent step times kept

class HangWatch {
 public:
  explicit HangWatch(HangOptions o = {}) : o_(o) {}
  const HangOptions& options() const { return o_; }

  // A new generation of `ranks` ranks, the first of the run or one after a
  // recovery: the ranks forgotten, what the job has shown kept.
  void Reset(size_t ranks, bool recovery = false);
  // A record of `rank` at `now_ms`: its phase (pb::WorkerPhase), counter and
  // waiting flag; `step` >= 0 when it reports a completed step (its number).
  // `step_seconds`: the step's duration (step records).
  void Record(uint32_t rank, int phase, uint64_t progress, bool waiting, int64_t step, int64_t now_ms,
              double step_seconds = 0);
  // The deadline of a rank past its first step of the generation (steady),
  // or before it: see above (without the slowdown factor).
  int64_t Limit() const { return Deadline(true); }
  int64_t Deadline(bool stepped) const;
  // The rank's process exited: no longer judged.
  void Exited(uint32_t rank);

  struct Named {
    uint32_t rank = 0;
    int64_t stalled_ms = 0;   // its counter has not moved for this long
    uint64_t progress = 0;
    bool waiting = false;
    int64_t step = 0;         // the step it is in (its last completed + 1)
    int64_t deadline_ms = 0;  // what it was judged against
    // e.g. "no progress for 3.1 s in step 21 (its counter at 84; deadline
    // 3.0 s: --hang-timeout), not waiting for a peer; ranks 0, 2, 3 wait"
    std::string why;
  };
  struct Verdict {
    std::vector<Named> ranks;  // named, ascending by rank; never empty
    int64_t stalled_ms = 0;    // the longest of theirs
    // How long the whole generation has been still: since the last move of
    // any judged rank's counter (a peer that waits for the named rank may
    // move after it, as a throttled rank's sends arrive). The real stall;
    // a prompt verdict comes within a tick of its deadline.
    int64_t still_ms = 0;
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
  // The periods whose counter intervals are kept apart.
  enum Period { kFirstStep = 0, kRecoveryStep = 1, kSteady = 2, kPeriods = 3 };
  Period PeriodOf(bool stepped) const { return stepped ? kSteady : recovery_ ? kRecoveryStep : kFirstStep; }
  // "--hang-timeout", "4 x the longest interval seen, 1.2 s", ...
  std::string DeadlineBasis(bool stepped) const;

  HangOptions o_;
  std::vector<Rank> ranks_;
  bool judged_ = false;
  bool recovery_ = false;     // this generation follows a recovery
  std::deque<double> steps_;  // recent step times, every rank, across generations
  int64_t longest_gap_ms_[kPeriods] = {0, 0, 0};  // across generations
};

}  // namespace ob::launch
