#include "ob/watch/synthetic.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "ob/io/records.h"

namespace ob::watch {
namespace {

constexpr double kHeartbeatSeconds = 0.5;
constexpr double kStopTailSeconds = 10;
constexpr double kRecoverySeconds = 1.5;
constexpr double kExitDelaySeconds = 0.3;

class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  double Uniform() { return static_cast<double>(g_() >> 11) * 0x1.0p-53; }  // [0, 1)
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  double Normal() {  // Box–Muller
    const double u = std::max(Uniform(), 1e-300), v = Uniform();
    return std::sqrt(-2 * std::log(u)) * std::cos(2 * M_PI * v);
  }

 private:
  std::mt19937_64 g_;
};

struct Rank {
  int original;   // rank in generation 1 (names the host)
  int pipeline, stage;
  uint32_t first_layer, last_layer;
  double last_beat_s = 0;
  uint64_t last_step = 0;
};

std::vector<Rank> Layout(const SyntheticRun& run, const std::vector<int>& pipelines) {
  std::vector<Rank> ranks;
  int p_index = 0;
  for (int p : pipelines) {
    for (int s = 0; s < run.stages; ++s) {
      const int per = std::max(1, run.layers / run.stages);
      const uint32_t first = static_cast<uint32_t>(s * per);
      const uint32_t last = s == run.stages - 1 ? static_cast<uint32_t>(run.layers - 1)
                                                : static_cast<uint32_t>((s + 1) * per - 1);
      ranks.push_back({p * run.stages + s, p_index, s, first, last});
    }
    ++p_index;
  }
  return ranks;
}

bool Active(const SyntheticFault& f, uint64_t step) { return step >= f.step && step < f.until; }

}  // namespace

std::string SyntheticHost(int rank) { return "node" + std::to_string(rank + 1); }

