// The list scheduling of greedy.h.
#include "ob/schedule/greedy.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "ob/schedule/program.h"
#include "ob/schedule/timing.h"

namespace ob::schedule::detail {
namespace {

// A stage's costs in whole steps (greedy.h).
struct Steps {
  int64_t f = 1, b = 1, w = 1, send = 0, back = 0;
};

constexpr int64_t kStepsPerLargest = 4096;
constexpr int64_t kMostCostMade = 1024;  // stages × micro-batches (GreedyOrders)

// Unit costs: F = B = W, the same on every stage, transfers free.
bool IsUnit(const std::vector<Steps>& c) {
  return std::all_of(c.begin(), c.end(), [&](const Steps& s) {
    return s.f == c[0].f && s.b == s.f && s.w == s.f && s.send == 0 && s.back == 0;
  });
}

// `costs` in steps; unit costs of any size as Steps{} (one step an op),
// so that they share one cache entry.
std::vector<Steps> Quantize(const std::vector<StageCosts>& costs) {
  double largest = 0;
  for (const StageCosts& c : costs)
    largest = std::max({largest, c.forward, c.input_grad, c.weight_grad, c.send, c.send_back});
  std::vector<Steps> out(costs.size());
  if (!(largest > 0) || !std::isfinite(largest)) return out;  // unit costs
  const double step = largest / kStepsPerLargest;
  auto steps = [&](double v, int64_t least) {
    if (!(v > 0)) return least;
    return std::max(least, static_cast<int64_t>(std::llround(v / step)));
  };
  for (size_t i = 0; i < costs.size(); ++i) {
    out[i] = {steps(costs[i].forward, 1), steps(costs[i].input_grad, 1), steps(costs[i].weight_grad, 1),
              steps(costs[i].send, 0), steps(costs[i].send_back, 0)};
  }
  if (IsUnit(out)) std::fill(out.begin(), out.end(), Steps{});
  return out;
}

// kChunked: chain.chunks > 1 (the single-chunk instance, which the planner
// runs thousands of times, carries none of the chunks' bookkeeping).
template <bool kChunked>
PipelineOrders RunGreedyOf(LimitsOf limits_of, bool split, const Chain& chain, const std::vector<Steps>& c, int m) {
  const int S = chain.stages, V = chain.size();
  PipelineOrders out(static_cast<size_t>(S));
  const int v = chain.chunks;
  // Scratch kept between calls (the planner makes thousands), used through
  // references: a lambda reaching a thread_local itself pays its TLS
  // wrapper on every use.
  thread_local std::vector<Limits> lim_scratch;
  thread_local std::vector<int> deep_scratch;
  thread_local std::vector<char> local_scratch;
  thread_local std::vector<int64_t> f_scratch, b_scratch;
  std::vector<Limits>& lim = lim_scratch;
  std::vector<int>& deep = deep_scratch;
  std::vector<char>& local = local_scratch;
  std::vector<int64_t>& f_end = f_scratch;
  std::vector<int64_t>& b_end = b_scratch;
  lim.resize(static_cast<size_t>(V));
  for (int k = 0; k < V; ++k) lim[k] = limits_of(chain, k);
  for (int i = 0; i < S; ++i) out[i].reserve(3 * static_cast<size_t>(m) * v);
  // Each stage's virtual stages, deepest (latest in the chain) first: the
  // order in which it considers their Bs and Fs (deep[i·v ...]), and
  // whether the boundary after each stays on one stage.
  deep.resize(static_cast<size_t>(V));
  local.assign(static_cast<size_t>(V), 0);
  for (int i = 0; i < S; ++i)
    for (int c = 0; c < v; ++c) deep[i * v + c] = chain.At(i, v - 1 - c);
  for (int k = 0; k + 1 < V; ++k) local[k] = v > 1 && chain.Local(k);
  // The transfer into virtual stage k + 1 of k's activation, and back:
  // free where both lie on one stage.
  auto send = [&](int k) { return local[k] ? 0 : c[k].send; };
  auto back = [&](int k) { return local[k] ? 0 : c[k].back; };
  // The end of each micro-batch's F and B on each virtual stage, flat,
  // stage-major.
  const size_t M = static_cast<size_t>(m);
  f_end.assign(static_cast<size_t>(V) * M, -1);
  b_end.assign(static_cast<size_t>(V) * M, -1);
  std::vector<int> nf(V, 0), nb(V, 0), nw(V, 0);
  std::vector<int64_t> free_at(S, 0);
  using Wake = std::pair<int64_t, int>;  // (time, stage)
  thread_local std::vector<Wake> heap_scratch;
  std::vector<Wake>& heap = heap_scratch;
  heap.clear();
  auto push = [&](int64_t at, int i) {
    heap.push_back({at, i});
    std::push_heap(heap.begin(), heap.end(), std::greater<Wake>());
  };
  const int64_t total = int64_t{split ? 3 : 2} * V * m;
  int64_t done = 0;
  // When virtual stage k's next B and next F could start (-1: not yet
  // known to come).
  auto b_ready = [&](int k) -> int64_t {
    if (nb[k] >= nf[k]) return -1;
    const int j = nb[k];
    if (k + 1 == V) return f_end[k * M + j];
    const int64_t e = b_end[(k + 1) * M + j];
    return e < 0 ? -1 : e + back(k);
  };
  auto f_ready = [&](int k) -> int64_t {
    if (nf[k] >= m || nf[k] - nb[k] >= lim[k].activations || nf[k] - nw[k] >= lim[k].held) return -1;
    if (k == 0) return 0;
    const int64_t e = f_end[(k - 1) * M + nf[k]];
    return e < 0 ? -1 : e + send(k - 1);
  };
  // What stage i, free at t, runs (at: its virtual stage), as greedy.h
  // says: one chunk a stage kept apart, for speed (the planner orders
  // thousands of pipelines).
  auto pick_one = [&](int i, int64_t t, Op* op) {
    if (nb[i] < nf[i]) {
      const int j = nb[i];
      const int64_t e = i + 1 == S ? f_end[i * M + j] : b_end[(i + 1) * M + j];
      const int64_t r = e < 0 ? -1 : (i + 1 == S ? e : e + c[i].back);
      if (r >= 0 && r <= t) return *op = {split ? Op::kInputGrad : Op::kBackward, j}, true;
    }
    if (nf[i] < m && nf[i] - nb[i] < lim[i].activations && nf[i] - nw[i] < lim[i].held) {
      const int j = nf[i];
      const int64_t e = i == 0 ? 0 : f_end[(i - 1) * M + j];
      const int64_t r = i == 0 ? 0 : (e < 0 ? -1 : e + c[i - 1].send);
      if (r >= 0 && r <= t) return *op = {Op::kForward, j}, true;
    }
    if (nw[i] < nb[i]) return *op = {Op::kWeightGrad, nw[i]}, true;
    return false;
  };
  auto pick_chunk = [&](int i, int64_t t, Op* op, int* at) {
    const int* mine = &deep[static_cast<size_t>(i) * v];
    for (int n = 0; n < v; ++n) {
      const int k = mine[n];
      const int64_t r = b_ready(k);
      if (r >= 0 && r <= t) return *at = k, *op = {split ? Op::kInputGrad : Op::kBackward, nb[k], k / S}, true;
    }
    for (int n = 0; n < v; ++n) {
      const int k = mine[n];
      const int64_t r = f_ready(k);
      if (r >= 0 && r <= t) return *at = k, *op = {Op::kForward, nf[k], k / S}, true;
    }
    int64_t first = -1;
    *at = -1;
    for (int n = 0; n < v; ++n) {
      const int k = mine[n];
      if (nw[k] >= nb[k]) continue;
      const int64_t e = b_end[k * M + nw[k]];
      if (*at < 0 || e < first || (e == first && k < *at)) *at = k, first = e;
    }
    if (*at < 0) return false;
    *op = {Op::kWeightGrad, nw[*at], *at / S};
    return true;
  };
  // Stage i, free at t, takes what it can; returns whether it ran an op
  // (and then when the stage and the neighbour its result goes to look
  // again). An op started at t ends at least one step later, so what
  // starts at t changes nothing else at t.
  auto take = [&](int i, int64_t t, bool wake) {
    Op op;
    int at = i;
    if constexpr (kChunked) {
      if (!pick_chunk(i, t, &op, &at)) return false;
    } else {
      if (!pick_one(i, t, &op)) return false;
    }
    const Steps& ck = c[at];
    int64_t cost = 0;
    switch (op.type) {
      case Op::kInputGrad: cost = ck.b, b_end[at * M + nb[at]++] = t + cost; break;
      case Op::kBackward: cost = ck.b + ck.w, b_end[at * M + nb[at]++] = t + cost, ++nw[at]; break;
      case Op::kForward: cost = ck.f, f_end[at * M + nf[at]++] = t + cost; break;
      default: cost = ck.w, ++nw[at]; break;
    }
    out[i].push_back(op);
    ++done;
    const int64_t end = t + cost;
    free_at[i] = end;
    if (wake) {
      push(end, i);
      if (op.type == Op::kForward && at + 1 < V) push(end + send(at), kChunked ? chain.StageOf(at + 1) : at + 1);
      if (op.type != Op::kForward && op.type != Op::kWeightGrad && at > 0)
        push(end + back(at - 1), kChunked ? chain.StageOf(at - 1) : at - 1);
    }
    return true;
  };
  if (IsUnit(c)) {
    // Every op one step: every stage is free at every step, each looked at
    // in pipeline order (a stage with nothing ready waits a step).
    for (int64_t t = 0; done < total && t <= 2 * total * c[0].f; t += c[0].f)
      for (int i = 0; i < S; ++i) take(i, t, false);
  } else {
    // Event by event: a stage is looked at when it becomes free or an input
    // of its arrives (nothing else changes what it can run), the stages
    // woken at one moment in pipeline order.
    for (int i = 0; i < S; ++i) push(0, i);
    std::vector<int> now;
    while (done < total && !heap.empty()) {
      const int64_t t = heap.front().first;
      now.clear();
      while (!heap.empty() && heap.front().first == t) {
        std::pop_heap(heap.begin(), heap.end(), std::greater<Wake>());
        now.push_back(heap.back().second);
        heap.pop_back();
      }
      if (now.size() > 1) {
        std::sort(now.begin(), now.end());
        now.erase(std::unique(now.begin(), now.end()), now.end());
      }
      for (int i : now)
        if (free_at[i] <= t) take(i, t, true);  // a busy one is woken when free
    }
  }
  // With limits >= 1 every op runs: a free stage always has a B, an F or a
  // W, or waits for an input that an op in flight will send.
  assert(done == total && "the greedy schedule stalled");
  return out;
}

PipelineOrders RunGreedy(LimitsOf limits_of, bool split, const Chain& chain, const std::vector<Steps>& c, int m) {
  if (chain.chunks > 1) return RunGreedyOf<true>(limits_of, split, chain, c, m);
  return RunGreedyOf<false>(limits_of, split, chain, c, m);
}

// Whether the stage programs of `orders` run to their end on rendezvous
// channels (program.h). Under NCCL a send holds its channel until the
// peer receives, whether or not the sender waits for it; the unit-cost
// orders are checked by schedule_test, an order made for other costs here.
bool Rendezvous(const PipelineOrders& orders, const Chain& chain) {
  return CheckRendezvous(Programs(orders, chain)).empty();
}

}  // namespace

std::vector<Op> GreedyOrder(std::string_view key, LimitsOf limits, const Chain& chain, int stage,
                            int microbatches, bool split) {
  assert(0 <= stage && stage < chain.stages);
  if (microbatches <= 0) return {};
  return (*GreedyOrders(key, limits, chain, UnitCosts(chain.size()), microbatches, split))[static_cast<size_t>(stage)];
}

std::shared_ptr<const PipelineOrders> GreedyOrders(std::string_view key, LimitsOf limits, const Chain& chain,
                                                   const std::vector<StageCosts>& costs, int microbatches,
                                                   bool split) {
  assert(static_cast<int>(costs.size()) == chain.size());
  const int stages = chain.stages;
  if (microbatches <= 0) return std::make_shared<const PipelineOrders>(static_cast<size_t>(stages));
  // The planner asks for every stage of a pipeline in turn, the workers
  // once a generation: one run serves them all. The cache keeps up to 16 M
  // ops (128 MiB), what planning the largest models at every stage count
  // and tensor-parallel degree asks for, and starts again beyond.
  constexpr size_t kMaxOps = size_t{16} << 20;
  static std::mutex mu;
  static std::map<std::tuple<std::string, int, std::vector<int64_t>>, std::shared_ptr<const PipelineOrders>> cache;
  static size_t cached_ops = 0;
  // Orders made for a pipeline's own costs up to 1,024 stage-micro-batches
  // (16 stages of 64, 32 of 32); beyond, at unit costs, which the cache shares
  // among every template of that shape: the planner times hundreds of
  // large templates, and the fill that cost-made orders save is a smaller
  // share of a long pipeline's step. Both the planner and the workers
  // follow this rule, so they still make the same order.
  std::vector<Steps> steps = Quantize(costs);
  if (int64_t{chain.size()} * microbatches > kMostCostMade) std::fill(steps.begin(), steps.end(), Steps{});
  std::vector<int64_t> flat;
  flat.reserve(5 * steps.size());
  for (const Steps& s : steps) flat.insert(flat.end(), {s.f, s.b, s.w, s.send, s.back});
  std::string name(key);
  if (chain.chunks > 1) name += "/" + std::to_string(chain.chunks) + (chain.placement == Placement::kVee ? "v" : "");
  auto k = std::make_tuple(std::move(name), microbatches, std::move(flat));
  std::shared_ptr<const PipelineOrders> orders;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(k); it != cache.end()) orders = it->second;
  }
  if (!orders) {
    // List scheduling has its anomalies: at some costs the order made for
    // them runs longer than the unit-cost one. Keep whichever is faster at
    // these costs (the unit-cost one on a tie), so that ordering by a
    // pipeline's costs never loses to not doing so.
    auto own = std::make_shared<const PipelineOrders>(RunGreedy(limits, split, chain, steps, microbatches));
    if (!IsUnit(steps)) {
      auto plain = GreedyOrders(key, limits, chain, UnitCosts(chain.size()), microbatches, split);  // cached
      if (*own == *plain ||
          !(Makespan(*own, costs, microbatches, chain.placement) <
            Makespan(*plain, costs, microbatches, chain.placement)) ||
          !Rendezvous(*own, chain))
        own = plain;
    }
    orders = own;
    std::lock_guard<std::mutex> lock(mu);
    const size_t ops = size_t{3} * static_cast<size_t>(chain.size()) * static_cast<size_t>(microbatches);
    if (cached_ops + ops > kMaxOps) cache.clear(), cached_ops = 0;
    if (cache.emplace(std::move(k), orders).second) cached_ops += ops;
  }
  return orders;
}

}  // namespace ob::schedule::detail
