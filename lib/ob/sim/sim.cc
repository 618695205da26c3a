// A plan's run under failures, decided by the master's decision function
// (see sim.h).
#include "ob/sim/sim.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "ob/io/text.h"
#include "ob/plan/instantiation.h"
#include "ob/plan/reliability.h"

namespace ob::sim {

namespace {

using io::Fixed;
using io::Trim;

// Steps, checkpoints and time after `pos` seconds of training in one
// generation: K steps of `iter` seconds, then a checkpoint of `ck`, again.
struct Progress {
  int64_t steps = 0;
  int64_t checkpoints = 0;
  double checkpointing_s = 0;  // done and in progress
  double partial_s = 0;        // of a step in flight
};

Progress At(double pos, double iter, int64_t k, double ck) {
  Progress p;
  const double period = static_cast<double>(k) * iter + ck;
  const double full = std::floor(pos / period);
  double rem = pos - full * period;
  p.checkpoints = static_cast<int64_t>(full);
  p.steps = p.checkpoints * k;
  p.checkpointing_s = full * ck;
  const int64_t more = std::min<int64_t>(k, static_cast<int64_t>(std::floor(rem / iter)));
  p.steps += more;
  rem -= static_cast<double>(more) * iter;
  if (more == k) {
    p.checkpointing_s += rem;  // a checkpoint in progress: not complete
  } else {
    p.partial_s = rem;
  }
  return p;
}

class Run {
 public:
  Run(const plan::LoadedPlan& plan, const SimOptions& o) : plan_(plan), o_(o) {}

  Result<SimResult> Go(const std::vector<TraceEvent>& trace) {
    const plan::Problem& pr = plan_.problem;
    r_.nodes = pr.cluster.nodes;
    r_.horizon_s = o_.horizon_s;
    r_.tokens_per_step = static_cast<double>(pr.microbatches) * pr.microbatch_size * pr.sequence_length;
    r_.policy = PolicyName(o_.policy);
    if (o_.policy != Policy::kCheckpointRestart) {
      r_.faults = pr.faults;
      current_ = plan_.instantiation;
    } else {
      plan::Problem p0 = pr;
      p0.faults = 0;
      OB_ASSIGN_OR_RETURN(current_, plan::Instantiate(p0, plan_.templates));
    }
    if (!(current_.iteration_seconds > 0)) {
      return Status::Config("the plan's instantiation has no iteration time");
    }
    r_.nominal_iteration_s = Iter();
    holding_ = current_;
    for (int n = 0; n < r_.nodes; ++n) live_.insert(n);
    master_ = o_.policy == Policy::kCheckpointRestart ? -1 : o_.master_node;
    // The run starts like a restart: its lineage has no step yet.
    gen_t0_ = 0;
    ready_ = 0;
    has_steps_ = false;
    const size_t total = trace.size();
    size_t done = 0;
    for (const TraceEvent& e : trace) {
      if (e.t >= o_.horizon_s) break;
      if (e.node < 0 || e.node >= r_.nodes) {
        return Status::DataErr("trace event for node " + std::to_string(e.node) + " of a " +
                               std::to_string(r_.nodes) + "-node plan");
      }
      if (e.fail) {
        Fail(e.t, e.node);
      } else {
        Repair(e.t, e.node);
      }
      ++done;
      if (o_.progress) o_.progress(done, total);
    }
    Close(o_.horizon_s);
    r_.steps = steps_;
    r_.mean_iteration_s = steps_run_ > 0 ? step_time_ / static_cast<double>(steps_run_) : 0;
    double useful = 0;
    for (const auto& [n, iter] : useful_) useful += static_cast<double>(n) * iter;
    r_.ettr = useful / o_.horizon_s;
    r_.goodput = static_cast<double>(steps_) * r_.tokens_per_step / o_.horizon_s;
    return r_;
  }

 private:
  // The current instantiation's iteration time, as the planner predicts it
  // times the measured calibration.
  double Iter() const { return current_.iteration_seconds * o_.iteration_scale; }

