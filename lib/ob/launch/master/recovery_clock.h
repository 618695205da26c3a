// A recovery's phases (design/recovery.md), for the `recovered` line of events.log and
// the status's waiting_for: when the first failure was detected (and how
// long after it happened), when the decision came, when the new generation
// was sent, and, from each rank's first step of it (Metrics'
// process_start_unix_ms, ready_unix_ms, restore_seconds), the slowest
// rank's teardown, regroup, copy and first step. Failures detected during a
// recovery belong to it: its clock runs from the first.
//
// Torch-free; the master's loop calls every method.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ob/metrics.pb.h"

namespace ob::launch {

class RecoveryClock {
 public:
  // In progress: decided, and not every rank has completed its first step.
  bool active() const { return active_; }
  // A failure was detected `latency_ms` after it happened (the first one
  // starts the clock; later ones, until the decision, add nothing).
  void Detected(int64_t latency_ms);
  // The decision is made (with no detection before, as for hosts that came
  // back or a rollback, the clock starts now).
  void Decided();
  // The new generation went out to the agents.
  void Started();
  // A rank's first step of the current generation, of `world` ranks, as it
  // arrives (its times, by its host's clock, are moved onto ours by the
  // difference of its unix_ms and now): the `recovered` line (generation,
  // from_step and the phases in ms) when it is the last of them, else "".
  std::string FirstStep(const pb::Metrics& m, uint64_t generation, int world);

  // What a rank of the recovering generation has done so far.
  struct Rank {
    int phase = 0;          // pb::WorkerPhase of its last record (0: none yet)
    bool stepped = false;   // completed its first step (or exited)
    std::string host;
  };
  // "recovery to generation G for S s; rank(s) R on HOST to start; ..." by
  // the phase each rank has yet to finish; "" when no recovery is active.
  std::string WaitingFor(uint64_t generation, const std::vector<Rank>& ranks) const;

 private:
  bool active_ = false, pending_ = false;
  int64_t detect_unix_ms_ = 0, detect_latency_ms_ = 0, decide_ms_ = 0, started_unix_ms_ = 0;
  int64_t process_start_ms_ = 0;                          // latest worker process start
  double regroup_s_ = 0, restore_s_ = 0, first_step_s_ = 0;  // slowest rank's
  int reported_ = 0;
  uint64_t first_step_ = 0;
};

}  // namespace ob::launch
