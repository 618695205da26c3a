// ob-sim: a plan's run over days of node failures, decided by the master's
// own decision function (lib/ob/sim/sim.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "ob/cli/cli.h"
#include "ob/io/file.h"
#include "ob/io/message.h"
#include "ob/io/text.h"
#include "ob/log.h"
#include "ob/plan.pb.h"
#include "ob/plan/plan_io.h"
#include "ob/plan/reliability.h"
#include "ob/sim/sim.h"

namespace {

struct Options {
  std::string plan;
  std::string trace;              // a trace file, or "" to generate one
  std::string node_mtbf;          // generate: each node's mean time between failures
  double weibull_shape = 1;
  uint64_t seed = 1;
  std::string repair = "1h";
  std::string horizon = "30d";
  std::string recovery = "5s";
  std::vector<std::string> recovery_logs;
  std::string restart = "10m";
  std::string checkpoint_cost = "5s";
  std::string checkpoint_interval;  // "" = Young's, from the trace's failure rate
  std::string iteration_time;       // measured, of the plan's instantiation; "" = predicted
  std::string policies = "ob,checkpoint-restart,oobleck-style";
  std::string svg;
  std::string standby_master = "on";  // ob-launch --standby-master: on (a host of its own) or off
  std::string takeover = "3s";
};

Options g;

std::string Json(const std::vector<ob::sim::SimResult>& results, double recovery_s, double interval_s) {
  std::ostringstream o;
  auto num = [](double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return std::string(buf);
  };
  o << "{\"recovery_s\":" << num(recovery_s) << ",\"checkpoint_interval_s\":" << num(interval_s)
    << ",\"results\":[";
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    o << (i ? "," : "") << "{\"policy\":\"" << r.policy << "\",\"nodes\":" << r.nodes << ",\"faults\":" << r.faults
      << ",\"horizon_s\":" << num(r.horizon_s) << ",\"nominal_iteration_s\":" << num(r.nominal_iteration_s)
      << ",\"mean_iteration_s\":" << num(r.mean_iteration_s) << ",\"worst_iteration_s\":" << num(r.worst_iteration_s)
      << ",\"tokens_per_step\":" << num(r.tokens_per_step) << ",\"steps\":" << r.steps
      << ",\"steps_redone\":" << r.steps_redone << ",\"goodput\":" << num(r.goodput)
      << ",\"ettr\":" << num(r.ettr) << ",\"training_s\":" << num(r.training_s)
      << ",\"lost_work_s\":" << num(r.lost_work_s) << ",\"checkpointing_s\":" << num(r.checkpointing_s)
      << ",\"recovering_s\":" << num(r.recovering_s) << ",\"restarting_s\":" << num(r.restarting_s)
      << ",\"down_s\":" << num(r.down_s) << ",\"failures\":" << r.failures << ",\"repairs\":" << r.repairs
      << ",\"in_place\":" << r.in_place << ",\"reinstantiations\":" << r.reinstantiations
      << ",\"checkpoint_restarts\":" << r.checkpoint_restarts << ",\"stops\":" << r.stops
      << ",\"master_failures\":" << r.master_failures << "}";
  }
  o << "]}\n";
  return o.str();
}

