// The Watcher: takes in a metrics stream record by record, keeps the run's
// state (state.h) and runs every detector over it (straggler.h, loss.h,
// resources.h, liveness.h), returning the events they raise in order.
//
// Time: with the stream clock (recorded files, pipes) "now" is the largest
// received_unix_ms (the master's clock; unix_ms, the writer's, where that is
// unset) of the records so far, so the same stream always gives the same
// events, and a rank is silent when the others' records move the clock on
// without it. With the wall clock (attached to a live master) "now" is the
// arrival time the caller passes, and Tick() finds silence between records.
//
// A stream of several runs (Metrics.run) is watched one run at a time: a
// record of a new run finishes the old one (as Finish) and starts the state
// afresh, and every event carries the run of the records that raised it.
//
// Thread-safety: none; the caller serialises Feed/Tick/Finish/Note and
// reads of state().
#pragma once

#include <cstdint>
#include <vector>

#include "ob/metrics.pb.h"
#include "ob/watch/liveness.h"
#include "ob/watch/loss.h"
#include "ob/watch/resources.h"
#include "ob/watch/state.h"
#include "ob/watch/straggler.h"

namespace ob::watch {

enum class Clock { kStream, kWall };

class Watcher {
 public:
  Watcher(const DetectorOptions& options, Clock clock);

  // Takes in one record that arrived at `wall_ms` (ignored with the stream
  // clock) and appends the events it raises to `out`.
  void Feed(const pb::Metrics& m, int64_t wall_ms, std::vector<pb::Event>* out);
  // Looks for silence at `wall_ms`; nothing with the stream clock.
  void Tick(int64_t wall_ms, std::vector<pb::Event>* out);
  // The stream ended: decides what waited for later records.
  void Finish(std::vector<pb::Event>* out);
  // Counts an event raised elsewhere (an action) with the detectors' own.
  void Note(const pb::Event& e);

  const RunState& state() const { return run_; }
  const DetectorOptions& options() const { return options_; }
  Clock clock() const { return clock_; }

 private:
  // Records of another run (Metrics.run) than those before: its
  // generations, steps and ranks are its own, so the run's state and the
  // detectors start afresh (the counts of events and the recent ones stay).
  void NewRun();
  // Notes out[first..] and stamps them with the run.
  void NoteFrom(size_t first, std::vector<pb::Event>* out);
  RankState& Rank(const pb::Metrics& m);
  void TakeStep(RankState& r, const pb::Metrics& m, int64_t now, std::vector<pb::Event>* out);

  DetectorOptions options_;
  Clock clock_;
  RunState run_;
  StragglerDetector straggler_;
  LossDetector loss_;
  ThroughputDetector throughput_;
  MemoryDetector memory_;
  LivenessDetector liveness_;
};

}  // namespace ob::watch
