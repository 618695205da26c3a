// ob-watch-accuracy: precision and recall of the straggler detector on
// synthetic runs (lib/ob/watch/synthetic.h) with one rank slowed by a known
// factor from a random step, and its false alarms on clean runs, per noise
// level and slowdown. A detection is a (run, rank) pair the detector
// flagged; it is right when that rank was slowed and the event came at or
// after the onset. Recall counts slowed runs flagged on the right rank
// within 20 steps (the target in docs/benchmarks.md). Every figure comes from this run's own
// streams; the seeds make it repeatable.
//
//   ob-watch-accuracy [--runs N] [--steps S] [--seed X]
//
// For runs of the real trainer (ob-launch --inject RANK:slow=F) see
// bench/watch_accuracy.sh --real.
#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <vector>

#include <CLI/CLI.hpp>

#include "ob/watch/synthetic.h"
#include "ob/watch/watcher.h"

namespace {

using ob::watch::SyntheticFault;
using ob::watch::SyntheticRun;

constexpr uint64_t kDeadlineSteps = 20;  // the target: a 1.5x straggler within 20 steps

struct Row {
  int runs = 0, detected = 0, in_time = 0;
  int right = 0, wrong = 0;   // detections
  std::vector<double> latency;
  uint64_t rank_steps = 0;    // of the clean runs
  int clean_alarms = 0;
};

std::vector<ob::pb::Event> Stragglers(const SyntheticRun& run) {
  ob::watch::Watcher w({}, ob::watch::Clock::kStream);
  std::vector<ob::pb::Event> events, out;
  for (const auto& m : ob::watch::Synthesize(run)) w.Feed(m, 0, &events);
  w.Finish(&events);
  for (const auto& e : events)
    if (e.kind() == ob::pb::EVENT_STRAGGLER) out.push_back(e);
  return out;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Precision and recall of ob-watch's straggler detector on synthetic runs.",
               "ob-watch-accuracy");
  int runs = 40;
  uint64_t steps = 200, seed = 1;
  app.add_option("--runs", runs, "Slowed runs (and as many clean ones) per row")->capture_default_str();
  app.add_option("--steps", steps, "Steps per run")->capture_default_str();
  app.add_option("--seed", seed, "First seed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::printf("# ob-watch straggler accuracy: synthetic 2x2 pipelines (4 ranks), %llu steps a run,\n"
              "# %d slowed runs (random rank, onset at step 20-80) and %d clean runs per row;\n"
              "# detector defaults (ratio 1.3, 5 of 8 votes, 3 warm-up steps).\n",
              static_cast<unsigned long long>(steps), runs, runs);
  std::printf("#%7s %6s %6s %9s %7s %9s %8s %8s %10s\n", "noise", "slow", "runs", "precision",
              "recall", "recall20", "lat_p50", "lat_max", "clean_fa");
  std::printf("#%7s %6s %6s %9s %7s %9s %8s %8s %10s\n", "(+/-)", "(x)", "", "", "", "", "(steps)",
              "(steps)", "(/1e4 r-s)");
  int total_right = 0, total_wrong = 0, total_runs = 0, total_in_time = 0, total_clean = 0;
  for (double noise : {0.05, 0.10, 0.20}) {
    for (double slow : {1.3, 1.5, 2.0}) {
      Row row;
      std::mt19937_64 pick(seed * 1000003 + static_cast<uint64_t>(noise * 1000) * 31 +
                           static_cast<uint64_t>(slow * 100));
      for (int i = 0; i < runs; ++i) {
        SyntheticRun run;
        run.steps = steps;
        run.noise = noise;
        run.seed = pick();
        SyntheticFault f;
        f.kind = SyntheticFault::kSlow;
        f.rank = static_cast<int>(pick() % 4);
        f.step = 20 + pick() % 61;
        f.value = slow;
        run.faults.push_back(f);
        ++row.runs;
        std::set<int> flagged;
        bool found = false;
        for (const auto& e : Stragglers(run)) {
          if (flagged.insert(e.rank()).second) {
            const bool right = e.rank() == f.rank && e.step() >= f.step;
            right ? ++row.right : ++row.wrong;
          }
          if (!found && e.rank() == f.rank && e.step() >= f.step) {
            found = true;
            ++row.detected;
            const uint64_t latency = e.step() - f.step;
            row.latency.push_back(static_cast<double>(latency));
            if (latency < kDeadlineSteps) ++row.in_time;
          }
        }
        SyntheticRun clean;
        clean.steps = steps;
        clean.noise = noise;
        clean.seed = pick();
        row.rank_steps += steps * 4;
        row.clean_alarms += static_cast<int>(Stragglers(clean).size());
      }
      const double precision =
          row.right + row.wrong + row.clean_alarms > 0
              ? static_cast<double>(row.right) / (row.right + row.wrong + row.clean_alarms) : 1.0;
      std::printf(" %7.2f %6.1f %6d %9.3f %7.3f %9.3f %8.0f %8.0f %10.2f\n", noise, slow, row.runs,
                  precision, static_cast<double>(row.detected) / row.runs,
                  static_cast<double>(row.in_time) / row.runs, Percentile(row.latency, 0.5),
                  Percentile(row.latency, 1.0),
                  1e4 * row.clean_alarms / static_cast<double>(row.rank_steps));
      if (slow == 1.5 && noise <= 0.10) {
        total_right += row.right;
        total_wrong += row.wrong + row.clean_alarms;
        total_runs += row.runs;
        total_in_time += row.in_time;
        total_clean += row.clean_alarms;
      }
    }
  }
  std::printf("# at the SPEC's point (1.5x, noise <= 10%%): precision %.3f, recall within %llu steps "
              "%.3f over %d runs, %d false alarms in %d clean runs of %llu steps\n",
              total_right + total_wrong > 0 ? static_cast<double>(total_right) / (total_right + total_wrong) : 1.0,
              static_cast<unsigned long long>(kDeadlineSteps),
              total_runs ? static_cast<double>(total_in_time) / total_runs : 0, total_runs, total_clean,
              total_runs, static_cast<unsigned long long>(steps));
  return 0;
}
