// A schedule's iteration for given costs (timing.h).
#include "ob/schedule/timing.h"

#include <algorithm>
#include <cassert>
#include <cstddef>

namespace ob::schedule {
namespace {

using PipelineOrder = std::vector<std::vector<Op>>;

// Runs each stage's ops in order as soon as their input is there; a
// schedule's orders admit an execution (they were made by one), so every
// sweep runs something. Sweeps alternate direction: forwards run down the
// pipeline and backwards up it, each a whole chain a sweep. Returns the
// makespan; records every op in `out` when given.
double RunOrders(const PipelineOrder& order, const std::vector<StageCosts>& c, int m, Placement placement,
                 std::vector<TimedOp>* out) {
  const int S = static_cast<int>(order.size()), V = static_cast<int>(c.size());
  const Chain chain{S, V / S, placement};
  const bool one = chain.chunks == 1;  // no chunks: the stage is the virtual stage, every transfer paid
  const size_t M = static_cast<size_t>(m);
  // Scratch kept between calls: the planner makes thousands, and arrays
  // this size would each be a fresh mapping of memory. Ends per virtual
  // stage.
  thread_local std::vector<double> f_end, b_end, free_at;
  thread_local std::vector<size_t> next;
  f_end.assign(static_cast<size_t>(V) * M, -1);
  b_end.assign(static_cast<size_t>(V) * M, -1);
  free_at.assign(static_cast<size_t>(S), 0);
  next.assign(static_cast<size_t>(S), 0);
  std::vector<std::vector<std::pair<double, double>>> times;
  if (out) {
    times.resize(static_cast<size_t>(S));
    for (int i = 0; i < S; ++i) times[i].resize(order[i].size());
  }
  size_t done = 0, total = 0;
  for (const auto& ops : order) total += ops.size();
  double makespan = 0;
  for (bool down = true; done < total; down = !down) {
    const size_t before = done;
    for (int n = 0; n < S; ++n) {
      const int i = down ? n : S - 1 - n;
      const std::vector<Op>& ops = order[i];
      while (next[i] < ops.size()) {
        const Op& op = ops[next[i]];
        const size_t j = static_cast<size_t>(op.microbatch);
        const int k = one ? i : chain.At(i, op.chunk);  // its virtual stage
        const StageCosts& ck = c[k];
        double ready = 0;
        switch (op.type) {
          case Op::kForward: {
            if (k > 0) {
              const double e = f_end[(k - 1) * M + j];
              ready = e < 0 ? -1 : e + (one || !chain.Local(k - 1) ? c[k - 1].send : 0);
            }
            break;
          }
          case Op::kBackward:
          case Op::kInputGrad: {
            if (k + 1 == V) {
              ready = f_end[k * M + j];
            } else {
              const double e = b_end[(k + 1) * M + j];
              ready = e < 0 ? -1 : e + (one || !chain.Local(k) ? ck.send_back : 0);
            }
            break;
          }
          case Op::kWeightGrad:
            ready = b_end[k * M + j];
            break;
        }
        if (ready < 0) break;
        const double start = std::max(ready, free_at[i]), end = start + ck.Seconds(op.type);
        free_at[i] = end;
        makespan = std::max(makespan, end);
        if (op.type == Op::kForward) f_end[k * M + j] = end;
        else if (op.type != Op::kWeightGrad) b_end[k * M + j] = end;
        if (out) times[i][next[i]] = {start, end};
        ++next[i];
        ++done;
      }
    }
    assert(done > before && "a schedule's orders deadlocked");
    if (done == before) break;
  }
  if (out) {
    out->reserve(total);
    for (int i = 0; i < S; ++i)
      for (size_t k = 0; k < order[i].size(); ++k) out->push_back({i, order[i][k], times[i][k].first, times[i][k].second});
  }
  return makespan;
}

// Whether `c` has the same number of costs for every stage of `orders`.
bool OrdersFitCosts(const PipelineOrders& orders, const std::vector<StageCosts>& c) {
  assert(!orders.empty() && c.size() % orders.size() == 0);
  return !orders.empty() && c.size() % orders.size() == 0;
}

}  // namespace

std::vector<TimedOp> Simulate(const PipelineOrders& orders, const std::vector<StageCosts>& c, int m,
                              Placement placement) {
  if (c.empty() || m <= 0 || !OrdersFitCosts(orders, c)) return {};
  std::vector<TimedOp> out;
  RunOrders(orders, c, m, placement, &out);
  return out;
}

std::vector<TimedOp> Simulate(const Schedule& s, const std::vector<StageCosts>& c, int m, int chunks) {
  if (c.empty() || m <= 0) return {};
  return Simulate(*Orders(s, c, m, chunks), c, m, s.placement);
}

double Makespan(const std::vector<TimedOp>& ops) {
  double most = 0;
  for (const TimedOp& t : ops) most = std::max(most, t.end);
  return most;
}

double Makespan(const Schedule& s, const std::vector<StageCosts>& c, int m, int chunks) {
  if (c.empty() || m <= 0) return 0;
  return RunOrders(*Orders(s, c, m, chunks), c, m, s.placement, nullptr);
}

double Makespan(const PipelineOrders& orders, const std::vector<StageCosts>& c, int m, Placement placement) {
  if (c.empty() || m <= 0 || !OrdersFitCosts(orders, c)) return 0;
  return RunOrders(orders, c, m, placement, nullptr);
}

}  // namespace ob::schedule