  int64_t StepsPerCheckpoint() const {
    const double iter = Iter();
    return std::max<int64_t>(1, static_cast<int64_t>(std::llround(o_.checkpoint_interval_s / iter)));
  }

  // Ends the current generation at `t`, accounting its recovery (or
  // restart) and then its training; the step in flight is lost. Called once
  // a generation (or a stretch of being down).
  void Close(double t) {
    if (down_) {
      r_.down_s += t - gen_t0_;
      gen_t0_ = t;
      r_.timeline.emplace_back(t, steps_);
      return;
    }
    const double cost_end = std::min(t, ready_);
    (restarting_ ? r_.restarting_s : r_.recovering_s) += cost_end - gen_t0_;
    if (t > ready_) {
      const double iter = Iter();
      const int64_t k = StepsPerCheckpoint();
      const Progress p = At(t - ready_, iter, k, o_.checkpoint_s);
      r_.training_s += static_cast<double>(p.steps) * iter + p.partial_s;
      r_.lost_work_s += p.partial_s;
      r_.checkpointing_s += p.checkpointing_s;
      if (p.steps > 0) {
        steps_run_ += p.steps;
        step_time_ += static_cast<double>(p.steps) * iter;
        r_.worst_iteration_s = std::max(r_.worst_iteration_s, iter);
        steps_ += p.steps;
        useful_.emplace_back(p.steps, iter);
        if (p.checkpoints > 0) last_checkpoint_ = gen_base_ + p.checkpoints * k;
        has_steps_ = true;
        holding_ = current_;
        lost_.clear();
        fruitless_ = 0;
      }
    }
    gen_t0_ = t;
    r_.timeline.emplace_back(t, steps_);
  }

  // Back to the last checkpoint: the steps since are redone.
  void Rollback(double t) {
    int64_t redo = steps_ - last_checkpoint_;
    r_.steps_redone += redo;
    while (redo > 0 && !useful_.empty()) {
      auto& [n, iter] = useful_.back();
      const int64_t take = std::min(n, redo);
      r_.lost_work_s += static_cast<double>(take) * iter;
      n -= take;
      redo -= take;
      if (n == 0) useful_.pop_back();
    }
    steps_ = last_checkpoint_;
    r_.timeline.emplace_back(t, steps_);
  }

  void Start(double t, const plan::Instantiation& next, bool restart) {
    current_ = next;
    restarting_ = restart;
    down_ = false;
    gen_t0_ = t;
    ready_ = t + (restart ? o_.restart_s : o_.recovery_s);
    gen_base_ = steps_;
    if (restart) {  // a new lineage from the checkpoint
      has_steps_ = false;
      holding_ = next;
      lost_.clear();
    }
  }

  void GoDown(double t) {
    down_ = true;
    gen_t0_ = t;
  }

  launch::RecoveryFacts Facts(const std::string& what) {
    launch::RecoveryFacts f;
    f.plan = &plan_;
    f.current = current_;
    f.holding = holding_;
    f.snapshots = has_steps_;
    for (int n : live_) {
      if (!retired_.count(n)) f.live.push_back(n);
    }
    f.lost.assign(lost_.begin(), lost_.end());
    for (int n : lost_) f.lost_names += (f.lost_names.empty() ? "h" : ", h") + std::to_string(n);
    f.what = what;
    f.fruitless = ++fruitless_;
    const int64_t step = last_checkpoint_;
    f.newest_checkpoint = [step]() -> Result<launch::CheckpointRef> {
      return launch::CheckpointRef{"step-" + std::to_string(step), step};
    };
    return f;
  }

  void Decide(double t, const std::string& what) {
    const launch::RecoveryFacts f = Facts(what);
    const launch::Decision d = o_.decide ? o_.decide(f) : launch::DecideRecovery(f);
    switch (d.kind) {
      case launch::Decision::Kind::kInPlace:
        ++r_.in_place;
        Start(t, d.next, false);
        break;
      case launch::Decision::Kind::kReinstantiate:
        ++r_.reinstantiations;
        Start(t, d.next, false);
        break;
      case launch::Decision::Kind::kCheckpoint:
        ++r_.checkpoint_restarts;
        Rollback(t);
        Start(t, d.next, true);
        break;
      case launch::Decision::Kind::kStop:
        ++r_.stops;
        Rollback(t);
        GoDown(t);
        break;
    }
  }

