// ob-watch: detect anomalies in training metrics and act on them.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>

#include "ob/cli/cli.h"
#include "ob/io/file.h"
#include "ob/watch/session.h"

namespace {

ob::watch::SessionOptions g;

ob::Status Check() {
  const auto& d = g.detectors;
  // Every figure finite: an "inf" or "nan" timeout would never fire, or fire at once.
  auto positive = [](double v, const char* flag) {
    return v > 0 && std::isfinite(v) ? ob::Status::Ok()
                                     : ob::Status::Usage(std::string(flag) + " must be a positive, finite number");
  };
  auto non_negative = [](double v) { return v >= 0 && std::isfinite(v); };
  OB_RETURN_IF_ERROR(positive(d.hang_timeout_s, "--hang-timeout"));
  if (!(d.straggler_ratio > 1 && std::isfinite(d.straggler_ratio)))
    return ob::Status::Usage("--straggler-ratio must be above 1");
  OB_RETURN_IF_ERROR(positive(d.spike_z, "--spike-z"));
  OB_RETURN_IF_ERROR(positive(d.memory_growth, "--memory-growth"));
  if (!non_negative(d.stall_timeout_s) || !non_negative(d.recovery_grace_s) || d.warmup_steps < 0 ||
      !non_negative(g.actions.cooldown_s))
    return ob::Status::Usage(
        "--stall-timeout, --recovery-grace, --warmup-steps and --cooldown must be finite, not negative");
  if (d.straggler_window < 1 || d.straggler_votes < 1 || d.straggler_votes > d.straggler_window)
    return ob::Status::Usage("--straggler-votes must be between 1 and --straggler-window");
  if (!(d.throughput_drop > 0 && d.throughput_drop < 1))
    return ob::Status::Usage("--throughput-drop must be between 0 and 1");
  if (d.loss_window < 5 || d.throughput_window < 10 || d.memory_window < 10)
    return ob::Status::Usage("--loss-window must be at least 5, --throughput-window and --memory-window at least 10");
  if (g.actions.confirm < 1) return ob::Status::Usage("--confirm must be at least 1");
  if (!g.clock.empty() && g.clock != "wall" && g.clock != "stream")
    return ob::Status::Usage("--clock must be 'wall' or 'stream'");
  if (g.dry_run && !g.act) return ob::Status::Usage("--dry-run goes with --act");
  if (!g.records.empty() && g.records != "json" && g.records != "csv")
    return ob::Status::Usage("--records must be 'json' or 'csv'");
  if (!g.records.empty() && (g.act || !g.plot.empty() || !g.metrics_addr.empty()))
    return ob::Status::Usage("--records writes the records only: not with --act, --plot or --metrics-addr");
  if (g.act && !g.dry_run && g.attach_dir.empty() && g.control.empty())
    return ob::Status::Usage("--act needs the master's control socket: --attach RUN_DIR or --control SOCKET");
  return ob::Status::Ok();
}

ob::Status Run(const ob::cli::CommonOptions& common) {
  OB_RETURN_IF_ERROR(Check());
  if (!g.attach_dir.empty()) {
    if (!g.input.empty())
      return ob::Status::Usage("give a metrics FILE or --attach RUN_DIR, not both");
  } else {
    OB_ASSIGN_OR_RETURN(g.input, ob::cli::InputPath(g.input, "metrics"));
    // A file of metrics is a record of the past: acted on, its events
    // would exclude hosts of the run as it is now, or roll it back (a
    // replayed NaN of step 60 rolled a run at step 194 back to its last
    // checkpoint). A live stream is a pipe (ob-launch --metrics -) or --attach.
    struct stat st {};
    if (g.act && !g.dry_run &&
        (g.input == "-" ? ::fstat(STDIN_FILENO, &st) : ::stat(g.input.c_str(), &st)) == 0 && S_ISREG(st.st_mode)) {
      return ob::Status::Usage("--act acts on a live run, and " + ob::io::DisplayName(g.input) +
                               " is a file, a record of the past: its events would act on the run as it is now "
                               "(--attach RUN_DIR, or pipe ob-launch --metrics - in; --dry-run replays a file)");
    }
  }
  g.output = common.output;
  g.json = common.json;
  g.terminal = ob::io::StdoutIsTerminal();
  return ob::watch::RunSession(g);
}

void Setup(CLI::App& app) {
  app.footer(
      "Detectors (defaults): crash (an exit with an error); hang (a rank silent 3 s; no step\n"
      "anywhere for the stall timeout); straggler (compute 1.3x its replicas' in 5 of 8 steps,\n"
      "and against the job's own baseline while it holds the job up);\n"
      "loss NaN/Inf; loss spike (robust z >= 6); throughput drop (30% below the median);\n"
      "memory growth (10% rising steadily over 100 steps). See ob-watch(1).\n\n"
      "Examples:\n"
      "  ob-watch metrics.pb                       # summary on a terminal\n"
      "  ob-watch --json metrics.pb > events.jsonl\n"
      "  ob-watch --records csv metrics.pb > steps.csv   # pandas.read_csv(\"steps.csv\")\n"
      "  ob-watch --attach run/ --act --metrics-addr 127.0.0.1:9100\n"
      "  ob-watch --plot run.svg metrics.pb");
  app.add_option("file", g.input, "A metrics stream from ob-launch (default: stdin)")->option_text("FILE");
  app.add_option("--attach", g.attach_dir, "Stream from the master running in RUN_DIR (RUN_DIR/control.sock)")
      ->option_text("RUN_DIR");
  app.add_option("--records", g.records,
                 "Write every metrics record, every field, as JSON lines or CSV (with a header), "
                 "instead of events; no detector runs")
      ->option_text("json|csv");
  app.add_flag("--act", g.act, "Ask the master to exclude, checkpoint or roll back on confirmed events");
  app.add_flag("--dry-run", g.dry_run, "With --act: decide and record actions, send nothing");
  app.add_option("--control", g.control, "The master's control socket for --act (default: RUN_DIR/control.sock)")
      ->option_text("SOCKET");
  app.add_option("--confirm", g.actions.confirm,
                 "Straggler events (or crash generations) of a host before excluding it")
      ->capture_default_str();
  app.add_option("--cooldown", g.actions.cooldown_s, "Seconds between two actions on one host (or the job)")
      ->capture_default_str();
  app.add_option("--clock", g.clock, "'stream' (records' unix_ms) or 'wall' (default: wall when attached)")
      ->option_text("wall|stream");
  app.add_option("--hang-timeout", g.detectors.hang_timeout_s, "Seconds a rank may be silent")
      ->capture_default_str();
  app.add_option("--stall-timeout", g.detectors.stall_timeout_s,
                 "Seconds with no step anywhere (0: max(4 x hang timeout, 5 x median step))")
      ->capture_default_str();
  app.add_option("--recovery-grace", g.detectors.recovery_grace_s,
                 "Seconds of expected silence after a worker crashes")
      ->capture_default_str();
  app.add_option("--warmup-steps", g.detectors.warmup_steps, "Steps of each generation the timing detectors skip")
      ->capture_default_str();
  app.add_option("--straggler-ratio", g.detectors.straggler_ratio, "Compute over the reference that votes slow")
      ->capture_default_str();
  app.add_option("--straggler-window", g.detectors.straggler_window, "Steps in the straggler vote")
      ->capture_default_str();
  app.add_option("--straggler-votes", g.detectors.straggler_votes, "Slow steps in the window that confirm")
      ->capture_default_str();
  app.add_option("--spike-z", g.detectors.spike_z, "Robust z-score of a loss spike")->capture_default_str();
  app.add_option("--loss-window", g.detectors.loss_window, "Steps of loss history for spikes")
      ->capture_default_str();
  app.add_option("--throughput-drop", g.detectors.throughput_drop, "Fraction below the median that is a drop")
      ->capture_default_str();
  app.add_option("--throughput-window", g.detectors.throughput_window, "Steps of throughput history")
      ->capture_default_str();
  app.add_option("--memory-growth", g.detectors.memory_growth, "Fractional steady growth that is reported")
      ->capture_default_str();
  app.add_option("--memory-window", g.detectors.memory_window, "Steps of memory history per rank")
      ->capture_default_str();
  app.add_option("--metrics-addr", g.metrics_addr, "Serve Prometheus text at http://HOST:PORT/metrics")
      ->option_text("HOST:PORT");
  app.add_option("--plot", g.plot, "Draw step and compute time per rank, and the events, as SVG")
      ->option_text("FILE");
}

}  // namespace

int main(int argc, char** argv) {
  return ob::cli::Main(argc, argv,
                       {"watch", "Detect anomalies in training metrics and act on them.", Setup, Run, nullptr,
                        [] { return std::vector<ob::cli::NamedFile>{{"the metrics", g.input}}; },
                        [] { return std::vector<ob::cli::NamedFile>{{"--plot", g.plot}}; }});
}
