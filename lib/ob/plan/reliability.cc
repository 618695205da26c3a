// f from failure rates (see reliability.h for the model).
#include "ob/plan/reliability.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace ob::plan {
namespace {

constexpr double kDay = 86400.0;
constexpr double kTie = 1e-4;  // goodputs this close (relative) are equal

// The restarts from a checkpoint per second: the failures that find f
// nodes down, and without a standby master every failure of its host.
double Beyond(double lambda, double master, double p_beyond, bool standby) {
  return standby ? lambda * p_beyond : (lambda - master) * p_beyond + master;
}

std::string Seconds(double s) {  // "3.2 s", "14 min", "2.5 h", "3.1 d"
  char buf[32];
  if (!std::isfinite(s)) return "-";
  if (s < 120) std::snprintf(buf, sizeof buf, "%.1f s", s);
  else if (s < 7200) std::snprintf(buf, sizeof buf, "%.0f min", s / 60);
  else if (s < 2 * kDay) std::snprintf(buf, sizeof buf, "%.1f h", s / 3600);
  else std::snprintf(buf, sizeof buf, "%.1f d", s / kDay);
  return buf;
}

}  // namespace

double PoissonTail(double mean, int k) {
  if (k <= 0) return 1.0;
  if (mean <= 0) return 0.0;
  // Σ_{i<k} e^{−a} aⁱ/i!; the tail is 1 minus it, or, when that would lose
  // the tail to rounding, the sum of the terms from k on.
  double term = std::exp(-mean), below = 0;
  for (int i = 0; i < k; ++i) {
    below += term;
    term *= mean / (i + 1);
  }
  if (below <= 0.999) return 1.0 - below;
  double tail = 0;
  for (int i = k; i < k + 1000 && term > 1e-300; ++i) {
    tail += term;
    term *= mean / (i + 1);
  }
  return tail;
}

Result<FaultChoice> ChooseFaults(int nodes, double tokens_per_iteration, const FailureModel& m,
                                 const IterationSeconds& iteration_seconds, int max_f) {
  if (!(m.node_mtbf_s > 0) || !std::isfinite(m.node_mtbf_s))
    return Status::Usage("--node-mtbf must be a positive duration");
  if (!(m.horizon_s > 0)) return Status::Usage("--horizon must be longer than 0");
  if (!(m.repair_s >= 0) || !(m.recovery_s >= 0) || !(m.restart_s >= 0) || !(m.checkpoint_s >= 0))
    return Status::Usage("--repair-time, --horizon, --recovery-time, --restart-time and --checkpoint-cost must not be negative");
  if (nodes < 1 || !(tokens_per_iteration > 0)) return Status::Usage("no cluster or no batch to plan for");
  const double lambda = nodes / m.node_mtbf_s;  // failures per second, whole cluster
  const double down_mean = lambda * m.repair_s;  // nodes out at a time, on average
  const double master = 1 / m.node_mtbf_s;       // the master's host's failures
  if (!(m.takeover_s >= 0)) return Status::Usage("--takeover-time must not be negative");
  FaultChoice choice;
  Status last_error = Status::Ok();
  for (int f = 0; f <= max_f && f < nodes; ++f) {
    FaultOption o;
    o.f = f;
    o.failures_per_day = lambda * kDay;
    Result<double> full = iteration_seconds(f, nodes);
    if (!full.ok()) {
      o.why = full.status().message();
      last_error = full.status();
      choice.options.push_back(o);
      break;  // a larger f needs more pipelines still
    }
    o.feasible = true;
    o.iteration_s = *full;
    o.tokens_per_s = tokens_per_iteration / o.iteration_s;
    // Whatever f, k nodes out leave N − k to train, at (N − k)/N of the
    // speed (recovered in place or restarted, the run goes on without them).
    o.degraded_tokens_per_s = o.tokens_per_s * (1 - std::min<double>(down_mean, nodes) / nodes);
    o.p_beyond = PoissonTail(down_mean, f);
    const double beyond = Beyond(lambda, master, o.p_beyond, m.standby_master);
    o.beyond_per_day = beyond * kDay;
    // Young's interval for the restarts; at least one checkpoint in the
    // horizon whatever f (the run's end is one).
    o.checkpoint_interval_s = m.horizon_s;
    if (beyond > 0 && m.checkpoint_s > 0) {
      o.checkpoint_interval_s = std::clamp(std::sqrt(2 * m.checkpoint_s / beyond), o.iteration_s, m.horizon_s);
    } else if (beyond > 0) {
      o.checkpoint_interval_s = o.iteration_s;  // free checkpoints: every step
    }
    o.lost_fraction = (lambda - beyond) * (m.recovery_s + o.iteration_s / 2) +
                      (m.standby_master ? master * (1 - o.p_beyond) * m.takeover_s : 0) +
                      beyond * (m.restart_s + o.checkpoint_interval_s / 2) +
                      m.checkpoint_s / o.checkpoint_interval_s;
    o.goodput = o.degraded_tokens_per_s * std::max(0.0, 1 - o.lost_fraction);
    choice.options.push_back(o);
    // Beyond the point where failures past f are negligible, a larger f
    // only costs throughput.
    if (o.p_beyond < 1e-9 && f > 0) break;
  }
  // The smallest f within kTie of the best: past the point where failures
  // beyond f stop mattering, a larger f buys only rounding.
  double best = -1;
  for (const auto& o : choice.options) {
    if (o.feasible) best = std::max(best, o.goodput);
  }
  for (const auto& o : choice.options) {
    if (o.feasible && o.goodput >= best * (1 - kTie)) {
      choice.f = o.f;
      break;
    }
  }
  if (choice.f < 0) {
    return Status::Config("no plan for any f: " + (last_error.ok() ? std::string("nothing to plan") : last_error.message()));
  }
  const FaultOption& chosen = choice.options[static_cast<size_t>(choice.f)];
  if (!(chosen.goodput > 0)) {
    // Say which cost ate the time: the failures' recoveries and restarts,
    // the checkpoints (a short --horizon bounds their interval), or the
    // repairs (every node out at once).
    char line[640];
    int n = std::snprintf(line, sizeof line, "-f auto: no f up to %d leaves any goodput: with a node MTBF of %s "
                          "the %d nodes fail every %s",
                          choice.options.back().f, Seconds(m.node_mtbf_s).c_str(), nodes, Seconds(1 / lambda).c_str());
    n = std::clamp(n, 0, static_cast<int>(sizeof line) - 1);  // what the rest may append to
    if (down_mean >= nodes) {
      std::snprintf(line + n, sizeof line - n, " and stay out %s each (--repair-time): on average all are out at once",
                    Seconds(m.repair_s).c_str());
    } else {
      const double beyond = Beyond(lambda, master, chosen.p_beyond, m.standby_master);
      std::snprintf(line + n, sizeof line - n,
                    "; with f = %d, recoveries (%s each) take %.0f%% of the time, restarts from a checkpoint (%s "
                    "each) %.0f%%, checkpoints (%s each, every %s) %.0f%%",
                    chosen.f, Seconds(m.recovery_s).c_str(),
                    100 * (lambda - beyond) * (m.recovery_s + chosen.iteration_s / 2),
                    Seconds(m.restart_s).c_str(), 100 * beyond * (m.restart_s + chosen.checkpoint_interval_s / 2),
                    Seconds(m.checkpoint_s).c_str(), Seconds(chosen.checkpoint_interval_s).c_str(),
                    100 * m.checkpoint_s / chosen.checkpoint_interval_s);
    }
    return Status::Config(line);
  }
  return choice;
}

