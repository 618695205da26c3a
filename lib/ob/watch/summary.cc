#include "ob/watch/summary.h"

#include <cmath>
#include <cstdio>

#include "ob/watch/events.h"

namespace ob::watch {

std::string SummaryTable(const RunState& run, const DetectorOptions& o, const std::string& source,
                         size_t recent_events) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "# ob-watch %s: generation %llu, %llu records, last step %llu%s%s\n",
                source.c_str(), static_cast<unsigned long long>(run.generation),
                static_cast<unsigned long long>(run.records),
                static_cast<unsigned long long>(run.max_step), run.now_ms > 0 ? ", at " : "",
                run.now_ms > 0 ? FormatUnixMs(run.now_ms).c_str() : "");
  out += line;
  std::snprintf(line, sizeof line, "#%-15s %5s %4s %5s %8s %8s %8s %10s %10s %9s %7s  %s\n", " host", "rank",
                "pipe", "stage", "step", "step", "compute", "tokens", "loss", "memory", "heard", "state");
  out += line;
  std::snprintf(line, sizeof line, "#%-15s %5s %4s %5s %8s %8s %8s %10s %10s %9s %7s  %s\n", "", "", "", "", "",
                "(s)", "(s)", "(/s)", "", "(GiB)", "(s ago)", "");
  out += line;
  const int64_t hang_ms = static_cast<int64_t>(o.hang_timeout_s * 1000);
  for (auto it = run.ranks.lower_bound({run.generation, 0});
       it != run.ranks.end() && it->first.generation == run.generation; ++it) {
    const RankState& r = it->second;
    const double heard = (run.now_ms - r.last_heard_ms) / 1000.0;
    std::string state = r.exited ? "exited" : run.now_ms - r.last_heard_ms >= hang_ms ? "SILENT" : "ok";
    if (!r.exited && r.recent_ratio.size() > 0 && r.recent_ratio.back() >= o.straggler_ratio)
      state += " slow";
    char loss[48];
    if (std::isfinite(r.loss)) std::snprintf(loss, sizeof loss, "%10.4f", r.loss);
    else std::snprintf(loss, sizeof loss, "%10s", FormatDouble(r.loss).c_str());
    std::snprintf(line, sizeof line, " %-15.15s %5u %4u %5u %8llu %8.3f %8.3f %10.0f %s %9.2f %7.1f  %s\n",
                  r.host.c_str(), r.rank, r.pipeline, r.stage,
                  static_cast<unsigned long long>(r.last_step), r.step_seconds, r.compute_seconds,
                  r.tokens_per_second, loss, static_cast<double>(r.memory_bytes) / (1 << 30), heard,
                  state.c_str());
    out += line;
  }
  std::string counts;
  uint64_t total = 0;
  for (const auto& [kind, n] : run.event_counts) {
    counts += (counts.empty() ? "" : ", ") + std::to_string(n) + " " + KindName(kind);
    total += n;
  }
  out += "# events: " + (total == 0 ? std::string("none") : counts) + "\n";
  const size_t from = run.recent_events.size() > recent_events ? run.recent_events.size() - recent_events : 0;
  for (size_t i = from; i < run.recent_events.size(); ++i)
    out += "#   " + EventLine(run.recent_events[i]) + "\n";
  return out;
}

}  // namespace ob::watch
