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
// Exact: for a bound B, a DP over (first layer, stages so far from the
// back, GPUs used) gives the least Σw with every w ≤ B; the best time is
// the least Σw(B) + (m − 1)·B over the w values B can take, scanned upward
// from the least feasible bottleneck until (m − 1)·B alone exceeds the best.
//
//   build/bench/ob-mixed-stages [--quick]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ob/model/config.h"
#include "ob/plan/instantiation.h"
#include "ob/plan/problem.h"
#include "ob/plan/templates.h"
#include "ob/profile/analytic.h"
#include "ob/profile/gpus.h"

namespace {

using ob::plan::Problem;
constexpr double kInf = std::numeric_limits<double>::infinity();

// Stage costs for every (first, last, tp, crosses node) and the largest
// in-flight count each fits with.
struct Costs {
  int L = 0, g = 8;
  std::vector<int> tps;
  // [ti][j * L + e]
  std::vector<std::vector<double>> compute, cross, local;
  std::vector<std::vector<int>> max_in_flight;
  int At(int j, int e) const { return j * L + e; }
};

Costs MakeCosts(const Problem& p, const std::vector<int>& tps, int max_stages) {
  Costs c;
  c.L = p.num_layers();
  c.g = p.cluster.gpus_per_node;
  c.tps = tps;
  const size_t n = static_cast<size_t>(c.L) * c.L;
  for (int t : tps) {
    std::vector<double> comp(n, kInf), cr(n, kInf), lo(n, kInf);
    std::vector<int> fit(n, 0);
    for (int j = 0; j < c.L; ++j) {
      int r = max_stages;
      for (int e = j; e < c.L; ++e) {
        while (r > 0 && !ob::plan::StageFits(p, j, e, t, r)) --r;
        const int at = c.At(j, e);
        fit[at] = r;
        comp[at] = ob::plan::StageComputeSeconds(p, j, e, t);
        cr[at] = comp[at] + ob::plan::StageBoundarySeconds(p, e, true);
        lo[at] = comp[at] + ob::plan::StageBoundarySeconds(p, e, false);
      }
    }
    c.compute.push_back(std::move(comp));
    c.cross.push_back(std::move(cr));
    c.local.push_back(std::move(lo));
    c.max_in_flight.push_back(std::move(fit));
  }
  return c;
}

// Over mixed templates of `nodes` nodes whose every w <= bound: mode 0,
// the least max w; mode 1, the least Σw. kInf: none.
// State, built from the back: layers [j, L) covered by r stages using G
// GPUs (G mod g of them in the node being filled, front-most).
// `shape`, when given: the best template's stages, front to back, as
// "first-last/tp" with " | " between nodes.
double MixedDp(const Costs& c, int nodes, int max_stages, int mode, double bound, std::string* shape = nullptr) {
  const int L = c.L, g = c.g, GN = nodes * g, R = max_stages;
  auto idx = [&](int j, int r, int G) { return (static_cast<size_t>(j) * (R + 1) + r) * (GN + 1) + G; };
  std::vector<double> v(static_cast<size_t>(L + 1) * (R + 1) * (GN + 1), kInf);
  std::vector<size_t> from(shape ? v.size() : 0, 0);
  std::vector<int> tp_of(shape ? v.size() : 0, 0);
  v[idx(L, 0, 0)] = 0;
  for (int j = L; j > 0; --j) {
    for (int r = 0; r < R; ++r) {
      for (int G = 0; G < GN; ++G) {
        const double cur = v[idx(j, r, G)];
        if (cur == kInf) continue;
        const int x = G % g;
        // The first stage put in a node (from the back) is its last: it
        // sends to the next node, unless it ends the pipeline.
        const bool crossing = x == 0 && j != L;
        for (size_t ti = 0; ti < c.tps.size(); ++ti) {
          const int t = c.tps[ti];
          if (x + t > g) continue;
          const auto& w_of = crossing ? c.cross[ti] : c.local[ti];
          for (int s = j - 1; s >= 0; --s) {  // the stage is [s, j - 1]
            const int at = c.At(s, j - 1);
            if (c.max_in_flight[ti][at] < r + 1) break;  // longer only needs more
            // Compute grows with the range, and w >= compute: past the
            // bound, no longer stage can be in a partition under it.
            if (c.compute[ti][at] > bound) break;
            const double w = w_of[at];
            if (w > bound) continue;
            const size_t to = idx(s, r + 1, G + t);
            const double nv = mode == 0 ? std::max(cur, w) : cur + w;
            if (nv < v[to]) {
              v[to] = nv;
              if (shape) from[to] = idx(j, r, G), tp_of[to] = t;
            }
          }
        }
      }
    }
  }
  double best = kInf;
  size_t at = 0;
  for (int r = 1; r <= R; ++r)
    if (v[idx(0, r, GN)] < best) best = v[idx(0, r, GN)], at = idx(0, r, GN);
  if (shape && best < kInf) {
    shape->clear();
    const size_t per_j = static_cast<size_t>(R + 1) * (GN + 1);
    for (size_t cur = at; cur != idx(L, 0, 0); cur = from[cur]) {
      const int first = static_cast<int>(cur / per_j), last = static_cast<int>(from[cur] / per_j) - 1;
      const int used = static_cast<int>(cur % (GN + 1));  // GPUs used from this stage to the back
      const bool node_start = used % g == 0;  // this stage opens its node (front)
      if (!shape->empty()) *shape += node_start ? " | " : " ";
      *shape += std::to_string(first) + "-" + std::to_string(last) + "/" + std::to_string(tp_of[cur]);
    }
  }
  return best;
}

struct Mixed {
  double seconds = kInf;  // best Σw + (m − 1)·max w
  std::string shape;      // its stages (MixedDp)
  double bottleneck = 0;
  int bounds_tried = 0;
  bool capped = false;  // stopped at kMaxBounds: `seconds` is then only an upper bound
};

constexpr int kMaxBounds = 300;

// `uniform_bottleneck`: the uniform template's, which a mixed one (a
// superset) never exceeds; it bounds the first DP.
Mixed BestMixed(const Costs& c, int nodes, int m, int max_stages, double uniform_bottleneck) {
  Mixed out;
  const double b_star = MixedDp(c, nodes, max_stages, 0, uniform_bottleneck);
  if (b_star == kInf) return out;
  if (m <= 1) {
    out.seconds = MixedDp(c, nodes, max_stages, 1, kInf, &out.shape);
    out.bottleneck = b_star;
    out.bounds_tried = 1;
    return out;
  }
  // Every w value at or above B*, in order.
  std::set<double> ws;
  for (size_t ti = 0; ti < c.tps.size(); ++ti)
    for (const auto* arr : {&c.cross[ti], &c.local[ti]})
      for (double w : *arr)
        if (w >= b_star && w < kInf) ws.insert(w);
  const double sum_floor = MixedDp(c, nodes, max_stages, 1, kInf);  // Σw at any bound
  for (double b : ws) {
    if (sum_floor + (m - 1) * b >= out.seconds) break;
    if (out.bounds_tried >= kMaxBounds) {
      out.capped = true;
      break;
    }
    std::string shape;
    const double sum = MixedDp(c, nodes, max_stages, 1, b, &shape);
    ++out.bounds_tried;
    if (sum == kInf) continue;
    const double e = sum + (m - 1) * b;
    if (e < out.seconds) out.seconds = e, out.bottleneck = b, out.shape = shape;
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
            const int max_stages = std::min(p->num_layers(), n * 8);
            const auto t0 = std::chrono::steady_clock::now();
            const Costs costs = MakeCosts(*p, tps, max_stages);
            const Mixed mixed = BestMixed(costs, n, m, max_stages, t->bottleneck);
            // The best uniform template at this m, the same DP with one
            // degree at a time (ob-plan chose its template for the m it
            // expected, M·n/N, which the instantiation need not give it).
            double uniform_best = kInf;
            int uniform_tp = 0;
            for (int tp : tps) {
              const Mixed one = BestMixed(MakeCosts(*p, {tp}, max_stages), n, m, max_stages, kInf);
              if (one.seconds < uniform_best) uniform_best = one.seconds, uniform_tp = tp;
            }
            const double dp_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            const double uniform = t->Seconds(m);
            const double gain = mixed.seconds < kInf ? uniform_best / mixed.seconds - 1 : 0;
            // The step with its tail, ob's template's (the all-reduce of the
            // heaviest node's gradient and the update) taken for both.
            const double tail = ob::plan::StepTailSeconds(*p, *t);
            const double step_gain = mixed.seconds < kInf ? (uniform_best + tail) / (mixed.seconds + tail) - 1 : 0;
            worst_step = std::max(worst_step, step_gain);
            ++cases;
            if (gain > 1e-9) ++better;
            worst_gain = std::max(worst_gain, gain);
            std::printf("  %-10s %-5s %5d %6d %5d %4d %4d %11.3f %4d %11.3f %11.3f %6.2f%% %9.3f %6.2f%% %6d%s %8.2f\n",
                        model.c_str(), gpu_name, nodes, batch, n, m, t->tp, uniform * 1e3, uniform_tp,
                        uniform_best * 1e3, mixed.seconds * 1e3, gain * 100, tail * 1e3, step_gain * 100,
                        mixed.bounds_tried, mixed.capped ? "+" : " ", dp_s);
            if (mixed.seconds > uniform_best * (1 + 1e-12) || uniform_best > uniform * (1 + 1e-12)) {
              std::fprintf(stderr, "mixed > best uniform > ob's template: the DP misses a template it contains\n");
              return 1;
            }
            worst_ob = std::max(worst_ob, uniform / uniform_best - 1);
            if (gain > 0.05) std::printf("    mixed: %s\n", mixed.shape.c_str());
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
