#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "ob/plan/instantiation.h"
#include "plan_testing.h"

namespace ob::plan {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool Close(double a, double b) { return std::abs(a - b) <= 1e-12 * std::max(std::abs(a), std::abs(b)); }

// The best min-max split of M micro-batches over the given pipelines, each
// getting at least one, by a DP over (pipelines so far, micro-batches used):
// a different algorithm from SplitBatch's greedy.
double ExhaustiveSplit(const Problem& p, const TemplateSet& ts, const std::vector<int>& multiset) {
  const int P = static_cast<int>(multiset.size()), M = p.microbatches;
  if (P > M) return kInf;
  std::vector<double> best(M + 1, kInf), next(M + 1);
  best[0] = 0;
  for (int j = 0; j < P; ++j) {
    std::fill(next.begin(), next.end(), kInf);
    for (int used = 0; used <= M; ++used) {
      if (best[used] == kInf) continue;
      for (int m = 1; used + m <= M; ++m)
        next[used + m] = std::min(next[used + m],
                                  std::max(best[used], PipelineSeconds(p, *ts.ForNodes(multiset[j]), m)));
    }
    best.swap(next);
  }
  return best[M];
}

// The best iteration time over every multiset of template sizes that sums to
// N with at least f + 1 pipelines.
double ExhaustiveInstantiation(const Problem& p, const TemplateSet& ts) {
  double best = kInf;
  std::vector<int> multiset;
  std::function<void(int, int)> grow = [&](int largest, int left) {
    if (left == 0) {
      if (static_cast<int>(multiset.size()) >= p.faults + 1)
        best = std::min(best, ExhaustiveSplit(p, ts, multiset));
      return;
    }
    for (int n = std::min(largest, left); n >= ts.min_nodes; --n) {
      multiset.push_back(n);
      grow(n, left - n);
      multiset.pop_back();
    }
  };
  grow(ts.max_nodes(), p.cluster.nodes);
  return best;
}

// Structural promises every instantiation keeps.
void CheckWellFormed(const Problem& p, const TemplateSet& ts, const Instantiation& inst) {
  CHECK(static_cast<int>(inst.pipelines.size()) >= p.faults + 1);
  CHECK(inst.nodes_used() == p.cluster.nodes);
  std::vector<int> seen;
  int microbatches = 0;
  double slowest = 0;
  for (const PipelineInstance& pl : inst.pipelines) {
    const Template* t = ts.ForNodes(pl.template_nodes);
    REQUIRE(t);
    CHECK(static_cast<int>(pl.nodes.size()) == pl.template_nodes);
    seen.insert(seen.end(), pl.nodes.begin(), pl.nodes.end());
    CHECK(pl.microbatches >= 1);
    microbatches += pl.microbatches;
    slowest = std::max(slowest, PipelineSeconds(p, *t, pl.microbatches));
  }
  std::sort(seen.begin(), seen.end());
  std::vector<int> all(p.cluster.nodes);
  std::iota(all.begin(), all.end(), 0);
  CHECK(seen == all);
  CHECK(microbatches == p.microbatches);
  CHECK(inst.iteration_seconds == slowest);
}

}  // namespace

TEST_CASE("Instantiate equals exhaustive enumeration of multisets and splits") {
  int compared = 0, refused = 0;
  for (uint64_t seed = 1; seed <= 600; ++seed) {
    Problem p = testing::RandomProblem(seed / 2);
    // Odd seeds: fewer micro-batches than nodes, so that P ≤ M binds.
    if (seed % 2) p.microbatches = p.faults + 1 + static_cast<int>(seed / 2 % p.cluster.nodes);
    const Result<TemplateSet> ts = BuildTemplates(p);
    if (!ts.ok()) continue;
    INFO("seed " << seed << " N " << p.cluster.nodes << " f " << p.faults << " M " << p.microbatches
                 << " templates " << ts->min_nodes << ".." << ts->max_nodes());
    const double want = ExhaustiveInstantiation(p, *ts);
    const Result<Instantiation> got = Instantiate(p, *ts);
    if (want == kInf) {
      REQUIRE_FALSE(got.ok());
      CHECK(got.status().code() == Code::kConfig);
      ++refused;
      continue;
    }
    REQUIRE(got.ok());
    ++compared;
    CHECK(Close(got->iteration_seconds, want));
    CheckWellFormed(p, *ts, *got);
  }
  CHECK(compared >= 200);
  CHECK(refused >= 5);
}

TEST_CASE("Instantiate refuses a batch smaller than f + 1 pipelines") {
  Problem p = testing::UniformProblem(8, 6, 2, 16);
  const Result<TemplateSet> ts = BuildTemplates(p);
  REQUIRE(ts.ok());
  p.microbatches = 2;
  const Result<Instantiation> inst = Instantiate(p, *ts);
  REQUIRE_FALSE(inst.ok());
  CHECK(inst.status().code() == Code::kConfig);
}

