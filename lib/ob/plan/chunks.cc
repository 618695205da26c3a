// Chunked templates (design/schedule.md, Chunks): a template whose stages
// were cut for 1F1B, cut again into V = S·v slices for a schedule with v
// chunks a stage (interleaved, zb-v), timed by that schedule's orders and
// sized by their peaks. ChooseSchedule (schedule.cc) weighs it beside the
// single-chunk schedules.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "ob/plan/schedule.h"
#include "ob/plan/templates_impl.h"
#include "ob/schedule/timing.h"

namespace ob::plan::detail {
namespace {

// The last layer of each of V slices of [0, L) of about equal compute at
// degree tp, each at least one layer: slice k ends where the running sum
// comes closest to (k + 1)/V of the whole.
std::vector<int> EqualSlices(const Problem& p, int V, int tp) {
  const int L = p.num_layers();
  std::vector<double> prefix(static_cast<size_t>(L) + 1, 0.0);
  for (int l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + StageComputeSeconds(p, l, l, tp);
  std::vector<int> lasts;
  int prev = -1;
  for (int k = 0; k + 1 < V; ++k) {
    const double target = prefix[L] * (k + 1) / V;
    const int lo = prev + 1, hi = L - 1 - (V - 1 - k);  // leave a layer for every later slice
    int best = lo;
    for (int e = lo; e <= hi; ++e)
      if (std::abs(prefix[e + 1] - target) < std::abs(prefix[best + 1] - target)) best = e;
    lasts.push_back(best);
    prev = best;
  }
  lasts.push_back(L - 1);
  return lasts;
}

// A chunked template's figures (templates.cc's SetFigures for slices): each
// stage's w, its slices' compute plus each boundary to another stage (over
// the network where that stage is on another node), Σw, max w, the slowest
// stage's update and the busiest node's gradient.
void SetChunkFigures(const Problem& p, Template* t) {
  const int S = static_cast<int>(t->stages.size()), V = static_cast<int>(t->slices.size());
  const schedule::Chain chain = t->chain();
  std::vector<double> w(static_cast<size_t>(S), 0.0), update(static_cast<size_t>(S), 0.0);
  std::vector<uint64_t> node_grad(static_cast<size_t>(t->nodes), 0);
  for (int k = 0; k < V; ++k) {
    const StageShape& s = t->slices[k];
    const int i = chain.StageOf(k);
    w[i] += StageComputeSeconds(p, s);
    if (k + 1 < V && chain.StageOf(k + 1) != i)
      w[i] += StageBoundarySeconds(p, s.last, t->NodeOf(chain.StageOf(k + 1)) != t->NodeOf(i));
    for (int l = s.first; l <= s.last; ++l) {
      node_grad[static_cast<size_t>(t->NodeOf(i))] += p.layers[l].gradient_bytes;
      update[i] += p.layers[l].update / s.tp;
    }
  }
  t->stage_seconds = w;
  t->total = 0, t->bottleneck = 0, t->update_seconds = 0;
  for (int i = 0; i < S; ++i) {
    t->total += w[i];
    t->bottleneck = std::max(t->bottleneck, w[i]);
    t->update_seconds = std::max(t->update_seconds, update[i]);
  }
  t->node_gradient_bytes = *std::max_element(node_grad.begin(), node_grad.end());
}

}  // namespace

std::optional<Template> ChunkedTemplate(const Problem& p, const Template& t, const schedule::Schedule& s, int v,
                                        int m, int m_memory) {
  const int S = static_cast<int>(t.stages.size()), V = S * v, L = p.num_layers();
  // No fill to cut with one stage; mixed degrees and chunks are not planned together.
  if (S < 2 || t.mixed() || t.chunks > 1 || V > L || v < s.min_chunks || v > s.max_chunks) return std::nullopt;
  const int tp = t.stages.front().tp;
  const std::vector<int> lasts = EqualSlices(p, V, tp);
  for (model::Recompute mode : p.recompute_modes) {
    Template c = t;
    c.schedule = &s;
    c.chunks = v;
    c.slices.clear();
    const schedule::Chain chain = c.chain();
    for (int k = 0, first = 0; k < V; first = lasts[k] + 1, ++k) {
      StageShape sh{first, lasts[k], tp};
      sh.node = t.NodeOf(chain.StageOf(k));
      sh.recompute = mode;
      c.slices.push_back(sh);
    }
    for (int i = 0; i < S; ++i) {
      const StageShape& head = c.slices[chain.At(i, 0)];
      c.stages[i].first = head.first, c.stages[i].last = head.last, c.stages[i].recompute = mode;
    }
    const std::vector<schedule::StageCosts> costs = StageCostsOf(p, c, {}, nullptr);
    const auto orders = schedule::Orders(s, costs, m_memory, v);
    bool fits = true;
    c.stage_memory.assign(static_cast<size_t>(S), 0);
    c.stage_held.assign(static_cast<size_t>(S), {});
    for (int i = 0; i < S && fits; ++i) {
      std::vector<StageShape> mine;
      for (int k = 0; k < v; ++k) mine.push_back(c.slices[chain.At(i, k)]);
      c.stage_memory[i] = StageMemoryBytes(p, mine, (*orders)[i]);
      const auto peaks = schedule::Peaks((*orders)[i]);
      if (!peaks.empty()) c.stage_held[i] = peaks.back();  // in chunk-micro-batches
      fits = c.stage_memory[i] <= p.cluster.gpu_memory;
    }
    if (!fits) continue;
    SetChunkFigures(p, &c);
    c.op_costs = costs;
    const double one = c.total - schedule::Makespan(s, costs, 1, v);
    double at = c.total + (m - 1) * c.bottleneck - schedule::Makespan(s, costs, m, v);
    if (m > 1) at = std::min(at, one + c.bottleneck * (m - 1));  // Seconds non-decreasing in m
    c.saved_one = one;
    c.saved = m > 1 ? at : one;
    c.saved_at = m;
    return c;
  }
  return std::nullopt;
}

}  // namespace ob::plan::detail

namespace ob::plan {

uint64_t StageMemoryOf(const Problem& p, const Template& t, int i, int microbatches) {
  if (t.chunks <= 1) {
    const StageShape& s = t.stages[static_cast<size_t>(i)];
    return StageMemoryBytes(p, s.first, s.last, s.tp, t.HeldBy(i), s.recompute);
  }
  const schedule::Chain chain = t.chain();
  std::vector<StageShape> mine;
  for (int k = 0; k < t.chunks; ++k) mine.push_back(t.slices[static_cast<size_t>(chain.At(i, k))]);
  const auto orders = schedule::Orders(*t.schedule, t.OrderCosts(), std::max(1, microbatches), t.chunks);
  return StageMemoryBytes(p, mine, (*orders)[static_cast<size_t>(i)]);
}

}  // namespace ob::plan
