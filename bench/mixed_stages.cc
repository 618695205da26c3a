// Does a template that mixes stage sizes beat ob's? (issue 14, the fourth
// known error of the cost model: Oobleck's templates may hold stages of
// different GPU counts, e.g. 4- and 8-GPU stages, where every stage of an
// ob template has the same tensor-parallel degree.)
//
// For each shape (model, GPU, nodes, global batch; analytic profiles, 8 GPUs
// a node, f = 1, micro-batches of 1) it plans as ob-plan does, and for every
// template size n in the instantiation, with the most micro-batches m any
// pipeline of that size runs, it finds the best *mixed* template exactly,
// under ob's own cost model (problem.h): stages of any tensor-parallel
// degree the model splits by, packed into the n nodes in any order, each
// node's GPUs all used, a stage never spanning nodes, each stage fitting
// with its 1F1B in-flight micro-batches; a stage sends at the network's
// speed when it is its node's last, else inside the node. Its 1F1B time
// Σw + (m − 1)·max w is compared with the best uniform template's at the
// same m (the same DP, one degree at a time; it reproduces ob-plan's
// template wherever ob-plan's choice is the fastest 1F1B). The step's tail
// (all-reduce, update), which ob-plan weighs too, is left out of all.
//
// The search is ob-plan --mixed-stages' own (plan::SearchMixed, design/plan.md,
// Mixed templates), here without its work limit and with up to 300 bottleneck bounds
// (a "+" after the bounds column: capped there).
//
//   build/bench/ob-mixed-stages [--quick]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ob/model/config.h"
#include "ob/plan/instantiation.h"
#include "ob/plan/problem.h"
#include "ob/plan/templates.h"
#include "ob/profile/analytic.h"
#include "ob/profile/gpus.h"

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The search ob-plan --mixed-stages runs (plan::SearchMixed), unbounded in
// work and with more bounds: the bench also covers gpt3-175b's sizes.
ob::plan::MixedOptions Options(std::vector<int> degrees) {
  ob::plan::MixedOptions o;
  o.degrees = std::move(degrees);
  o.max_work = kInf;
  o.max_bounds = 300;
  return o;
}

double Seconds(const std::optional<ob::plan::MixedResult>& r, int m) {
  return r ? r->t.Seconds(m) : kInf;
}

