// watch_synth: writes a synthetic metrics stream with injected faults
// (lib/ob/watch/synthetic.h) to stdout, for ob-watch's CLI tests, its
// benchmark and the example plot in docs/.
//
//   watch_synth [--steps N] [--seed S] [--pipelines P] [--stages S]
//               [--noise F] [--outliers F] [--memory BYTES]
//               [--slow RANK:FACTOR[:FROM[:UNTIL]]] [--stop RANK:STEP]
//               [--crash RANK:STEP] [--nan STEP[:UNTIL]] [--spike STEP:FACTOR]
//               [--leak RANK:BYTES_PER_STEP[:FROM]] [--slow-job FACTOR:FROM[:UNTIL]]
//
// Fault flags repeat. Ranks are generation-1 ranks; rank r runs on host
// node<r+1>.
#include <unistd.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ob/watch/synthetic.h"

namespace {

std::vector<double> Numbers(const std::string& spec) {
  std::vector<double> v;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ':')) v.push_back(std::stod(item));
  return v;
}

using ob::watch::SyntheticFault;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Write a synthetic ob metrics stream with injected faults.", "watch_synth");
  ob::watch::SyntheticRun run;
  std::vector<std::string> slow, stop, crash, nan, spike, leak, slow_job;
  app.add_option("--steps", run.steps);
  app.add_option("--seed", run.seed);
  app.add_option("--pipelines", run.pipelines);
  app.add_option("--stages", run.stages);
  app.add_option("--layers", run.layers);
  app.add_option("--noise", run.noise);
  app.add_option("--outliers", run.outliers);
  app.add_option("--memory", run.memory_bytes);
  app.add_option("--compute", run.compute_seconds);
  app.add_option("--slow", slow);
  app.add_option("--stop", stop);
  app.add_option("--crash", crash);
  app.add_option("--nan", nan);
  app.add_option("--spike", spike);
  app.add_option("--leak", leak);
  app.add_option("--slow-job", slow_job);
  CLI11_PARSE(app, argc, argv);
  try {
    auto add = [&](SyntheticFault::Kind kind, const std::vector<std::string>& specs, bool has_rank) {
      for (const auto& s : specs) {
        const std::vector<double> v = Numbers(s);
        SyntheticFault f;
        f.kind = kind;
        size_t i = 0;
        if (has_rank) f.rank = static_cast<int>(v.at(i++));
        if (kind == SyntheticFault::kSlow || kind == SyntheticFault::kLeak || kind == SyntheticFault::kSlowJob) {
          f.value = v.at(i++);
          f.step = i < v.size() ? static_cast<uint64_t>(v[i++]) : 0;
        } else {
          f.step = static_cast<uint64_t>(v.at(i++));
          if (kind == SyntheticFault::kSpike) f.value = v.at(i++);
        }
        if (i < v.size()) f.until = static_cast<uint64_t>(v[i++]);
        run.faults.push_back(f);
      }
    };
    add(SyntheticFault::kSlow, slow, true);
    add(SyntheticFault::kStop, stop, true);
    add(SyntheticFault::kCrash, crash, true);
    add(SyntheticFault::kNan, nan, false);
    add(SyntheticFault::kSpike, spike, false);
    add(SyntheticFault::kLeak, leak, true);
    add(SyntheticFault::kSlowJob, slow_job, false);
  } catch (const std::exception&) {
    std::fprintf(stderr, "watch_synth: bad fault specification\n");
    return 64;
  }
  const std::string s = ob::watch::SynthesizeStream(run);
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(STDOUT_FILENO, s.data() + off, s.size() - off);
    if (n <= 0) return 74;
    off += static_cast<size_t>(n);
  }
  return 0;
}