  void Fail(double t, int node) {
    if (!live_.count(node)) return;  // already out
    ++r_.failures;
    r_.failure_times.push_back(t);
    if (retired_.erase(node) > 0) {  // oobleck-style: a node the run no longer uses
      live_.erase(node);
      return;
    }
    Close(t);
    live_.erase(node);
    if (o_.policy == Policy::kCheckpointRestart) {  // a spare takes the node's place
      ++r_.checkpoint_restarts;
      Rollback(t);
      Start(t, current_, true);
      return;
    }
    lost_.insert(node);
    const bool master = node == master_;
    if (master) {
      ++r_.master_failures;
      master_ = live_.empty() ? -1 : *live_.begin();  // the standby's host, or the requeued job's
    }
    if (down_) return;
    if (master && !o_.standby_master) {  // the job is gone: a requeue from the last checkpoint
      ++r_.checkpoint_restarts;
      Rollback(t);
      std::vector<int> live;
      for (int n : live_) {
        if (!retired_.count(n)) live.push_back(n);
      }
      Result<plan::Instantiation> inst = launch::InstantiateOn(plan_, live);
      if (!inst.ok()) return GoDown(t);
      fruitless_ = 0;
      return Start(t, *inst, true);
    }
    Decide(t, "h" + std::to_string(node) + " lost");
    if (master && !down_) ready_ += o_.takeover_s;  // the standby heard the master's silence first
  }

  void Repair(double t, int node) {
    if (live_.count(node)) return;
    ++r_.repairs;
    live_.insert(node);
    if (o_.policy == Policy::kCheckpointRestart) return;  // back in the spare pool
    if (o_.policy == Policy::kOobleck && !down_) {  // not taken in again
      retired_.insert(node);
      return;
    }
    Close(t);
    if (down_) {  // requeued: the templates afresh on what is live
      retired_.clear();
      std::vector<int> live(live_.begin(), live_.end());
      Result<plan::Instantiation> inst = launch::InstantiateOn(plan_, live);
      if (inst.ok()) {
        fruitless_ = 0;
        Start(t, *inst, true);
      }
      return;
    }
    Decide(t, "hosts came back");
  }