std::string ExplainFaultChoice(const FaultChoice& c, const FailureModel& m, int nodes) {
  std::ostringstream out;
  const double lambda = nodes / m.node_mtbf_s;
  out << "# -f auto: " << nodes << " nodes, node MTBF " << Seconds(m.node_mtbf_s) << " (a failure every "
      << Seconds(1 / lambda) << "), repair " << Seconds(m.repair_s) << ", " << std::fixed;
  out.precision(2);
  out << lambda * m.repair_s << " nodes down on average\n";
  out << "# recovery in place " << Seconds(m.recovery_s) << ", restart from a checkpoint " << Seconds(m.restart_s)
      << ", a checkpoint costs " << Seconds(m.checkpoint_s) << ", horizon " << Seconds(m.horizon_s) << "\n";
  if (m.standby_master) {
    out << "# the master's host: recovered in place like another, " << Seconds(m.takeover_s)
        << " later (its standby takes over)\n";
  } else {
    out << "# the master's host: no standby (--standby-master off): each of its failures is a restart from a "
           "checkpoint, whatever f\n";
  }
  char line[320];
  std::snprintf(line, sizeof line, "%-3s %12s %12s %13s %12s %13s %9s %12s  %s\n", "f", "iteration_s",
                "tokens/s", "degraded_t/s", "P(beyond f)", "restarts/day", "ckpt_every", "goodput", "");
  out << line;
  for (const auto& o : c.options) {
    if (!o.feasible) {
      std::snprintf(line, sizeof line, "%-3d %s\n", o.f, ("not plannable: " + o.why).c_str());
      out << line;
      continue;
    }
    std::snprintf(line, sizeof line, "%-3d %12.4f %12.0f %13.0f %12.3g %13.3g %9s %12.0f  %s\n", o.f, o.iteration_s,
                  o.tokens_per_s, o.degraded_tokens_per_s, o.p_beyond, o.beyond_per_day,
                  o.checkpoint_interval_s > 0 ? Seconds(o.checkpoint_interval_s).c_str() : "-", o.goodput,
                  o.f == c.f ? "<- chosen" : "");
    out << line;
  }
  return out.str();
}

Result<double> ParseDuration(const std::string& text, const std::string& what) {
  const Status bad = Status::Usage(what + " '" + text + "': expected a duration such as 90s, 45m, 7.9h or 30d");
  // A decimal number (strtod would also take " 5", "+5", hex and "nan").
  if (text.empty() || !(std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '.') ||
      text.find_first_of("xX") != std::string::npos) {
    return bad;
  }
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || errno != 0 || !std::isfinite(v) || v < 0) return bad;
  const std::string unit(end);
  double scale = 0;
  if (unit.empty() || unit == "s") scale = 1;
  else if (unit == "m" || unit == "min") scale = 60;
  else if (unit == "h") scale = 3600;
  else if (unit == "d") scale = kDay;
  if (scale == 0) return bad;
  // 1e308d is not a number of seconds a double holds: it printed as inf in
  // ob-sim's JSON, and as nan the time it trained.
  if (!std::isfinite(v * scale)) return Status::Usage(what + " '" + text + "': too long to count in seconds");
  return v * scale;
}

}  // namespace ob::plan