// "first-last/tp" a stage, " | " between nodes.
std::string Shape(const ob::plan::Template& t) {
  std::string out;
  for (size_t i = 0; i < t.stages.size(); ++i) {
    const auto& s = t.stages[i];
    if (i > 0) out += t.NodeOf(static_cast<int>(i)) != t.NodeOf(static_cast<int>(i) - 1) ? " | " : " ";
    out += std::to_string(s.first) + "-" + std::to_string(s.last) + "/" + std::to_string(s.tp);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  std::printf("# mixed stage sizes against ob's uniform templates, under ob's cost model\n");
  std::printf("# %-10s %-5s %5s %6s %5s %4s %4s %11s %4s %11s %11s %7s %9s %7s %7s %8s\n", "model", "gpu", "nodes",
              "batch", "n", "m", "tp", "ob_ms", "tp", "uniform_ms", "mixed_ms", "gain", "tail_ms", "step", "bounds",
              "dp_s");
  std::printf("# ob_ms: ob-plan's template at m; uniform_ms: the best one-degree template at m (its tp);\n"
              "# mixed_ms: the best mixed one; gain: uniform_ms / mixed_ms - 1; tail_ms: ob's template's step\n"
              "# tail (all-reduce, update); step: the gain with that tail added to both\n");
  const std::vector<std::string> models = quick ? std::vector<std::string>{"gpt3-1.3b"}
                                                 : std::vector<std::string>{"gpt2", "gpt3-1.3b", "gpt3-13b", "gpt3-175b"};
  double worst_gain = 0, worst_ob = 0, worst_step = 0;
  int cases = 0, better = 0;
  for (const std::string& model : models) {
    for (const char* gpu_name : {"h100", "l40s"}) {
      auto cfg = ob::model::Preset(model);
      auto gpu = ob::profile::FindGpu(gpu_name);
      if (!cfg.ok() || !gpu.ok()) return 1;
      ob::profile::AnalyticOptions ao;
      ao.gpu = *gpu;
      auto profile = ob::profile::AnalyticProfile(*cfg, ao);
      if (!profile.ok()) return 1;
      for (int nodes : quick ? std::vector<int>{16} : std::vector<int>{16, 128}) {
        for (int batch : {64, 512, 1536}) {
          ob::plan::Cluster cl;
          cl.nodes = nodes;
          cl.gpus_per_node = 8;
          cl.gpu_memory = profile->device().memory_bytes();
          cl.intra_bytes_per_s = profile->device().allreduce_gbps() * 1e9;
          cl.overhead_bytes = 1ull << 30;
          cl.overhead_fraction = 0.05;
          auto p = ob::plan::MakeProblem(*profile, cl, 1, batch, 1);
          if (!p.ok()) continue;
          auto ts = ob::plan::BuildTemplates(*p);
          if (!ts.ok()) continue;
          auto inst = ob::plan::Instantiate(*p, *ts);
          if (!inst.ok()) continue;
          std::map<int, int> m_of;  // template size -> most micro-batches
          for (const auto& pi : inst->pipelines) m_of[pi.template_nodes] = std::max(m_of[pi.template_nodes], pi.microbatches);
          // The tensor-parallel degrees the model splits by (as ob-plan's).
          std::vector<int> tps;
          for (int t = 1; t <= 8; t *= 2)
            if (cfg->n_head % t == 0 && (4 * cfg->n_embd) % t == 0) tps.push_back(t);
          for (const auto& [n, m] : m_of) {
            const ob::plan::Template* t = ts->ForNodes(n);
            const auto t0 = std::chrono::steady_clock::now();
            const auto mixed = ob::plan::SearchMixed(*p, n, m, Options(tps));
            const double mixed_s = Seconds(mixed, m);
            // The best uniform template at this m, the same search with one
            // degree at a time (ob-plan chose its template for the m it
            // expected, M·n/N, which the instantiation need not give it).
            double uniform_best = kInf;
            int uniform_tp = 0;
            for (int tp : tps) {
              const double one = Seconds(ob::plan::SearchMixed(*p, n, m, Options({tp})), m);
              if (one < uniform_best) uniform_best = one, uniform_tp = tp;
            }
            const double dp_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            const double uniform = t->Seconds(m);
            const double gain = mixed_s < kInf ? uniform_best / mixed_s - 1 : 0;
            // The step with its tail, ob's template's (the all-reduce of the
            // heaviest node's gradient and the update) taken for both.
            const double tail = ob::plan::StepTailSeconds(*p, *t);
            const double step_gain = mixed_s < kInf ? (uniform_best + tail) / (mixed_s + tail) - 1 : 0;
            worst_step = std::max(worst_step, step_gain);
            ++cases;
            if (gain > 1e-9) ++better;
            worst_gain = std::max(worst_gain, gain);
            std::printf("  %-10s %-5s %5d %6d %5d %4d %4d %11.3f %4d %11.3f %11.3f %6.2f%% %9.3f %6.2f%% %6d%s %8.2f\n",
                        model.c_str(), gpu_name, nodes, batch, n, m, t->tp, uniform * 1e3, uniform_tp,
                        uniform_best * 1e3, mixed_s * 1e3, gain * 100, tail * 1e3, step_gain * 100,
                        mixed ? mixed->bounds_tried : 0, mixed && mixed->capped ? "+" : " ", dp_s);
            if (mixed_s > uniform_best * (1 + 1e-12) || uniform_best > uniform * (1 + 1e-12)) {
              std::fprintf(stderr, "mixed > best uniform > ob's template: the DP misses a template it contains\n");
              return 1;
            }
            worst_ob = std::max(worst_ob, uniform / uniform_best - 1);
            if (gain > 0.05) std::printf("    mixed: %s\n", Shape(mixed->t).c_str());
            std::fflush(stdout);
          }
        }
      }
    }
  }
  std::printf("# %d template sizes in use; a mixed template is faster for %d; largest gain %.2f%%; "
              "ob's template at most %.2f%% slower than the best one-degree one at its m (1F1B only; "
              "ob-plan also weighs the step's tail, which differs by degree); largest step gain %.2f%%\n",
              cases, better, worst_gain * 100, worst_ob * 100, worst_step * 100);
  return 0;
}
