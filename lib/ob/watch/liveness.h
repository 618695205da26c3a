// Liveness: crashes, hangs, stalls and recoveries.
//
//  - crash: an exit record (written by the master when a worker process
//    exits) with a non-zero exit status or a signal raises EVENT_CRASH
//    (critical) for its rank and host; evidence counts the distinct
//    generations in which that host's workers crashed (a crash loop).
//    An error exit within recovery_grace_s of an earlier failure (a crash
//    or a hang) of the same generation is a secondary one — a peer whose
//    collective lost a member — and is raised as a warning that names the
//    first failure and does not count towards a crash loop.
//    An exit with status 0 only marks the rank as finished.
//  - hang: a rank of the newest generation that has been heard (a step or a
//    heartbeat) and has not exited, silent for hang_timeout_s, raises
//    EVENT_HANG (critical) for that rank, once until it is heard again. A
//    SIGSTOPped worker stops beating while its blocked peers keep beating,
//    so the rank that hangs is the one named.
//  - hang judged by the master: a record with Metrics.hang (ob-launch
//    --hang-timeout: a rank whose training loop stopped making progress
//    while its process and heartbeats go on, which silence never shows)
//    raises EVENT_HANG (critical) for its rank and host, with the master's
//    line; evidence counts the distinct generations in which that host's
//    ranks hung (host_hang_generations: the master restarts after one hang
//    itself, so --act waits for a loop, as for crashes).
//  - stall: no completed step on any rank for the stall timeout raises
//    EVENT_HANG (warning, rank −1) once until a step completes.
//  - recovery grace: after an error exit in the newest generation, hangs
//    and stalls are not raised for recovery_grace_s: the master is
//    reconfiguring, and its gap is not an anomaly.
//  - recovery: a newer generation's first completed step is its recovery:
//    the time from the failure (the last error exit, hang or stall, else the
//    old generation's last step) to that step's first report. EVENT_RECOVERY
//    (info) says so, with the ranks and hosts before and after, once a later
//    step shows that every rank of the new generation has reported (or at
//    the end of the stream).
#pragma once

#include <set>
#include <string>
#include <vector>

#include "ob/metrics.pb.h"
#include "ob/watch/state.h"

namespace ob::watch {

class LivenessDetector {
 public:
  explicit LivenessDetector(const DetectorOptions& o) : o_(o) {}
  // An exit record; `r` is its rank's state (created if it was unknown).
  void OnExit(RunState& run, RankState& r, const pb::Metrics& m, int64_t now_ms,
              std::vector<pb::Event>* out);
  // A hang record (Metrics.hang) from the master; `r` is its rank's state.
  void OnHung(RunState& run, RankState& r, const pb::Metrics& m, int64_t now_ms,
              std::vector<pb::Event>* out);
  // A record of a generation newer than any before (`previous` may be 0).
  void OnNewGeneration(RunState& run, uint64_t previous, int64_t now_ms);
  // A completed step of the newest generation (after the run's state took it in).
  void OnStep(RunState& run, const RankState& r, int64_t now_ms, std::vector<pb::Event>* out);
  // End of the stream: a recovery still waiting for its second step is reported.
  void Finish(RunState& run, std::vector<pb::Event>* out);
  // Checks for silence at `now_ms`.
  void Check(RunState& run, int64_t now_ms, std::vector<pb::Event>* out);

 private:
  double StallTimeout(const RunState& run) const;
  // Remembers the newest generation's first failure.
  static void NoteFailure(RunState& run, int64_t now_ms, const std::string& what);
  void RaiseRecovery(RunState& run, std::vector<pb::Event>* out);

  DetectorOptions o_;
  // The generation before the newest, for the recovery's "before".
  uint64_t previous_generation_ = 0;
  size_t previous_ranks_ = 0;
  std::set<std::string> previous_hosts_;
};

}  // namespace ob::watch
