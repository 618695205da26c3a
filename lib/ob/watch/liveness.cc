#include "ob/watch/liveness.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "ob/watch/events.h"

namespace ob::watch {
namespace {

std::string Join(const std::set<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

}  // namespace

double LivenessDetector::StallTimeout(const RunState& run) const {
  if (o_.stall_timeout_s > 0) return o_.stall_timeout_s;
  return std::max(4 * o_.hang_timeout_s, 5 * run.job_step_seconds.median());
}

void LivenessDetector::OnExit(RunState& run, RankState& r, const pb::Metrics& m, int64_t now_ms,
                              std::vector<pb::Event>* out) {
  r.exited = true;
  const pb::WorkerExit& x = m.exit();
  if (x.exit_status() == 0 && x.signal() == 0) return;  // finished
  // A peer of a failed rank often fails in turn (its collective loses a
  // member) before the master has replaced it: a secondary failure.
  const bool secondary = run.generation_failure_ms > 0 &&
                         now_ms - run.generation_failure_ms < o_.recovery_grace_s * 1000;
  const std::string first_failure = run.generation_failure;
  run.recovering_since_ms = now_ms;
  if (run.failure_ms == 0) run.failure_ms = now_ms;
  auto& gens = run.crash_generations[r.host];
  if (!secondary) gens.insert(m.generation());
  std::string how = x.description();
  if (how.empty())
    how = x.signal() != 0 ? "killed by signal " + std::to_string(x.signal())
                          : "exit status " + std::to_string(x.exit_status());
  const uint64_t step = r.have_step ? r.last_step : m.step();
  char msg[640];
  if (secondary) {
    std::snprintf(msg, sizeof msg,
                  "%s rank %u exited after step %llu (generation %llu): %s, %.1f s after %s: a "
                  "consequence, not a cause",
                  r.host.c_str(), r.rank, static_cast<unsigned long long>(step),
                  static_cast<unsigned long long>(m.generation()), how.c_str(),
                  (now_ms - run.generation_failure_ms) / 1000.0, first_failure.c_str());
  } else {
    std::snprintf(msg, sizeof msg,
                  "%s rank %u crashed after step %llu (generation %llu): %s; workers on %s "
                  "crashed in %zu generation%s",
                  r.host.c_str(), r.rank, static_cast<unsigned long long>(step),
                  static_cast<unsigned long long>(m.generation()), how.c_str(), r.host.c_str(),
                  gens.size(), gens.size() == 1 ? "" : "s");
    NoteFailure(run, now_ms, r.host + " rank " + std::to_string(r.rank) + " crashed");
  }
  pb::Event e = MakeEvent(pb::EVENT_CRASH, secondary ? pb::SEVERITY_WARNING : pb::SEVERITY_CRITICAL,
                          r.host, static_cast<int>(r.rank), step, m.generation(), now_ms, msg);
  auto& ev = *e.mutable_evidence();
  ev["exit_status"] = x.exit_status();
  ev["signal"] = x.signal();
  ev["last_step"] = static_cast<double>(step);
  ev["host_crash_generations"] = static_cast<double>(gens.size());
  ev["secondary"] = secondary ? 1 : 0;
  out->push_back(std::move(e));
}

void LivenessDetector::OnHung(RunState& run, RankState& r, const pb::Metrics& m, int64_t now_ms,
                              std::vector<pb::Event>* out) {
  const pb::WorkerHang& h = m.hang();
  run.recovering_since_ms = now_ms;  // the master restarts the generation
  if (run.failure_ms == 0) run.failure_ms = now_ms - static_cast<int64_t>(h.stalled_seconds() * 1000);
  NoteFailure(run, now_ms, r.host + " rank " + std::to_string(r.rank) + " hung");
  auto& gens = run.hang_generations[r.host];
  gens.insert(m.generation());
  r.hang_reported = true;
  char msg[640];
  std::snprintf(msg, sizeof msg, "%s rank %u hangs in step %llu (generation %llu): %s", r.host.c_str(),
                r.rank, static_cast<unsigned long long>(m.step()),
                static_cast<unsigned long long>(m.generation()),
                h.description().empty() ? "no progress" : h.description().c_str());
  pb::Event e = MakeEvent(pb::EVENT_HANG, pb::SEVERITY_CRITICAL, r.host, static_cast<int>(r.rank),
                          m.step(), m.generation(), now_ms, msg);
  auto& ev = *e.mutable_evidence();
  ev["stalled_seconds"] = h.stalled_seconds();
  ev["progress"] = static_cast<double>(h.progress());
  ev["waiting"] = h.waiting() ? 1 : 0;
  ev["host_hang_generations"] = static_cast<double>(gens.size());
  out->push_back(std::move(e));
}

void LivenessDetector::NoteFailure(RunState& run, int64_t now_ms, const std::string& what) {
  if (run.generation_failure_ms > 0) return;
  run.generation_failure_ms = now_ms;
  run.generation_failure = what;
}

void LivenessDetector::OnNewGeneration(RunState& run, uint64_t previous, int64_t now_ms) {
  (void)now_ms;
  previous_generation_ = previous;
  previous_ranks_ = 0;
  previous_hosts_.clear();
  for (const auto& [key, r] : run.ranks) {
    if (key.generation != previous) continue;
    ++previous_ranks_;
    previous_hosts_.insert(r.host);
  }
  run.recovery_pending = previous != 0;
  run.recovery_first_step_seen = false;
  if (run.recovery_pending && run.failure_ms == 0) run.failure_ms = run.last_progress_ms;
  run.recovering_since_ms = -1;
  run.stall_reported = false;
  run.generation_failure_ms = 0;
  run.generation_failure.clear();
}

void LivenessDetector::OnStep(RunState& run, const RankState& r, int64_t now_ms,
                              std::vector<pb::Event>* out) {
  if (!run.recovery_pending) return;
  if (!run.recovery_first_step_seen) {
    run.recovery_first_step_seen = true;
    run.recovery_first_step = r.last_step;
    run.recovery_first_step_ms = now_ms;
    return;
  }
  if (r.last_step > run.recovery_first_step) RaiseRecovery(run, out);
}

void LivenessDetector::Finish(RunState& run, std::vector<pb::Event>* out) {
  if (run.recovery_pending && run.recovery_first_step_seen) RaiseRecovery(run, out);
}

void LivenessDetector::RaiseRecovery(RunState& run, std::vector<pb::Event>* out) {
  run.recovery_pending = false;
  run.recovery_first_step_seen = false;
  size_t ranks = 0;
  std::set<std::string> hosts;
  run.ForEachCurrent([&](const RankState& p) {
    if (!p.have_step) return;
    ++ranks;
    hosts.insert(p.host);
  });
  std::set<std::string> gone, added;
  for (const auto& h : previous_hosts_)
    if (!hosts.count(h)) gone.insert(h);
  for (const auto& h : hosts)
    if (!previous_hosts_.count(h)) added.insert(h);
  const int64_t at = run.recovery_first_step_ms;
  const double gap = run.failure_ms > 0 ? (at - run.failure_ms) / 1000.0 : 0;
  std::string change;
  if (!gone.empty()) change += "; gone: " + Join(gone);
  if (!added.empty()) change += "; new: " + Join(added);
  char msg[640];
  std::snprintf(msg, sizeof msg,
                "generation %llu completed step %llu %.1f s after the failure: %zu rank%s on %zu "
                "host%s (generation %llu: %zu on %zu%s)",
                static_cast<unsigned long long>(run.generation),
                static_cast<unsigned long long>(run.recovery_first_step), gap, ranks,
                ranks == 1 ? "" : "s", hosts.size(), hosts.size() == 1 ? "" : "s",
                static_cast<unsigned long long>(previous_generation_), previous_ranks_,
                previous_hosts_.size(), change.c_str());
  pb::Event e = MakeEvent(pb::EVENT_RECOVERY, pb::SEVERITY_INFO, "", -1, run.recovery_first_step,
                          run.generation, at, msg);
  auto& ev = *e.mutable_evidence();
  ev["gap_seconds"] = gap;
  ev["previous_generation"] = static_cast<double>(previous_generation_);
  ev["ranks"] = static_cast<double>(ranks);
  ev["previous_ranks"] = static_cast<double>(previous_ranks_);
  ev["hosts"] = static_cast<double>(hosts.size());
  ev["previous_hosts"] = static_cast<double>(previous_hosts_.size());
  out->push_back(std::move(e));
  run.failure_ms = 0;
}

void LivenessDetector::Check(RunState& run, int64_t now_ms, std::vector<pb::Event>* out) {
  const bool grace = run.recovering_since_ms >= 0 &&
                     now_ms - run.recovering_since_ms < o_.recovery_grace_s * 1000;
  if (grace) return;
  const int64_t timeout_ms = static_cast<int64_t>(o_.hang_timeout_s * 1000);
  size_t live = 0;
  run.ForEachCurrent([&](const RankState& r) {
    if (!r.exited && r.first_heard_ms != 0 && now_ms - r.last_heard_ms < timeout_ms) ++live;
  });
  bool any_running = false;
  run.ForEachCurrent([&](RankState& r) {
    if (r.exited || r.first_heard_ms == 0) return;
    any_running = true;
    const int64_t silent_ms = now_ms - r.last_heard_ms;
    if (silent_ms < timeout_ms || r.hang_reported) return;
    r.hang_reported = true;
    if (run.failure_ms == 0) run.failure_ms = r.last_heard_ms;
    NoteFailure(run, now_ms, r.host + " rank " + std::to_string(r.rank) + " hung");
    char msg[512];
    std::snprintf(msg, sizeof msg,
                  "%s rank %u hangs: silent for %.1f s (no step, no heartbeat) after step %llu; "
                  "%zu other rank%s still alive",
                  r.host.c_str(), r.rank, silent_ms / 1000.0,
                  static_cast<unsigned long long>(r.last_step), live, live == 1 ? "" : "s");
    pb::Event e = MakeEvent(pb::EVENT_HANG, pb::SEVERITY_CRITICAL, r.host,
                            static_cast<int>(r.rank), r.last_step, r.generation, now_ms, msg);
    auto& ev = *e.mutable_evidence();
    ev["silent_seconds"] = silent_ms / 1000.0;
    ev["timeout_seconds"] = o_.hang_timeout_s;
    ev["last_step"] = static_cast<double>(r.last_step);
    ev["ranks_alive"] = static_cast<double>(live);
    out->push_back(std::move(e));
  });

  if (!any_running || !run.have_progress || run.stall_reported) return;
  const double stall = StallTimeout(run);
  const int64_t idle_ms = now_ms - run.last_progress_ms;
  if (idle_ms < stall * 1000) return;
  run.stall_reported = true;
  if (run.failure_ms == 0) run.failure_ms = run.last_progress_ms;
  char msg[400];
  std::snprintf(msg, sizeof msg,
                "no step completed on any rank for %.1f s (last step %llu, generation %llu); "
                "%zu rank%s still alive",
                idle_ms / 1000.0, static_cast<unsigned long long>(run.max_step),
                static_cast<unsigned long long>(run.generation), live, live == 1 ? "" : "s");
  pb::Event e = MakeEvent(pb::EVENT_HANG, pb::SEVERITY_WARNING, "", -1, run.max_step,
                          run.generation, now_ms, msg);
  auto& ev = *e.mutable_evidence();
  ev["idle_seconds"] = idle_ms / 1000.0;
  ev["timeout_seconds"] = stall;
  ev["last_step"] = static_cast<double>(run.max_step);
  ev["ranks_alive"] = static_cast<double>(live);
  out->push_back(std::move(e));
}

}  // namespace ob::watch