  const plan::LoadedPlan& plan_;
  const SimOptions& o_;
  SimResult r_;
  plan::Instantiation current_, holding_;
  std::set<int> live_, lost_;
  std::set<int> retired_;  // oobleck-style: back, but not taken in again
  bool has_steps_ = false, down_ = false, restarting_ = true;
  double gen_t0_ = 0, ready_ = 0;
  int64_t steps_ = 0, gen_base_ = 0, last_checkpoint_ = 0, steps_run_ = 0;
  double step_time_ = 0;
  int fruitless_ = 0;
  int master_ = -1;  // the master's host (SimOptions::master_node, then wherever it moved)
  std::vector<std::pair<int64_t, double>> useful_;  // (steps, iteration time), in order
};

}  // namespace

const char* PolicyName(Policy p) {
  switch (p) {
    case Policy::kOb: return "ob";
    case Policy::kCheckpointRestart: return "checkpoint-restart";
    case Policy::kOobleck: return "oobleck-style";
  }
  return "?";
}

Result<Policy> ParsePolicy(const std::string& name) {
  for (Policy p : {Policy::kOb, Policy::kCheckpointRestart, Policy::kOobleck}) {
    if (name == PolicyName(p)) return p;
  }
  return Status::Usage("--policy '" + name + "': expected ob, checkpoint-restart or oobleck-style");
}

Result<std::vector<TraceEvent>> ParseTrace(const std::string& text, const std::string& path,
                                           const std::vector<std::string>& hosts) {
  std::map<std::string, int> index;
  for (size_t i = 0; i < hosts.size(); ++i) index[hosts[i]] = static_cast<int>(i);
  std::vector<std::pair<TraceEvent, int>> read;  // each event and its line
  std::istringstream in(text);
  std::string line;
  int no = 0;
  while (std::getline(in, line)) {
    ++no;
    const std::string where = path + ":" + std::to_string(no);
    line = Trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    std::istringstream words(line);
    std::string when, what, host, extra;
    words >> when >> what >> host;
    if (host.empty() || (words >> extra)) {
      return Status::DataErr(where + ": expected 'TIME fail|repair HOST', got '" + line + "'");
    }
    Result<double> t = plan::ParseDuration(when, "time");
    if (!t.ok()) return Status::DataErr(where + ": " + t.status().message());
    TraceEvent e;
    e.t = *t;
    if (what == "fail") {
      e.fail = true;
    } else if (what == "repair") {
      e.fail = false;
    } else {
      return Status::DataErr(where + ": '" + what + "' is neither fail nor repair");
    }
    if (auto it = index.find(host); it != index.end()) {
      e.node = it->second;
    } else {
      char* end = nullptr;
      const long n = std::strtol(host.c_str(), &end, 10);
      if (end == host.c_str() || *end != '\0' || n < 0 || n >= static_cast<long>(hosts.size())) {
        return Status::DataErr(where + ": no host '" + host + "' in the plan (" +
                               std::to_string(hosts.size()) + " hosts)");
      }
      e.node = static_cast<int>(n);
    }
    read.emplace_back(e, no);
  }
  std::stable_sort(read.begin(), read.end(), [](const auto& a, const auto& b) { return a.first.t < b.first.t; });
  // In time order, a node fails when it is up and is repaired when it is
  // down: a repair before its failure (a time mistyped) or a failure twice
  // would be replayed as nothing, silently.
  std::vector<int> down_since(hosts.size(), 0);  // the line that took it down; 0: up
  std::vector<TraceEvent> out;
  for (const auto& [e, line_no] : read) {
    const std::string where = path + ":" + std::to_string(line_no);
    const std::string name = hosts[static_cast<size_t>(e.node)];
    int& since = down_since[static_cast<size_t>(e.node)];
    if (e.fail && since != 0) {
      return Status::DataErr(where + ": " + name + " fails again, down since line " + std::to_string(since) +
                             " with no repair between");
    }
    if (!e.fail && since == 0) {
      return Status::DataErr(where + ": " + name + " is repaired but is not down then (events are replayed in "
                                     "time order)");
    }
    since = e.fail ? line_no : 0;
    out.push_back(e);
  }
  return out;
}

Result<std::vector<TraceEvent>> GenerateTrace(int nodes, const TraceModel& m, size_t max_events) {
  std::vector<TraceEvent> out;
  std::mt19937_64 rng(m.seed);
  // Weibull of shape k with mean `mtbf`: scale = mtbf / Γ(1 + 1/k).
  const double k = m.weibull_shape > 0 ? m.weibull_shape : 1;
  const double scale = m.node_mtbf_s / std::tgamma(1 + 1 / k);
  if (!(scale > 0 && std::isfinite(scale))) {
    return Status::Usage("a Weibull shape of " + io::FormatDouble(k) + " has no finite scale for a mean of " +
                         io::FormatDouble(m.node_mtbf_s) + " s");
  }
  std::weibull_distribution<double> up(k, scale);
  for (int n = 0; n < nodes; ++n) {
    double t = 0;
    for (;;) {
      t += up(rng);
      if (!(t < m.horizon_s)) break;
      if (out.size() + 2 > max_events) {
        return Status::Usage("the drawn trace holds more than " + std::to_string(max_events) +
                             " events by node " + std::to_string(n) + " of " + std::to_string(nodes) +
                             " (a Weibull shape of " + io::FormatDouble(k) +
                             " draws most times far below their mean)");
      }
      out.push_back({t, true, n});
      t += m.repair_s;
      if (t >= m.horizon_s) break;
      out.push_back({t, false, n});
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.t < b.t || (a.t == b.t && a.node < b.node);
  });
  return out;
}

Result<RecordedRecoveries> RecoveriesFromEvents(const std::string& text, const std::string& path) {
  RecordedRecoveries r;
  double sum = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(" recovered ") == std::string::npos) continue;
    // A field's milliseconds, 0 when the line has none.
    auto ms = [&line](const std::string& key) {
      const size_t at = line.find(" " + key + "=");
      return at == std::string::npos ? 0.0 : std::strtod(line.c_str() + at + key.size() + 2, nullptr);
    };
    if (line.find(" total_ms=") == std::string::npos) continue;
    // total_ms runs from the detection to the end of the new generation's
    // first step, which is training like any other (the simulator runs it
    // after the recovery). detect_ms is left out: for a host whose
    // connection closes (a crash, kill -9) the master knows at once, and
    // detect_ms is the time since the host's last message, the step in
    // flight that the simulator charges as lost work already.
    sum += std::max(0.0, ms("total_ms") - ms("first_step_ms")) / 1000;
    ++r.count;
  }
  if (r.count == 0) return Status::DataErr(path + ": no 'recovered' lines (an ob-launch events.log?)");
  r.mean_s = sum / r.count;
  return r;
}

