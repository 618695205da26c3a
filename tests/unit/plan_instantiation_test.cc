#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <tuple>

#include "ob/plan/fault_sweep.h"
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

TEST_CASE("a FaultSweep plans each f as planning that f alone does") {
  // -f auto plans f = 0, 1, ... of one cluster through one sweep; its
  // templates and instantiations are made once where f changes nothing.
  int compared = 0, ignored = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    Problem p = testing::RandomProblem(seed, {12, 40, 0, 2});
    // Odd seeds: more pipelines possible than micro-batches (N / n0 > M).
    if (seed % 2) p.microbatches = 1 + static_cast<int>(seed / 2 % 6);
    FaultSweep sweep;
    for (int f = 0; f <= 4; ++f) {
      Problem q = p;
      q.faults = f;
      INFO("seed " << seed << " f " << f << " N " << q.cluster.nodes << " M " << q.microbatches);
      const Result<TensorParallelPlan> alone = ChooseTensorParallelPlan(q);
      const Result<TensorParallelPlan> swept = ChooseTensorParallelPlan(q, &sweep);
      REQUIRE(alone.ok() == swept.ok());
      if (!alone.ok()) {
        CHECK(alone.status().message() == swept.status().message());
        continue;
      }
      ++compared;
      q.tp = alone->tp;
      ignored += InstantiationIgnoresFaults(q, alone->templates) ? 1 : 0;
      CHECK(swept->tp == alone->tp);
      CHECK(swept->templates.min_nodes == alone->templates.min_nodes);
      CHECK(swept->templates.max_nodes() == alone->templates.max_nodes());
      CHECK(swept->inst.iteration_seconds == alone->inst.iteration_seconds);
      REQUIRE(swept->inst.pipelines.size() == alone->inst.pipelines.size());
      for (size_t j = 0; j < alone->inst.pipelines.size(); ++j) {
        CHECK(swept->inst.pipelines[j].nodes == alone->inst.pipelines[j].nodes);
        CHECK(swept->inst.pipelines[j].microbatches == alone->inst.pipelines[j].microbatches);
      }
    }
  }
  CHECK(compared >= 300);
  CHECK(ignored >= 30);
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

