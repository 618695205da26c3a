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

PipelineOrders RunGreedy(LimitsOf limits_of, const std::vector<Steps>& c, int m) {
  const int S = static_cast<int>(c.size());
  PipelineOrders out(static_cast<size_t>(S));
  std::vector<Limits> lim(static_cast<size_t>(S));
  for (int i = 0; i < S; ++i) {
    lim[i] = limits_of(i, S);
    out[i].reserve(3 * static_cast<size_t>(m));
  }
  // Scratch kept between calls (the planner makes thousands): the end of
  // each micro-batch's F and B on each stage, flat, stage-major.
  const size_t M = static_cast<size_t>(m);
  thread_local std::vector<int64_t> f_end, b_end;
  f_end.assign(static_cast<size_t>(S) * M, -1);
  b_end.assign(static_cast<size_t>(S) * M, -1);
  std::vector<int> nf(S, 0), nb(S, 0), nw(S, 0);
  std::vector<int64_t> free_at(S, 0);
  using Wake = std::pair<int64_t, int>;  // (time, stage)
  thread_local std::vector<Wake> heap;
  heap.clear();
  auto push = [&](int64_t at, int i) {
    heap.push_back({at, i});
    std::push_heap(heap.begin(), heap.end(), std::greater<Wake>());
  };
  const int64_t total = int64_t{3} * S * m;
  int64_t done = 0;
  // Stage i, free at t, takes what it can; returns whether it ran an op
  // (and then when the stage and the neighbour its result goes to look
  // again). An op started at t ends at least one step later, so what
  // starts at t changes nothing else at t.
  auto take = [&](int i, int64_t t, bool wake) {
    Op op;
    bool run = false;
    int64_t cost = 0;
    if (nb[i] < nf[i]) {
      const int j = nb[i];
      const int64_t e = i + 1 == S ? f_end[i * M + j] : b_end[(i + 1) * M + j];
      const int64_t r = e < 0 ? -1 : (i + 1 == S ? e : e + c[i].back);
      if (r >= 0 && r <= t) op = {Op::kInputGrad, j}, run = true, cost = c[i].b, b_end[i * M + nb[i]++] = t + cost;
    }
    if (!run && nf[i] < m && nf[i] - nb[i] < lim[i].activations && nf[i] - nw[i] < lim[i].held) {
      const int j = nf[i];
      const int64_t e = i == 0 ? 0 : f_end[(i - 1) * M + j];
      const int64_t r = i == 0 ? 0 : (e < 0 ? -1 : e + c[i - 1].send);
      if (r >= 0 && r <= t) op = {Op::kForward, j}, run = true, cost = c[i].f, f_end[i * M + nf[i]++] = t + cost;
    }
    if (!run && nw[i] < nb[i]) op = {Op::kWeightGrad, nw[i]++}, run = true, cost = c[i].w;
    if (!run) return false;
    out[i].push_back(op);
    ++done;
    const int64_t end = t + cost;
    free_at[i] = end;
    if (wake) {
      push(end, i);
      if (op.type == Op::kForward && i + 1 < S) push(end + c[i].send, i + 1);
      if (op.type == Op::kInputGrad && i > 0) push(end + c[i - 1].back, i - 1);
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

// Whether the stage programs of `orders` run to their end on rendezvous
// channels (program.h). Under NCCL a send holds its channel until the
// peer receives, whether or not the sender waits for it; the unit-cost
// orders are checked by schedule_test, an order made for other costs here.
bool Rendezvous(const PipelineOrders& orders) {
  const int S = static_cast<int>(orders.size());
  std::vector<std::vector<StageInstr>> programs;
  programs.reserve(orders.size());
  for (int i = 0; i < S; ++i) programs.push_back(StageProgram(orders[i], i, S));
  return CheckRendezvous(programs).empty();
}

}  // namespace

std::vector<Op> GreedyOrder(std::string_view key, LimitsOf limits, int stage, int stages, int microbatches) {
  assert(0 <= stage && stage < stages);
  if (microbatches <= 0) return {};
  return (*GreedyOrders(key, limits, UnitCosts(stages), microbatches))[static_cast<size_t>(stage)];
}

std::shared_ptr<const PipelineOrders> GreedyOrders(std::string_view key, LimitsOf limits,
                                                   const std::vector<StageCosts>& costs, int microbatches) {
  const int stages = static_cast<int>(costs.size());
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
  if (int64_t{stages} * microbatches > kMostCostMade) std::fill(steps.begin(), steps.end(), Steps{});
  std::vector<int64_t> flat;
  flat.reserve(5 * steps.size());
  for (const Steps& s : steps) flat.insert(flat.end(), {s.f, s.b, s.w, s.send, s.back});
  auto k = std::make_tuple(std::string(key), microbatches, std::move(flat));
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
    auto own = std::make_shared<const PipelineOrders>(RunGreedy(limits, steps, microbatches));
    if (!IsUnit(steps)) {
      auto plain = GreedyOrders(key, limits, UnitCosts(stages), microbatches);  // cached: one per shape
      if (*own == *plain ||
          !(Makespan(*own, costs, microbatches) < Makespan(*plain, costs, microbatches)) || !Rendezvous(*own))
        own = plain;
    }
    orders = own;
    std::lock_guard<std::mutex> lock(mu);
    const size_t ops = size_t{3} * static_cast<size_t>(stages) * static_cast<size_t>(microbatches);
    if (cached_ops + ops > kMaxOps) cache.clear(), cached_ops = 0;
    if (cache.emplace(std::move(k), orders).second) cached_ops += ops;
  }
  return orders;
}

}  // namespace ob::schedule::detail
