// The per-k tables of stage costs the template search runs on, and its
// dynamic programmes over them (see templates_impl.h).
#include <algorithm>

#include "ob/plan/templates_impl.h"

namespace ob::plan::detail {

StageTable MakeTable(const Problem& p, int k, int max_stages) {
  StageTable t;
  const int L = p.num_layers();
  t.k = k;
  t.tp = p.cluster.gpus_per_node / k;
  t.layers = L;
  t.max_stages = max_stages;
  t.modes = p.recompute_modes;
  const size_t cells = static_cast<size_t>(L) * L;
  t.compute.assign(cells, kInf);
  t.cross_link.assign(cells, kInf);
  t.local_link.assign(cells, kInf);
  t.max_in_flight.assign(cells, 0);
  t.mode_compute.assign(t.modes.size(), std::vector<double>(cells, kInf));
  t.mode_in_flight.assign(t.modes.size(), std::vector<int>(cells, 0));
  for (size_t m = 0; m < t.modes.size(); ++m) {
    for (int j = 0; j < L; ++j) {
      // Memory only grows with the range and with the in-flight count, so the
      // largest in-flight count that fits only shrinks as e grows.
      int r = max_stages;
      for (int e = j; e < L; ++e) {
        while (r > 0 && StageMemoryBytes(p, j, e, t.tp, r, t.modes[m]) > p.cluster.gpu_memory) --r;
        const int at = t.At(j, e);
        t.mode_in_flight[m][at] = r;
        t.mode_compute[m][at] = StageComputeSeconds(p, j, e, t.tp, t.modes[m]);
        t.max_in_flight[at] = std::max(t.max_in_flight[at], r);
        t.compute[at] = std::min(t.compute[at], t.mode_compute[m][at]);
      }
    }
  }
  for (int j = 0; j < L; ++j) {
    for (int e = j; e < L; ++e) {
      t.cross_link[t.At(j, e)] = StageBoundarySeconds(p, e, true);
      t.local_link[t.At(j, e)] = StageBoundarySeconds(p, e, false);
    }
  }
  return t;
}

// F[r][j]: the smallest possible max w over partitions of layers [j, L) into r
// stages where the stage i-th from the end holds i micro-batches in flight.
// Because in-flight counts depend only on the position from the end, one
// table serves every S: B*(S) = F[S][0].
std::vector<double> MinimaxFromBack(const StageTable& t) {
  const int L = t.layers, R = t.max_stages;
  std::vector<double> F(static_cast<size_t>(R + 1) * (L + 1), kInf);
  auto f = [&](int r, int j) -> double& { return F[static_cast<size_t>(r) * (L + 1) + j]; };
  f(0, L) = 0;
  for (int r = 1; r <= R; ++r) {
    for (int j = 0; j + r <= L; ++j) {
      double best = kInf;
      for (int e = j; e <= L - r; ++e) {
        const int at = t.At(j, e);
        if (t.max_in_flight[at] < r || t.compute[at] >= best) break;
        const double rest = f(r - 1, e + 1);
        if (rest == kInf) continue;
        best = std::min(best, std::max(t.Seconds(at, r), rest));
      }
      f(r, j) = best;
    }
  }
  return F;
}

// Among partitions into S stages whose every w ≤ bound (and that fit), the
// one with the smallest Σw; the last layer of each stage, or empty if none.
// Ties go to the shortest first stage (strict improvement only).
std::vector<int> MinSumUnderBound(const StageTable& t, int S, double bound) {
  const int L = t.layers;
  std::vector<double> G(static_cast<size_t>(S + 1) * (L + 1), kInf);
  std::vector<int> arg(G.size(), -1);
  auto idx = [&](int r, int j) { return static_cast<size_t>(r) * (L + 1) + j; };
  G[idx(0, L)] = 0;
  for (int r = 1; r <= S; ++r) {
    // The S − r stages before must cover [0, j), one layer at least each.
    for (int j = S - r; j + r <= L; ++j) {
      double best = kInf;
      int best_e = -1;
      for (int e = j; e <= L - r; ++e) {
        const int at = t.At(j, e);
        if (t.max_in_flight[at] < r || t.compute[at] > bound) break;
        const double w = t.Seconds(at, r);
        if (w > bound) continue;
        const double rest = G[idx(r - 1, e + 1)];
        if (rest == kInf) continue;
        const double v = w + rest;
        if (v < best) best = v, best_e = e;
      }
      G[idx(r, j)] = best;
      arg[idx(r, j)] = best_e;
    }
  }
  if (G[idx(S, 0)] == kInf) return {};
  std::vector<int> lasts;
  for (int r = S, j = 0; r > 0; --r) {
    const int e = arg[idx(r, j)];
    lasts.push_back(e);
    j = e + 1;
  }
  return lasts;
}

// The k that divide g and leave a tensor-parallel degree t = g/k the model
// can be split by (t divides the heads and the MLP width: the runtime's
// rule, runtime/topology.h CheckRunnable); k = g (t = 1) always.
std::vector<int> StagesPerNodeChoices(const Problem& p) {
  std::vector<int> ks;
  for (int k = 1; k <= p.cluster.gpus_per_node; ++k) {
    if (p.cluster.gpus_per_node % k != 0) continue;
    const int tp = p.cluster.gpus_per_node / k;
    const bool forced = std::any_of(p.tp_at.begin(), p.tp_at.end(), [&](const auto& a) { return a.second == tp; });
    if (p.tp > 0 && tp != p.tp && !forced) continue;
    if (tp > 1 && !p.TpDivides(tp)) continue;
    ks.push_back(k);
  }
  return ks;
}

}  // namespace ob::plan::detail