TEST_CASE("f is honoured: at least f + 1 pipelines over all N nodes") {
  for (int faults = 0; faults <= 5; ++faults) {
    for (int nodes : {6, 7, 12, 23}) {
      if (nodes < faults + 1) continue;
      const Problem p = testing::UniformProblem(16, nodes, faults, 64);
      const Result<TemplateSet> ts = BuildTemplates(p);
      REQUIRE(ts.ok());
      const Result<Instantiation> inst = Instantiate(p, *ts);
      REQUIRE(inst.ok());
      CheckWellFormed(p, *ts, *inst);
    }
  }
}

TEST_CASE("SplitBatch sums to M, gives each pipeline one at least, and refuses M < P") {
  Problem p = testing::UniformProblem(16, 8, 0, 37);
  const Result<TemplateSet> ts = BuildTemplates(p);
  REQUIRE(ts.ok());
  for (const std::vector<int>& multiset : std::vector<std::vector<int>>{{8}, {4, 4}, {5, 2, 1}, {1, 1, 1, 1, 1, 1, 1, 1}}) {
    const Result<std::vector<int>> m = SplitBatch(p, *ts, multiset);
    REQUIRE(m.ok());
    REQUIRE(m->size() == multiset.size());
    CHECK(std::accumulate(m->begin(), m->end(), 0) == 37);
    CHECK(*std::min_element(m->begin(), m->end()) >= 1);
    double slowest = 0;
    for (size_t j = 0; j < multiset.size(); ++j)
      slowest = std::max(slowest, PipelineSeconds(p, *ts->ForNodes(multiset[j]), (*m)[j]));
    CHECK(Close(slowest, ExhaustiveSplit(p, *ts, multiset)));
  }
  p.microbatches = 2;
  const Result<std::vector<int>> refused = SplitBatch(p, *ts, {4, 2, 2});
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == Code::kConfig);
  CHECK_FALSE(SplitBatch(p, *ts, {9}).ok());  // no template for 9 nodes
}

TEST_CASE("slower templates get fewer micro-batches") {
  const Problem p = testing::UniformProblem(16, 6, 1, 48);
  const Result<TemplateSet> ts = BuildTemplates(p);
  REQUIRE(ts.ok());
  // A 4-node pipeline has a bottleneck about a quarter of a 1-node one.
  const Result<std::vector<int>> m = SplitBatch(p, *ts, {4, 1, 1});
  REQUIRE(m.ok());
  CHECK(ts->ForNodes(4)->bottleneck < ts->ForNodes(1)->bottleneck);
  CHECK((*m)[0] > 2 * (*m)[1]);
  CHECK((*m)[1] == (*m)[2]);
}

TEST_CASE("Rebalance recomputes the split and the iteration time") {
  const Problem p = testing::UniformProblem(16, 7, 1, 40);
  const Result<TemplateSet> ts = BuildTemplates(p);
  REQUIRE(ts.ok());
  Result<Instantiation> inst = Instantiate(p, *ts);
  REQUIRE(inst.ok());
  const Instantiation want = *inst;
  for (PipelineInstance& pl : inst->pipelines) pl.microbatches = 1;
  inst->iteration_seconds = 0;
  REQUIRE(Rebalance(p, *ts, &*inst).ok());
  for (size_t j = 0; j < want.pipelines.size(); ++j)
    CHECK(inst->pipelines[j].microbatches == want.pipelines[j].microbatches);
  CHECK(inst->iteration_seconds == want.iteration_seconds);
  CheckWellFormed(p, *ts, *inst);
}

TEST_CASE("one tensor-parallel degree for every template: the fastest instantiation's") {
  // 8 GPUs a node, 16 heads: t in {1, 2, 4, 8}; per template the best k
  // may differ, the runtime needs one.
  for (int nodes : {4, 8, 12}) {
    Problem p = testing::UniformProblem(16, nodes, 1, 64, 8);
    const Result<int> t = ChooseTensorParallel(p);
    REQUIRE(t.ok());
    INFO(nodes << " nodes: t = " << *t);
    const std::vector<int> choices = TensorParallelChoices(p);
    CHECK(std::find(choices.begin(), choices.end(), *t) != choices.end());
    double chosen = 0;
    std::vector<double> others;
    for (int u : choices) {
      Problem q = p;
      q.tp = u;
      const Result<TemplateSet> ts = BuildTemplates(q);
      if (!ts.ok()) continue;
      for (const Template& tm : ts->templates) {
        for (const auto& st : tm.stages) CHECK(st.tp == u);
      }
      const Result<Instantiation> inst = Instantiate(q, *ts);
      if (!inst.ok()) continue;
      (u == *t ? chosen : others.emplace_back()) = inst->iteration_seconds;
    }
    for (double o : others) CHECK(chosen <= o);
  }
  Problem odd = testing::UniformProblem(16, 4, 1, 64, 8);
  odd.n_head = 25;  // only t = 1 splits 25 heads
  CHECK(TensorParallelChoices(odd) == std::vector<int>{1});
  CHECK(*ChooseTensorParallel(odd) == 1);
}

}  // namespace ob::plan
