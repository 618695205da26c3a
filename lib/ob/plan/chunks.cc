// Chunked templates (design/schedule.md, Chunks): a template whose stages
// were cut for 1F1B, cut again into V = S·v slices for a schedule with v
// chunks a stage (interleaved, zb-v), timed by that schedule's orders and
// sized by their peaks. ChooseSchedule (schedule.cc) weighs it beside the
// single-chunk schedules.
#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "ob/plan/schedule.h"
#include "ob/plan/templates_impl.h"
#include "ob/schedule/timing.h"

namespace ob::plan::detail {
namespace {

// The last layer of each of `chain`'s V slices of [0, L), each at least
// one layer, cut from `prefix` (the running compute sum over the layers)
// so that groups of slices come out even: slice k ends where the running
// sum of its group comes closest to (index + 1)/V of the whole, k's group
// and index within it given by `place`. One group of all the slices in
// order (each slice 1/V of the compute, EqualSlices) or each stage's
// chunks (each stage even, EvenSlices). Neither always wins: even slices
// let rounding pile up on some stages (gpt3-175b on 8 stages of 6 chunks
// gave some a 13th block of 12), even stages may load stage 0's first
// chunk with more activations than fit.
template <typename Place>
std::vector<int> CutSlices(const std::vector<double>& prefix, int V, int groups, Place place) {
  const int L = static_cast<int>(prefix.size()) - 1;
  std::vector<double> load(static_cast<size_t>(groups), 0.0);
  std::vector<int> lasts;
  int prev = -1;
  for (int k = 0; k + 1 < V; ++k) {
    const auto [group, index] = place(k);
    const double target = prefix[L] * (index + 1) / V;
    const int lo = prev + 1, hi = L - 1 - (V - 1 - k);  // leave a layer for every later slice
    auto miss = [&](int e) { return std::abs(load[group] + prefix[e + 1] - prefix[lo] - target); };
    int best = lo;
    for (int e = lo + 1; e <= hi; ++e)
      if (miss(e) < miss(best)) best = e;
    load[group] += prefix[best + 1] - prefix[lo];
    lasts.push_back(best);
    prev = best;
  }
  lasts.push_back(L - 1);
  return lasts;
}

std::vector<int> EqualSlices(const std::vector<double>& prefix, int V) {
  return CutSlices(prefix, V, 1, [](int k) { return std::pair<int, int>{0, k}; });
}

std::vector<int> EvenSlices(const std::vector<double>& prefix, const schedule::Chain& chain) {
  return CutSlices(prefix, chain.size(), chain.stages,
                   [&](int k) { return std::pair<int, int>{chain.StageOf(k), chain.ChunkOf(k)}; });
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
      update[i] += p.UpdateSeconds(p.layers[l]) / s.tp;
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

// What of the busiest node's data-parallel all-reduce a chunked pipeline
// hides, running m micro-batches in `orders`: each slice's gradients go on
// its node's link once its last backward (or W) is done, one slice after
// another in that order, and the node is done when its last is summed;
// what runs past the pipeline's makespan on the slowest node is exposed,
// the rest of the whole-node all-reduce StepTailSeconds would charge is
// hidden.
double HiddenAllReduce(const Problem& p, const Template& t, const schedule::PipelineOrders& orders,
                       const std::vector<schedule::StageCosts>& costs, int m) {
  const int V = static_cast<int>(t.slices.size());
  const schedule::Chain chain = t.chain();
  std::vector<double> ready(static_cast<size_t>(V), 0.0);
  double makespan = 0;
  for (const schedule::TimedOp& o : schedule::Simulate(orders, costs, m, chain.placement)) {
    makespan = std::max(makespan, o.end);
    if (o.op.type == schedule::Op::kForward || o.op.type == schedule::Op::kInputGrad) continue;
    const int k = chain.At(o.stage, o.op.chunk);
    ready[k] = std::max(ready[k], o.end);
  }
  double exposed = 0;
  for (int q = 0; q < t.nodes; ++q) {
    std::vector<std::pair<double, uint64_t>> mine;  // (ready, gradient bytes) of the node's slices
    for (int k = 0; k < V; ++k) {
      if (t.NodeOf(chain.StageOf(k)) != q) continue;
      uint64_t bytes = 0;
      for (int l = t.slices[k].first; l <= t.slices[k].last; ++l) bytes += p.layers[l].gradient_bytes;
      mine.emplace_back(ready[k], bytes);
    }
    std::sort(mine.begin(), mine.end());
    double done = 0;
    for (const auto& [at, bytes] : mine) done = std::max(done, at) + AllReduceSeconds(p, bytes);
    exposed = std::max(exposed, done - makespan);
  }
  return std::max(0.0, AllReduceSeconds(p, t.node_gradient_bytes) - std::max(0.0, exposed));
}

}  // namespace

std::optional<Template> ChunkedTemplate(const Problem& p, const Template& t, const schedule::Schedule& s, int v,
                                        int m, int m_memory) {
  const int S = static_cast<int>(t.stages.size()), V = S * v, L = p.num_layers();
  // No fill to cut with one stage; mixed degrees and chunks are not planned together.
  if (S < 2 || t.mixed() || t.chunks > 1 || V > L || v < s.min_chunks || v > s.max_chunks) return std::nullopt;
  const int tp = t.stages.front().tp;
  std::vector<double> prefix(static_cast<size_t>(L) + 1, 0.0);  // compute of layers [0, l) at tp
  for (int l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + StageComputeSeconds(p, l, l, tp);
  // Both cuts, each in the fastest mode that fits; the faster of the two.
  std::optional<Template> best;
  double best_time = 0;
  for (const std::vector<int>& lasts : {EqualSlices(prefix, V), EvenSlices(prefix, s.ChainOf(S, v))})
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
      c.stage_memory[i] = StageMemoryBytes(p, c.ChunksOf(i), (*orders)[i]);
      const auto peaks = schedule::Peaks((*orders)[i]);
      if (!peaks.empty()) c.stage_held[i] = peaks.back();  // in chunk-micro-batches
      fits = c.stage_memory[i] <= p.cluster.gpu_memory;
    }
    if (!fits) continue;
    SetChunkFigures(p, &c);
    c.op_costs = costs;
    const auto orders_m = schedule::Orders(s, costs, m, v);  // what the time and the overlap are of
    const double one = c.total - schedule::Makespan(s, costs, 1, v);
    double at = c.total + (m - 1) * c.bottleneck - schedule::Makespan(*orders_m, costs, m, s.placement);
    if (m > 1) at = std::min(at, one + c.bottleneck * (m - 1));  // Seconds non-decreasing in m
    c.saved_one = one;
    c.saved = m > 1 ? at : one;
    c.saved_at = m;
    c.allreduce_hidden = p.cluster.local ? 0.0 : HiddenAllReduce(p, c, *orders_m, costs, m);
    const double time = c.total + (m - 1) * c.bottleneck - c.saved + StepTailSeconds(p, c);
    if (!best || time < best_time) best = std::move(c), best_time = time;
    break;  // the fastest mode that fits
  }
  return best;
}

}  // namespace ob::plan::detail

namespace ob::plan {

uint64_t StageMemoryOf(const Problem& p, const Template& t, int i, int microbatches) {
  if (t.chunks <= 1) {
    const StageShape& s = t.stages[static_cast<size_t>(i)];
    return StageMemoryBytes(p, s.first, s.last, s.tp, t.HeldBy(i), s.recompute);
  }
  const auto orders = schedule::Orders(*t.schedule, t.OrderCosts(), std::max(1, microbatches), t.chunks);
  return StageMemoryBytes(p, t.ChunksOf(i), (*orders)[static_cast<size_t>(i)]);
}

}  // namespace ob::plan
