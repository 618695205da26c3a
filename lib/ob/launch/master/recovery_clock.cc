#include "ob/launch/master/recovery_clock.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "ob/clock.h"

namespace ob::launch {

void RecoveryClock::Detected(int64_t latency_ms) {
  if (active_ || pending_) return;
  *this = RecoveryClock();
  pending_ = true;
  detect_unix_ms_ = UnixMs();
  detect_latency_ms_ = latency_ms;
}

void RecoveryClock::Decided() {
  if (!active_ && !pending_) {
    *this = RecoveryClock();
    detect_unix_ms_ = UnixMs();
  }
  pending_ = false;
  active_ = true;
  decide_ms_ = UnixMs() - detect_unix_ms_;
  reported_ = 0;
  process_start_ms_ = 0;
  regroup_s_ = restore_s_ = first_step_s_ = 0;
}

void RecoveryClock::Started() { started_unix_ms_ = UnixMs(); }

std::string RecoveryClock::FirstStep(const pb::Metrics& m, uint64_t generation, int world) {
  if (!active_ || m.generation() != generation) return "";
  // The worker's start by its host's clock, moved onto ours: its record
  // (unix_ms, its clock) arrives now (ours), give or take the network's
  // latency. A host minutes off made teardown_ms minutes long, or 0.
  const int64_t offset = m.unix_ms() > 0 ? UnixMs() - m.unix_ms() : 0;
  process_start_ms_ = std::max(process_start_ms_, m.process_start_unix_ms() + offset);
  restore_s_ = std::max(restore_s_, m.restore_seconds());
  regroup_s_ = std::max(regroup_s_, (m.ready_unix_ms() - m.process_start_unix_ms()) / 1e3 - m.restore_seconds());
  first_step_s_ = std::max(first_step_s_, m.step_seconds());
  first_step_ = m.step();
  if (++reported_ < world) return "";
  auto ms = [](double s) { return std::to_string(static_cast<int64_t>(std::llround(s * 1e3))); };
  const std::string line =
      "generation=" + std::to_string(generation) +
      " from_step=" + std::to_string(static_cast<int64_t>(first_step_) - 1) +
      " detect_ms=" + std::to_string(detect_latency_ms_) + " decide_ms=" + std::to_string(decide_ms_) +
      " teardown_ms=" + std::to_string(std::max<int64_t>(0, process_start_ms_ - started_unix_ms_)) +
      " regroup_ms=" + ms(regroup_s_) + " copy_ms=" + ms(restore_s_) + " first_step_ms=" + ms(first_step_s_) +
      " total_ms=" + std::to_string(UnixMs() - detect_unix_ms_);
  *this = RecoveryClock();
  return line;
}

std::string RecoveryClock::WaitingFor(uint64_t generation, const std::vector<Rank>& ranks) const {
  if (!active_) return "";
  static const char* kTodo[] = {"to start", "to read their generation", "to join their groups and restore",
                                "to complete their first step"};
  std::map<int, std::string> todo;  // by the phase they have yet to finish, in rank order
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].stepped) continue;
    std::string& list = todo[std::clamp(ranks[r].phase, 0, 3)];
    list += (list.empty() ? "" : ", ") + std::to_string(r) + (ranks[r].host.empty() ? "" : " on " + ranks[r].host);
  }
  char took[32];
  snprintf(took, sizeof took, "%.1f", (UnixMs() - detect_unix_ms_) / 1e3);
  std::string s = "recovery to generation " + std::to_string(generation) + " for " + took + " s";
  for (const auto& [phase, list] : todo) s += "; rank(s) " + list + " " + kTodo[phase];
  return s;
}

}  // namespace ob::launch
