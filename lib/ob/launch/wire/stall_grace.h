// Silence is judged only while the judge listens. An agent judges its master
// by its silence, and the master its agents and workers; neither may count
// the time it did not run itself. A whole machine that stops and runs again
// (a paused or migrated VM, a hypervisor that did not schedule it, a SIGSTOP
// of the job's process group) stops the peers on it too, and on the way
// back whoever runs first finds everyone silent for the length of the stop.
// So after a stall of its own (a gap of at least kStallMs between two of
// its periodic ticks) the judge listens for kGraceMs before it judges
// again: a live peer that stopped with it speaks in that time, and one that
// is gone is judged kGraceMs late.
//
// A judge that is starved for good (every gap a stall) gets no grace: only
// a stall after kSteadyMs of running without one does. Else an agent whose
// host thrashes would never find that its master had died.
//
// Torch-free; one thread (a loop's timer) calls it.
#pragma once

#include <cstdint>

namespace ob::launch {

class StallGrace {
 public:
  static constexpr int64_t kStallMs = 500;    // ten ticks of the agent's watchdog and the master's loop
  static constexpr int64_t kGraceMs = 1000;   // five of the master's and the agents' heartbeats
  static constexpr int64_t kSteadyMs = 1000;

  // At each periodic tick, at `now_ms` of a monotonic clock: the stall that
  // ends now, in ms (0 when the gap since the last tick is under kStallMs).
  int64_t Tick(int64_t now_ms);
  // The gap between the last two ticks, however short (0 after the first).
  int64_t gap_ms() const { return gap_ms_; }
  // Whether a peer's silence may be judged now: false within kGraceMs of
  // the end of a stall that came after steady running.
  bool MayJudge(int64_t now_ms) const { return now_ms >= grace_until_ms_; }

 private:
  int64_t last_tick_ms_ = -1;
  int64_t gap_ms_ = 0;
  int64_t steady_since_ms_ = -1;  // the first tick, or the end of the last stall
  int64_t grace_until_ms_ = -1;
};

}  // namespace ob::launch