Result<SimResult> Simulate(const plan::LoadedPlan& plan, const std::vector<TraceEvent>& trace,
                           const SimOptions& options) {
  if (!(options.horizon_s > 0)) return Status::Usage("the horizon must be positive");
  if (!(options.iteration_scale > 0)) return Status::Usage("the iteration time scale must be positive");
  if (options.recovery_s < 0 || options.restart_s < 0 || options.checkpoint_s < 0 ||
      !(options.checkpoint_interval_s > 0)) {
    return Status::Usage("recovery, restart and checkpoint times cannot be negative, the checkpoint interval must be positive");
  }
  Run run(plan, options);
  return run.Go(trace);
}

std::string Report(const std::vector<SimResult>& results) {
  std::ostringstream out;
  for (const SimResult& r : results) {
    const double h = r.horizon_s / 3600;
    out << r.policy << " (" << r.nodes << " nodes, f=" << r.faults << ", iteration "
        << Fixed(r.nominal_iteration_s, 3) << " s planned, " << Fixed(r.mean_iteration_s, 3) << " s mean, "
        << Fixed(r.worst_iteration_s, 3) << " s worst): ETTR " << Fixed(r.ettr, 3) << ", goodput "
        << Fixed(r.goodput, 0) << " tokens/s, " << r.steps << " useful steps, " << r.steps_redone
        << " redone\n";
    out << "  " << r.failures << " failures (" << r.master_failures << " of the master's host), " << r.repairs
        << " repairs: " << r.in_place << " in place, "
        << r.reinstantiations << " re-instantiations, " << r.checkpoint_restarts
        << " restarts from a checkpoint, " << r.stops << " stops\n";
    out << "  of " << Fixed(h, 1) << " h: training " << Fixed(r.training_s / 3600, 2) << " h (lost work "
        << Fixed(r.lost_work_s / 3600, 2) << " h), checkpointing " << Fixed(r.checkpointing_s / 3600, 2)
        << " h, recovering " << Fixed(r.recovering_s / 3600, 2) << " h, restarting "
        << Fixed(r.restarting_s / 3600, 2) << " h, down " << Fixed(r.down_s / 3600, 2) << " h\n";
  }
  return out.str();
}