std::vector<pb::Metrics> Synthesize(const SyntheticRun& run) {
  Rng rng(run.seed);
  std::vector<pb::Metrics> out;
  std::vector<int> pipelines;
  for (int p = 0; p < run.pipelines; ++p) pipelines.push_back(p);
  std::vector<Rank> ranks = Layout(run, pipelines);
  uint64_t generation = 1;
  double t = 0;  // seconds since start
  std::vector<double> memory(static_cast<size_t>(run.pipelines * run.stages), 0);
  for (size_t i = 0; i < memory.size(); ++i)
    memory[i] = static_cast<double>(run.memory_bytes) * (1 + 0.02 * static_cast<double>(i));

  auto base = [&](const Rank& r, double at) {
    pb::Metrics m;
    m.set_format_version(1);
    m.set_host(SyntheticHost(r.original));
    m.set_rank(static_cast<uint32_t>(&r - ranks.data()));
    m.set_pipeline(static_cast<uint32_t>(r.pipeline));
    m.set_stage(static_cast<uint32_t>(r.stage));
    m.set_generation(generation);
    m.set_unix_ms(run.start_unix_ms + static_cast<int64_t>(std::llround(at * 1000)));
    return m;
  };
  // Heartbeats of every rank in (from, to], at its own phase.
  auto beats = [&](double to, const Rank* skip) {
    for (auto& r : ranks) {
      if (&r == skip) continue;
      while (r.last_beat_s + kHeartbeatSeconds <= to) {
        r.last_beat_s += kHeartbeatSeconds;
        pb::Metrics m = base(r, r.last_beat_s);
        m.set_heartbeat(true);
        m.set_step(r.last_step);
        out.push_back(std::move(m));
      }
    }
  };
  for (size_t i = 0; i < ranks.size(); ++i) ranks[i].last_beat_s = -0.05 * static_cast<double>(i);

  for (uint64_t step = 0; step < run.steps; ++step) {
    // Faults that strike before this step.
    bool stopped = false;
    for (const auto& f : run.faults) {
      if (f.step != step) continue;
      const auto it = std::find_if(ranks.begin(), ranks.end(), [&](const Rank& r) { return r.original == f.rank; });
      if (f.kind == SyntheticFault::kStop && it != ranks.end()) {
        beats(t, nullptr);
        beats(t + kStopTailSeconds, &*it);
        stopped = true;
      }
      if (f.kind == SyntheticFault::kCrash && it != ranks.end()) {
        pb::Metrics x = base(*it, t + kExitDelaySeconds);
        x.set_step(it->last_step);
        x.mutable_exit()->set_exit_status(-1);
        x.mutable_exit()->set_signal(9);
        x.mutable_exit()->set_description("killed by signal 9");
        beats(t + kExitDelaySeconds, &*it);
        out.push_back(std::move(x));
        beats(t + kRecoverySeconds, &*it);
        pipelines.erase(std::find(pipelines.begin(), pipelines.end(), it->original / run.stages));
        const uint64_t last = it->last_step;
        ranks = Layout(run, pipelines);
        for (size_t i = 0; i < ranks.size(); ++i) {
          ranks[i].last_beat_s = t + kRecoverySeconds - kHeartbeatSeconds + 0.01 * static_cast<double>(i);
          ranks[i].last_step = last;
        }
        ++generation;
        t += kRecoverySeconds;
      }
    }
    if (stopped || ranks.empty()) break;

    double slowest = 0;
    std::vector<double> compute(ranks.size());
    for (size_t i = 0; i < ranks.size(); ++i) {
      double c = run.compute_seconds * (1 + rng.Uniform(-run.noise, run.noise));
      if (rng.Uniform() < run.outliers) c *= rng.Uniform(1.5, 2.5);
      for (const auto& f : run.faults) {
        if (f.kind == SyntheticFault::kSlow && f.rank == ranks[i].original && Active(f, step)) c *= f.value;
        if (f.kind == SyntheticFault::kSlowJob && Active(f, step)) c *= f.value;
      }
      compute[i] = c;
      slowest = std::max(slowest, c);
    }
    const double step_seconds = 1.25 * slowest + 0.02;
    double loss = 4.0 * std::exp(-static_cast<double>(step) / 300.0) + 1.5 + 0.01 * rng.Normal();
    for (const auto& f : run.faults) {
      if (f.kind == SyntheticFault::kNan && Active(f, step)) loss = std::nan("");
      if (f.kind == SyntheticFault::kSpike && f.step == step) loss *= f.value;
    }
    const double end = t + step_seconds;
    beats(end, nullptr);
    for (size_t i = 0; i < ranks.size(); ++i) {
      Rank& r = ranks[i];
      const size_t orig = static_cast<size_t>(r.original);
      for (const auto& f : run.faults)
        if (f.kind == SyntheticFault::kLeak && f.rank == r.original && step >= f.step) memory[orig] += f.value;
      pb::Metrics m = base(r, end + 0.001 * static_cast<double>(i) + rng.Uniform(0, 0.003));
      const double st = step_seconds * (1 + rng.Uniform(-0.002, 0.002));
      m.set_step(step);
      m.set_step_seconds(st);
      m.set_forward_seconds(compute[i] / 3);
      m.set_backward_seconds(compute[i] * 2 / 3);
      m.set_communication_seconds(std::max(0.0, st - compute[i]));
      m.set_loss(loss);
      m.set_grad_norm(1.0 + 0.1 * rng.Uniform());
      m.set_tokens_per_second(run.tokens_per_step / st);
      m.set_memory_bytes(run.memory_bytes == 0 ? 0 : static_cast<uint64_t>(memory[orig] * (1 + rng.Uniform(-5e-4, 5e-4))));
      m.set_first_layer(r.first_layer);
      m.set_last_layer(r.last_layer);
      m.set_num_microbatches(static_cast<uint32_t>(run.microbatches));
      r.last_step = step;
      out.push_back(std::move(m));
    }
    t = end;
  }
  std::stable_sort(out.begin(), out.end(), [](const pb::Metrics& a, const pb::Metrics& b) {
    return a.unix_ms() != b.unix_ms() ? a.unix_ms() < b.unix_ms() : a.rank() < b.rank();
  });
  return out;
}

std::string SynthesizeStream(const SyntheticRun& run) {
  std::string s;
  for (const auto& m : Synthesize(run)) io::AppendRecord(m, &s);
  return s;
}

}  // namespace ob::watch