namespace ob::plan {
namespace {

TEST_CASE("InstantiateGiven runs the pipelines it is given and refuses what cannot run") {
  const Problem p = testing::UniformProblem(8, 5, 1, 16);
  const Result<TemplateSet> ts = BuildTemplates(p);
  REQUIRE(ts.ok());
  const Result<Instantiation> inst = InstantiateGiven(p, *ts, {2, 3});
  REQUIRE(inst.ok());
  REQUIRE(inst->pipelines.size() == 2);
  CHECK(inst->pipelines[0].template_nodes == 3);  // largest first
  CHECK(inst->pipelines[1].template_nodes == 2);
  CHECK(inst->pipelines[0].nodes == std::vector<int>{0, 1, 2});
  CHECK(inst->pipelines[1].nodes == std::vector<int>{3, 4});
  CHECK(inst->pipelines[0].microbatches + inst->pipelines[1].microbatches == 16);
  double slowest = 0;
  for (const auto& pl : inst->pipelines)
    slowest = std::max(slowest, PipelineSeconds(p, *ts->ForNodes(pl.template_nodes), pl.microbatches));
  CHECK(inst->iteration_seconds == slowest);
  // Never faster than the optimum the planner chooses.
  const Result<Instantiation> best = Instantiate(p, *ts);
  REQUIRE(best.ok());
  CHECK(best->iteration_seconds <= inst->iteration_seconds);

  for (const std::vector<int>& bad : {std::vector<int>{2, 2}, std::vector<int>{5}, std::vector<int>{1, 1, 1, 1, 2}}) {
    const Result<Instantiation> r = InstantiateGiven(p, *ts, bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kConfig);
    CHECK(r.status().message().find('\n') == std::string::npos);
  }
  // {5}: one pipeline cannot survive f = 1 (and has no template for f = 1);
  // {2, 2}: 4 of the 5 nodes; {1,1,1,1,2}: 6 nodes.
  CHECK(InstantiateGiven(p, *ts, {2, 2}).status().message().find("4 nodes, the cluster has 5") != std::string::npos);
}

TEST_CASE("a local cluster prices every collective of a step by the profile's fit") {
  Problem p = testing::UniformProblem(4, 4, 1, 8);
  for (auto& l : p.layers) l.update = 1e-3;
  const Result<TemplateSet> ts = BuildTemplates(p);
  REQUIRE(ts.ok());
  const Template& one = *ts->ForNodes(1);
  const Template& two = *ts->ForNodes(2);
  // The update: the slowest stage's sum (one stage holds all 6 layers).
  CHECK(one.update_seconds == Approx(6e-3));
  CHECK(two.update_seconds <= one.update_seconds);
  // Not local: the links' all-reduce plus the update.
  CHECK(StepTailSeconds(p, one) == AllReduceSeconds(p, one.node_gradient_bytes) + one.update_seconds);
  p.cluster.local = true;
  p.cluster.local_step = {2e-3, 1e-9};
  // Pipelines of one node among four: the buckets, the tied weight and the
  // losses; no pipeline group, so no norms over it.
  const double buckets = std::ceil(static_cast<double>(one.node_gradient_bytes) / kGradientBucketBytes);
  CHECK(StepTailSeconds(p, one) ==
        Approx((buckets + 2) * 2e-3 + one.node_gradient_bytes * 1e-9 + one.update_seconds));
  // Two stages: the norms over the pipeline too.
  const double buckets2 = std::ceil(static_cast<double>(two.node_gradient_bytes) / kGradientBucketBytes);
  CHECK(StepTailSeconds(p, two) ==
        Approx((buckets2 + 3) * 2e-3 + two.node_gradient_bytes * 1e-9 + two.update_seconds));
  // Tensor parallelism: 4 all-reduces per block and micro-batch, each at
  // its group's fit (the blocks are layers 1..4), 1 for the embedding and
  // 2 for the head (its input's gradient; the cross-entropy's 3, back to
  // back, as one); a group the profile did not time keeps the bandwidth
  // formula.
  p.cluster.local_fits[2] = {1e-3, 0};
  double compute = 0;
  for (int l = 0; l <= 5; ++l) compute += p.layers[l].forward + p.layers[l].backward;
  CHECK(StageComputeSeconds(p, 0, 5, 2) == Approx(compute / 2 + (4 * 4 + 1 + 2) * 1e-3));
  CHECK(StageComputeSeconds(p, 1, 4, 2) == Approx((compute - p.layers[0].forward - p.layers[0].backward -
                                                   p.layers[5].forward - p.layers[5].backward) / 2 + 4 * 4 * 1e-3));
  Problem nominal = p;
  nominal.cluster.local = false;
  CHECK(StageComputeSeconds(p, 0, 5, 4) == StageComputeSeconds(nominal, 0, 5, 4));
  // A stage boundary: a send and a receive each way, at the two-rank fit.
  CHECK(StageBoundarySeconds(p, 2, true) == Approx(2e-3));
  CHECK(StageBoundarySeconds(p, 2, false) == Approx(2e-3));
  CHECK(StageBoundarySeconds(p, 5, true) == 0.0);  // the head sends nothing on
  CHECK(StageBoundarySeconds(nominal, 2, true) ==
        BoundarySeconds(nominal, 2, nominal.cluster.link_bytes_per_s, nominal.cluster.link_latency));
  // One pipeline of one stage on one node: nothing to all-reduce.
  Problem alone = testing::UniformProblem(4, 1, 0, 8);
  alone.cluster.local = true;
  alone.cluster.local_step = {2e-3, 0};
  const Result<TemplateSet> ts1 = BuildTemplates(alone);
  REQUIRE(ts1.ok());
  CHECK(StepTailSeconds(alone, *ts1->ForNodes(1)) == 0.0);
  // Not local either: a pipeline over every node has no replica to
  // all-reduce with; only the update is left (ob-plan priced 1.4 GB of
  // gradients over the network for gpt2-medium on one GPU, 0.27 s of a
  // 0.50 s prediction for a 0.24 s step).
  for (int nodes : {1, 2}) {
    Problem whole = testing::UniformProblem(4, nodes, 0, 8);
    for (auto& l : whole.layers) l.update = 1e-3;
    const Result<TemplateSet> tsw = BuildTemplates(whole);
    REQUIRE(tsw.ok());
    const Template& all = *tsw->ForNodes(nodes);
    CHECK(StepTailSeconds(whole, all) == all.update_seconds);
    if (nodes == 2 && tsw->ForNodes(1) != nullptr) {  // two pipelines of one node: their all-reduce
      const Template& half = *tsw->ForNodes(1);
      CHECK(StepTailSeconds(whole, half) == AllReduceSeconds(whole, half.node_gradient_bytes) + half.update_seconds);
    }
  }
}

TEST_CASE("MakeProblem fits the local collectives to the profile's all-reduces") {
  pb::Profile prof;
  prof.set_mode(pb::PROFILE_MEASURED);
  prof.set_sequence_length(8);
  for (int i = 0; i < 3; ++i) {
    auto* l = prof.add_layers();
    l->set_index(i);
    l->set_kind(i == 0 ? pb::LAYER_EMBED : i == 2 ? pb::LAYER_HEAD : pb::LAYER_BLOCK);
    l->set_name("l" + std::to_string(i));
    l->set_gradient_bytes(1000 * (i + 1));
    l->set_update_seconds(0.5e-3);
    auto* c = l->add_costs();
    c->set_microbatch(1);
    c->set_forward_seconds(1e-3);
    c->set_backward_seconds(2e-3);
    for (int g : {1, 2, 4}) {  // seconds = g·1e-3 + bytes·g·1e-9: a line per group
      auto* a = l->add_allreduce();
      a->set_group_size(g);
      a->set_bytes(l->gradient_bytes());
      a->set_seconds(g * 1e-3 + static_cast<double>(l->gradient_bytes()) * g * 1e-9);
    }
  }
  Cluster c;
  c.nodes = 2;
  c.gpu_memory = 1ull << 30;
  c.local = true;
  Result<Problem> two = MakeProblem(prof, c, 1, 4, 1);
  REQUIRE(two.ok());
  CHECK(two->cluster.local_step.fixed == Approx(2e-3));  // group 2: the largest the 2 workers reach
  CHECK(two->cluster.local_step.per_byte == Approx(2e-9));
  CHECK(two->cluster.local_fits.at(4).fixed == Approx(4e-3));  // every group fitted (tensor parallelism)
  CHECK(two->layers[1].update == 0.5e-3);
  c.nodes = 8;
  Result<Problem> eight = MakeProblem(prof, c, 1, 8, 1);
  REQUIRE(eight.ok());
  CHECK(eight->cluster.local_step.fixed == Approx(4e-3));  // the largest group timed
  CHECK(eight->cluster.local_step.per_byte == Approx(4e-9));
  CHECK(eight->cluster.contention.empty());  // not measured: the closed form
  // The contention curve comes with the profile, checked.
  prof.mutable_device()->set_concurrency(3);
  for (double x : {1.0, 1.1, 1.6}) prof.mutable_device()->add_contention(x);
  Result<Problem> curve = MakeProblem(prof, c, 1, 8, 1);
  REQUIRE(curve.ok());
  CHECK(curve->cluster.contention == std::vector<double>{1.0, 1.1, 1.6});
  for (auto [k, x, want] : {std::tuple{2, -1.0, "contention 3 is -1"}, {0, 0.9, "must be 1"}, {2, NAN, "contention 3"}}) {
    pb::Profile bad = prof;
    bad.mutable_device()->set_contention(k, x);
    Result<Problem> r = MakeProblem(bad, c, 1, 8, 1);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kDataErr);
    CHECK_THAT(r.status().message(), Catch::Contains(want));
  }
  prof.mutable_device()->set_concurrency(4);
  Result<Problem> short_curve = MakeProblem(prof, c, 1, 8, 1);
  REQUIRE_FALSE(short_curve.ok());
  CHECK_THAT(short_curve.status().message(), Catch::Contains("3 entries for concurrency 4"));
  prof.mutable_device()->clear_contention();
  for (auto& l : *prof.mutable_layers()) l.mutable_allreduce()->DeleteSubrange(1, 2);
  Result<Problem> none = MakeProblem(prof, c, 1, 8, 1);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == Code::kDataErr);
}

}  // namespace
}  // namespace ob::plan