std::string TimelineSvg(const std::vector<SimResult>& results, const std::string& title) {
  const double W = 900, H = 420, left = 80, right = 20, top = 40, bottom = 60;
  const double pw = W - left - right, ph = H - top - bottom;
  double horizon = 1;
  int64_t most = 1;
  for (const auto& r : results) {
    horizon = std::max(horizon, r.horizon_s);
    for (const auto& [t, s] : r.timeline) most = std::max(most, s);
  }
  const double hours = horizon / 3600;
  auto x = [&](double t) { return left + pw * (t / horizon); };
  auto y = [&](double s) { return top + ph * (1 - s / static_cast<double>(most)); };
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"" << W / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">";
  for (char c : title) {
    if (c == '<') o << "&lt;"; else if (c == '&') o << "&amp;"; else if (c == '>') o << "&gt;"; else o << c;
  }
  o << "</text>\n";
  o << "<line x1=\"" << left << "\" y1=\"" << top + ph << "\" x2=\"" << left + pw << "\" y2=\"" << top + ph
    << "\" stroke=\"black\"/>\n<line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\""
    << top + ph << "\" stroke=\"black\"/>\n";
  const bool days = hours > 72;
  const double unit = days ? 24 : 1;
  const double span = hours / unit;
  double tick = 1;
  for (double step : {1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0}) {
    tick = step;
    if (span / step <= 10) break;
  }
  for (double v = 0; v <= span + 1e-9; v += tick) {
    const double px = x(v * unit * 3600);
    o << "<line x1=\"" << px << "\" y1=\"" << top + ph << "\" x2=\"" << px << "\" y2=\"" << top + ph + 5
      << "\" stroke=\"black\"/><text x=\"" << px << "\" y=\"" << top + ph + 18 << "\" text-anchor=\"middle\">"
      << Fixed(v, 0) << "</text>\n";
  }
  o << "<text x=\"" << left + pw / 2 << "\" y=\"" << H - 12 << "\" text-anchor=\"middle\">time ("
    << (days ? "days" : "hours") << ")</text>\n";
  for (int i = 0; i <= 4; ++i) {
    const double s = static_cast<double>(most) * i / 4;
    o << "<line x1=\"" << left - 5 << "\" y1=\"" << y(s) << "\" x2=\"" << left << "\" y2=\"" << y(s)
      << "\" stroke=\"black\"/><text x=\"" << left - 8 << "\" y=\"" << y(s) + 4 << "\" text-anchor=\"end\">"
      << static_cast<int64_t>(s) << "</text>\n";
  }
  o << "<text x=\"16\" y=\"" << top + ph / 2 << "\" transform=\"rotate(-90 16 " << top + ph / 2
    << ")\" text-anchor=\"middle\">useful steps</text>\n";
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};
  // Failures: ticks under the axis, from the first result (one trace).
  if (!results.empty()) {
    o << "<g stroke=\"#999\">";
    for (double t : results.front().failure_times) {
      o << "<line x1=\"" << x(t) << "\" y1=\"" << top + ph - 6 << "\" x2=\"" << x(t) << "\" y2=\"" << top + ph
        << "\"/>";
    }
    o << "</g>\n";
  }
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    const char* c = colors[i % 5];
    o << "<polyline fill=\"none\" stroke=\"" << c << "\" stroke-width=\"1.5\" points=\"" << x(0) << "," << y(0);
    // About two points a pixel column keeps long traces small; a rollback
    // (fewer useful steps than before) is always drawn.
    double last_px = -1;
    int64_t last_s = 0;
    for (size_t j = 0; j < r.timeline.size(); ++j) {
      const auto& [t, s] = r.timeline[j];
      const double px = x(t);
      if (px - last_px < 0.5 && s >= last_s && j + 1 < r.timeline.size()) continue;
      o << " " << Fixed(px, 1) << "," << Fixed(y(static_cast<double>(s)), 1);
      last_px = px;
      last_s = s;
    }
    o << "\"/>\n";
    const double ly = top + 16 + 16 * static_cast<double>(i);
    o << "<line x1=\"" << left + 10 << "\" y1=\"" << ly - 4 << "\" x2=\"" << left + 30 << "\" y2=\"" << ly - 4
      << "\" stroke=\"" << c << "\" stroke-width=\"2\"/><text x=\"" << left + 36 << "\" y=\"" << ly << "\">"
      << r.policy << " (f=" << r.faults << "): ETTR " << Fixed(r.ettr, 3) << ", goodput "
      << Fixed(r.goodput, 0) << " tokens/s</text>\n";
  }
  o << "<text x=\"" << left + pw << "\" y=\"" << top + ph - 10 << "\" text-anchor=\"end\" fill=\"#666\">"
    << "ticks: node failures</text>\n";
  o << "</svg>\n";
  return o.str();
}

}  // namespace ob::sim
