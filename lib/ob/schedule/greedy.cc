// The unit-cost list scheduling of greedy.h.
#include "ob/schedule/greedy.h"

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

namespace ob::schedule::detail {
namespace {

using Orders = std::vector<std::vector<Op>>;

Orders RunGreedy(LimitsOf limits_of, int S, int m) {
  Orders out(static_cast<size_t>(S));
  std::vector<Limits> lim(static_cast<size_t>(S));
  for (int i = 0; i < S; ++i) {
    lim[i] = limits_of(i, S);
    out[i].reserve(3 * static_cast<size_t>(m));
  }
  // Every op takes one unit of time, so time advances in whole steps and
  // every stage is free at each: at step t each stage takes, of what is ready by t, the B, else
  // the F, else the W (what runs elsewhere at t ends at t + 1 and changes
  // nothing at t).
  std::vector<std::vector<int64_t>> f_end(S, std::vector<int64_t>(m, -1)), b_end = f_end;
  std::vector<int> nf(S, 0), nb(S, 0), nw(S, 0);
  const int64_t total = int64_t{3} * S * m;
  int64_t done = 0;
  for (int64_t t = 0; done < total; ++t) {
    const int64_t before = done;
    for (int i = 0; i < S; ++i) {
      Op op;
      bool run = false;
      if (nb[i] < nf[i]) {
        const int j = nb[i];
        const int64_t r = i + 1 == S ? f_end[i][j] : b_end[i + 1][j];
        if (r >= 0 && r <= t) op = {Op::kInputGrad, j}, run = true, b_end[i][nb[i]++] = t + 1;
      }
      if (!run && nf[i] < m && nf[i] - nb[i] < lim[i].activations && nf[i] - nw[i] < lim[i].held) {
        const int j = nf[i];
        const int64_t r = i == 0 ? 0 : f_end[i - 1][j];
        if (r >= 0 && r <= t) op = {Op::kForward, j}, run = true, f_end[i][nf[i]++] = t + 1;
      }
      if (!run && nw[i] < nb[i]) op = {Op::kWeightGrad, nw[i]++}, run = true;
      if (!run) continue;
      out[i].push_back(op);
      ++done;
    }
    // Nothing ran and nothing is running: stalled (cannot happen with
    // limits >= 1; a bound on the loop all the same).
    assert((done > before || t < 2 * total) && "the greedy schedule stalled");
    if (done == before && t > 2 * total) break;
  }
  return out;
}

}  // namespace

std::vector<Op> GreedyOrder(std::string_view key, LimitsOf limits, int stage, int stages, int microbatches) {
  assert(0 <= stage && stage < stages);
  if (microbatches <= 0) return {};
  return (*GreedyOrders(key, limits, stages, microbatches))[static_cast<size_t>(stage)];
}

std::shared_ptr<const std::vector<std::vector<Op>>> GreedyOrders(std::string_view key, LimitsOf limits, int stages,
                                                                 int microbatches) {
  if (microbatches <= 0) return std::make_shared<const Orders>(static_cast<size_t>(stages));
  // The planner asks for every stage of a pipeline in turn, the workers
  // once a generation: one run serves them all. The cache keeps up to 16 M
  // ops (128 MiB), what planning the largest models at every stage count
  // and tensor-parallel degree asks for, and starts again beyond.
  constexpr size_t kMaxOps = size_t{16} << 20;
  static std::mutex mu;
  static std::map<std::tuple<std::string, int, int>, std::shared_ptr<const Orders>> cache;
  static size_t cached_ops = 0;
  const auto k = std::make_tuple(std::string(key), stages, microbatches);
  std::shared_ptr<const Orders> orders;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(k); it != cache.end()) orders = it->second;
  }
  if (!orders) {
    orders = std::make_shared<const Orders>(RunGreedy(limits, stages, microbatches));
    std::lock_guard<std::mutex> lock(mu);
    const size_t ops = size_t{3} * static_cast<size_t>(stages) * static_cast<size_t>(microbatches);
    if (cached_ops + ops > kMaxOps) cache.clear(), cached_ops = 0;
    if (cache.emplace(k, orders).second) cached_ops += ops;
  }
  return orders;
}

}  // namespace ob::schedule::detail