ob::Status Run(const ob::cli::CommonOptions& common) {
  // No plan named: standard input, unless that is a terminal (as ob-plan
  // reads its profile), so that ob-plan ... | ob-sim composes.
  OB_ASSIGN_OR_RETURN(g.plan, ob::cli::InputPath(g.plan, "plan"));
  if (g.trace.empty() == g.node_mtbf.empty()) {
    return ob::Status::Usage("give a failure trace (--trace FILE) or a failure rate to draw one from (--node-mtbf)");
  }
  if (!(g.weibull_shape > 0 && std::isfinite(g.weibull_shape)))
    return ob::Status::Usage("--weibull-shape must be a positive, finite number");
  OB_ASSIGN_OR_RETURN(const double horizon, ob::plan::ParseDuration(g.horizon, "--horizon"));
  if (!(horizon > 0)) return ob::Status::Usage("--horizon must be positive");
  OB_ASSIGN_OR_RETURN(const double repair, ob::plan::ParseDuration(g.repair, "--repair-time"));
  OB_ASSIGN_OR_RETURN(double recovery, ob::plan::ParseDuration(g.recovery, "--recovery-time"));
  OB_ASSIGN_OR_RETURN(const double takeover, ob::plan::ParseDuration(g.takeover, "--takeover-time"));
  OB_ASSIGN_OR_RETURN(const double restart, ob::plan::ParseDuration(g.restart, "--restart-time"));
  OB_ASSIGN_OR_RETURN(const double ck, ob::plan::ParseDuration(g.checkpoint_cost, "--checkpoint-cost"));
  std::vector<ob::sim::Policy> policies;
  {
    std::stringstream in(g.policies);
    std::string p;
    while (std::getline(in, p, ',')) {
      OB_ASSIGN_OR_RETURN(const ob::sim::Policy policy, ob::sim::ParsePolicy(p));
      if (std::find(policies.begin(), policies.end(), policy) != policies.end()) {
        return ob::Status::Usage("--policy names " + p + " twice");
      }
      policies.push_back(policy);
    }
    if (policies.empty()) return ob::Status::Usage("--policy names no policy");
  }

  ob::pb::Plan proto;
  OB_RETURN_IF_ERROR(ob::io::LoadMessage(g.plan, ob::io::kPlanFormatVersion, &proto));
  auto loaded = ob::plan::FromProto(proto);
  if (!loaded.ok()) return ob::Status::DataErr(ob::io::DisplayName(g.plan) + ": " + loaded.status().message());
  std::vector<std::string> hosts = loaded->hosts;
  const int nodes = loaded->problem.cluster.nodes;
  if (static_cast<int>(hosts.size()) != nodes) {
    hosts.clear();
    for (int n = 0; n < nodes; ++n) hosts.push_back("h" + std::to_string(n));
  }

  if (!g.recovery_logs.empty()) {  // measured recoveries replace --recovery-time
    double sum = 0;
    int count = 0;
    for (const auto& path : g.recovery_logs) {
      OB_ASSIGN_OR_RETURN(const std::string text, ob::io::ReadFile(path));
      OB_ASSIGN_OR_RETURN(const auto rec, ob::sim::RecoveriesFromEvents(text, path));
      sum += rec.mean_s * rec.count;
      count += rec.count;
      OB_LOG(Info) << path << ": " << rec.count << " recoveries, " << rec.mean_s << " s on average";
    }
    recovery = sum / count;
  }

  std::vector<ob::sim::TraceEvent> trace;
  if (!g.trace.empty()) {
    OB_ASSIGN_OR_RETURN(const std::string text, ob::io::ReadFile(g.trace));
    OB_ASSIGN_OR_RETURN(trace, ob::sim::ParseTrace(text, g.trace, hosts));
  } else {
    OB_ASSIGN_OR_RETURN(const double mtbf, ob::plan::ParseDuration(g.node_mtbf, "--node-mtbf"));
    if (!(mtbf > 0)) return ob::Status::Usage("--node-mtbf must be positive");
    // Each node fails about horizon / (MTBF + repair) times: refuse what
    // would not fit in memory rather than die trying.
    const double expected = 2.0 * nodes * horizon / (mtbf + repair);
    if (expected > 5e7) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "--node-mtbf %s over --horizon %s on %d nodes draws about %.3g events (at most 5e7)",
                    g.node_mtbf.c_str(), g.horizon.c_str(), nodes, expected);
      return ob::Status::Usage(buf);
    }
    ob::sim::TraceModel m;
    m.node_mtbf_s = mtbf;
    m.weibull_shape = g.weibull_shape;
    m.repair_s = repair;
    m.horizon_s = horizon;
    m.seed = g.seed;
    auto drawn = ob::sim::GenerateTrace(nodes, m);
    if (!drawn.ok()) {
      return ob::Status::Usage("--node-mtbf " + g.node_mtbf + " --weibull-shape " +
                               ob::io::FormatDouble(g.weibull_shape) + ": " + drawn.status().message());
    }
    trace = std::move(drawn).value();
  }
  int failures = 0;
  for (const auto& e : trace) failures += e.fail && e.t < horizon;

  double interval = 0;
  if (!g.checkpoint_interval.empty()) {
    OB_ASSIGN_OR_RETURN(interval, ob::plan::ParseDuration(g.checkpoint_interval, "--checkpoint-interval"));
    if (!(interval > 0)) return ob::Status::Usage("--checkpoint-interval must be positive");
  } else {  // Young's: sqrt(2 · cost · mean time between the trace's failures)
    interval = failures > 0 ? std::sqrt(2 * std::max(ck, 1e-3) * horizon / failures) : horizon;
  }

  double scale = 1;
  if (!g.iteration_time.empty()) {
    OB_ASSIGN_OR_RETURN(const double measured, ob::plan::ParseDuration(g.iteration_time, "--iteration-time"));
    if (!(measured > 0)) return ob::Status::Usage("--iteration-time must be positive");
    scale = measured / loaded->instantiation.iteration_seconds;
    OB_LOG(Info) << "iteration time " << measured << " s measured, " << loaded->instantiation.iteration_seconds
                 << " s predicted: every instantiation's prediction scaled by " << scale;
  }

  std::vector<ob::sim::SimResult> results;
  for (ob::sim::Policy p : policies) {
    ob::sim::SimOptions o;
    o.policy = p;
    o.horizon_s = horizon;
    o.recovery_s = recovery;
    o.restart_s = restart;
    o.checkpoint_s = ck;
    o.checkpoint_interval_s = interval;
    o.iteration_scale = scale;
    o.standby_master = g.standby_master != "off";
    o.takeover_s = takeover;
    size_t next_report = 0;
    o.progress = [&](size_t done, size_t total) {
      if (total >= 1000 && done >= next_report) {
        OB_LOG(Info) << ob::sim::PolicyName(p) << ": " << done << " of "
                     << total << " events";
        next_report = done + total / 10;
      }
    };
    auto r = ob::sim::Simulate(*loaded, trace, o);
    if (!r.ok()) return r.status().WithContext(ob::io::DisplayName(g.plan));
    results.push_back(std::move(r).value());
  }

  if (!g.svg.empty()) {
    char title[256];
    std::snprintf(title, sizeof title, "%d nodes, %d failures in %.1f days", nodes, failures, horizon / 86400);
    OB_RETURN_IF_ERROR(ob::io::WriteFile(g.svg, ob::sim::TimelineSvg(results, title)));
  }
  std::string text;
  if (common.json) {
    text = Json(results, recovery, interval);
  } else {
    char head[256];
    std::snprintf(head, sizeof head,
                  "%d failures over %.1f days; recovery %.1f s, restart from a checkpoint %.0f s, "
                  "a checkpoint every %.0f s costing %.1f s\n",
                  failures, horizon / 86400, recovery, restart, interval, ck);
    text = head + ob::sim::Report(results);
  }
  return ob::io::WriteFile(common.output, text);
}

