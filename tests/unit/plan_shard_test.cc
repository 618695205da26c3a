// The planner's side of a sharded optimizer (design/shard.md, issue 69):
// what a rank keeps of a layer's state with the state in S, n0 falling
// with S, and no instantiation below f + 1 rows of S pipelines.
#include <catch2/catch.hpp>

#include "ob/plan/instantiation.h"
#include "ob/plan/plan_io.h"
#include "ob/plan/problem.h"
#include "ob/plan/templates.h"
#include "plan_testing.h"

using namespace ob::plan;

namespace {

// UniformProblem with each layer's state as a bf16 run keeps it, per
// parameter: 6 (master and copy) + 4 (gradient) + 8 (moments), of which
// 4 + 8 shard.
Problem ShardTestProblem(int nodes, int faults) {
  Problem p = testing::UniformProblem(8, nodes, faults, 64);
  for (LayerCost& c : p.layers) {
    const uint64_t params = c.state_bytes / 18;
    c.state_bytes = 18 * params;
    c.sharded_bytes = 12 * params;
  }
  return p;
}

}  // namespace

TEST_CASE("sharded state: a rank keeps the unsharded part and 1/S of the rest") {
  Problem p = ShardTestProblem(16, 1);
  const LayerCost& block = p.layers[1];
  CHECK(p.StateBytes(block) == Approx(static_cast<double>(block.state_bytes)));
  p.shards = 4;
  CHECK(p.StateBytes(block) == Approx(static_cast<double>(block.state_bytes) / 18 * (6 + 12.0 / 4)));
  // The stage's bytes fall by exactly the shards' share, overheads aside.
  p.cluster.overhead_fraction = 0;
  p.cluster.overhead_bytes = 0;
  Problem whole = p;
  whole.shards = 1;
  const double saved = static_cast<double>(StageMemoryBytes(whole, 1, 4, 1, 2)) -
                       static_cast<double>(StageMemoryBytes(p, 1, 4, 1, 2));
  CHECK(saved == Approx(4 * static_cast<double>(block.sharded_bytes) * 3 / 4).epsilon(1e-6));
}

TEST_CASE("sharded state: n0 falls with S, and every instantiation has f + 1 rows of S pipelines") {
  Problem p = ShardTestProblem(24, 1);
  // Memory for the whole state of about a third of the layers: n0 = 3 or so.
  double total = 0;
  for (const LayerCost& c : p.layers) total += static_cast<double>(c.state_bytes);
  p.cluster.gpu_memory = static_cast<uint64_t>(total / 2.6);
  const int n0_whole = LeastNodes(p);
  REQUIRE(n0_whole >= 3);
  p.shards = 4;  // 6 + 3 = 9 of 18 bytes a parameter
  const int n0_sharded = LeastNodes(p);
  CHECK(n0_sharded > 0);
  CHECK(n0_sharded < n0_whole);
  auto ts = BuildTemplates(p);
  REQUIRE(ts.ok());
  CHECK(ts->min_nodes == n0_sharded);
  // The largest template leaves room for the other S(f+1) - 1 pipelines.
  CHECK(ts->max_nodes() <= 24 - (p.MinPipelines() - 1) * n0_sharded);
  auto inst = Instantiate(p, *ts);
  REQUIRE(inst.ok());
  CHECK(static_cast<int>(inst->pipelines.size()) >= 8);  // 2 rows of 4
  // Fewer pipelines than S(f + 1) are refused, given or not.
  CHECK(InstantiateGiven(p, *ts, {8, 8, 8}).status().code() == ob::Code::kConfig);
  CHECK_THAT(InstantiateGiven(p, *ts, {8, 8, 8}).status().message(),
             Catch::Contains("with the optimizer state in 4") && Catch::Contains("needs at least 8"));
  Problem small = p;
  small.cluster.nodes = 8 * n0_sharded - 1;
  auto cut = BuildTemplates(small);
  CHECK(cut.status().code() == ob::Code::kConfig);
  CHECK_THAT(cut.status().message(), Catch::Contains("with the optimizer state in 4"));
}

TEST_CASE("sharded state: the plan keeps S, and a plan without it is unsharded") {
  Problem p = ShardTestProblem(16, 1);
  p.shards = 2;
  auto ts = BuildTemplates(p);
  REQUIRE(ts.ok());
  auto inst = Instantiate(p, *ts);
  REQUIRE(inst.ok());
  const ob::pb::Profile profile = testing::ProfileOf(p);
  PlanMeta meta;
  meta.profile = &profile;
  meta.global_batch = p.microbatches;
  ob::pb::Plan plan = ToProto(p, *ts, *inst, meta);
  CHECK(plan.optimizer_shards() == 2);
  auto loaded = FromProto(plan);
  REQUIRE(loaded.ok());
  CHECK(loaded->problem.shards == 2);
  plan.clear_optimizer_shards();
  loaded = FromProto(plan);
  REQUIRE(loaded.ok());
  CHECK(loaded->problem.shards == 1);
}