void Setup(CLI::App& app) {
  app.add_option("plan", g.plan, "The plan (ob-plan's output; default: stdin)")->option_text("PLAN");
  app.add_option("--trace", g.trace, "Failure trace: lines 'TIME fail|repair HOST'")->option_text("FILE");
  app.add_option("--node-mtbf", g.node_mtbf, "Draw the trace: each node's mean time between failures (e.g. 42d)")
      ->option_text("DURATION");
  app.add_option("--weibull-shape", g.weibull_shape, "Shape of the drawn times between failures (1: exponential)")
      ->capture_default_str();
  app.add_option("--seed", g.seed, "Seed of the drawn trace")->capture_default_str();
  app.add_option("--repair-time", g.repair, "A failed node's time out, for drawn traces (default 1h)")
      ->option_text("DURATION");
  app.add_option("--horizon", g.horizon, "Length of the simulated run (default 30d)")->option_text("DURATION");
  app.add_option("--standby-master", g.standby_master,
                 "on (the default): the master's host (the plan's first) fails like another, its recovery "
                 "--takeover-time longer; off: each of its failures is a restart from a checkpoint")
      ->option_text("on|off")->check(CLI::IsMember({"on", "off"}));
  app.add_option("--takeover-time", g.takeover,
                 "How much longer a recovery of the master's host takes with a standby (default 3s: "
                 "ob-launch's master timeout)")
      ->option_text("DURATION");
  app.add_option("--recovery-time", g.recovery, "An in-place restart or a re-instantiation (default 5s)")
      ->option_text("DURATION");
  app.add_option("--recovery-log", g.recovery_logs,
                 "ob-launch events.log whose 'recovered' lines give the recovery time (mean; repeatable)")
      ->option_text("FILE")
      ->allow_extra_args(false);
  app.add_option("--restart-time", g.restart, "A restart from a checkpoint (default 10m)")->option_text("DURATION");
  app.add_option("--checkpoint-cost", g.checkpoint_cost, "Training time one checkpoint costs (default 5s)")
      ->option_text("DURATION");
  app.add_option("--checkpoint-interval", g.checkpoint_interval,
                 "Time between checkpoints (default: Young's, from the trace's failure rate)")
      ->option_text("DURATION");
  app.add_option("--iteration-time", g.iteration_time,
                 "Measured step time of the plan as made; scales every predicted iteration time")
      ->option_text("DURATION");
  app.add_option("--policy", g.policies,
                 "Policies to compare, comma-separated: ob, checkpoint-restart, oobleck-style (default: all)")
      ->option_text("LIST");
  app.add_option("--svg", g.svg, "Draw useful steps over time, one line per policy")->option_text("FILE");
  app.footer(
      "Examples:\n"
      "  ob-sim --node-mtbf 153d --repair-time 2h --horizon 30d --svg run.svg plan.pb\n"
      "  ob-sim --trace failures.txt --recovery-log run/events.log --json plan.pb\n"
      "--json writes the results as one JSON object.\n"
      "Exit status: 0 ok; 64 usage; 65 bad plan, trace or events.log; 66 missing input; 74 cannot write;\n"
      "78 the plan cannot be instantiated without spares. See ob-sim(1).");
}

}  // namespace

int main(int argc, char** argv) {
  return ob::cli::Main(argc, argv,
                       {"sim", "Replay node failures against a plan through the master's own decisions.", Setup,
                        Run, nullptr,
                        [] {
                          // No plan named: standard input (cli::InputPath).
                          std::vector<ob::cli::NamedFile> reads{{"the plan", g.plan.empty() ? "-" : g.plan},
                                                                {"--trace", g.trace}};
                          for (const std::string& log : g.recovery_logs) reads.push_back({"--recovery-log", log});
                          return reads;
                        },
                        [] { return std::vector<ob::cli::NamedFile>{{"--svg", g.svg}}; }});
}
