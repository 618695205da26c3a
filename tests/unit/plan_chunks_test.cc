// Chunked templates in the plan (design/schedule.md, Chunks): ob-plan
// --schedule interleaved or zb-v cuts each template of two or more stages
// into S·v slices of about equal compute, each stage's memory at its
// order's worst moment, Seconds the orders' own makespan at the points it
// was timed, and the plan file carries slices and chunks back exactly;
// Validate and the recovery's fetch lists read a node's several ranges.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "ob/plan/plan_io.h"
#include "ob/plan/recovery.h"
#include "ob/plan/schedule.h"
#include "ob/plan/templates.h"
#include "ob/schedule/schedule.h"
#include "ob/schedule/timing.h"
#include "plan_testing.h"

namespace ob::plan {
namespace {

Problem ChunkProblem(const char* schedule, int nodes, int microbatches) {
  Problem p = testing::UniformProblem(16, nodes, 0, microbatches);
  for (auto& l : p.layers) {
    if (!l.is_block) continue;
    l.weight_grad = l.backward / 3;
    l.weight_input_bytes = 1 << 20;
  }
  p.schedules = {schedule::Find(schedule)};
  return p;
}

TEST_CASE("chunked templates: slices tile the layers, Seconds is the orders' makespan, memory their peak",
          "[plan][chunks]") {
  for (const char* name : {"interleaved", "zb-v"}) {
    const Problem p = ChunkProblem(name, 4, 16);
    auto ts = BuildTemplates(p);
    REQUIRE(ts.ok());
    for (const Template& t : ts->templates) {
      INFO(name << ", " << t.nodes << " nodes");
      const int S = static_cast<int>(t.stages.size());
      if (S < 2) {
        CHECK(t.chunks == 1);  // no fill to cut
        continue;
      }
      REQUIRE(t.schedule == schedule::Find(name));
      REQUIRE(t.chunks >= 2);
      REQUIRE(static_cast<int>(t.slices.size()) == S * t.chunks);
      // The slices cover the layers in order; every layer's stage is its
      // slice's; a stage's first range is its chunk 0's.
      int next = 0;
      const schedule::Chain chain = t.chain();
      for (int k = 0; k < static_cast<int>(t.slices.size()); ++k) {
        CHECK(t.slices[k].first == next);
        for (int l = t.slices[k].first; l <= t.slices[k].last; ++l) CHECK(t.StageOf(l) == chain.StageOf(k));
        next = t.slices[k].last + 1;
      }
      CHECK(next == p.num_layers());
      for (int i = 0; i < S; ++i) CHECK(t.LayersOf(i).front() == std::make_pair(t.stages[i].first, t.stages[i].last));
      if (std::string(name) == "zb-v") {  // the embedding and the head on stage 0
        CHECK(t.StageOf(0) == 0);
        CHECK(t.StageOf(p.num_layers() - 1) == 0);
      }
      // Seconds at 1 and at the point it was timed at: the orders' makespan.
      REQUIRE(t.op_costs.size() == t.slices.size());
      CHECK(t.Seconds(1) == Approx(schedule::Makespan(*t.schedule, t.op_costs, 1, t.chunks)).epsilon(1e-12));
      CHECK(t.Seconds(t.saved_at) <=
            schedule::Makespan(*t.schedule, t.op_costs, t.saved_at, t.chunks) * (1 + 1e-12));
      for (int m = 1; m < 40; ++m) CHECK(t.Seconds(m + 1) >= t.Seconds(m));
      // Memory: each stage at its order's worst moment, within the GPU.
      for (int i = 0; i < S; ++i) {
        CHECK(t.stage_memory[i] == StageMemoryOf(p, t, i, std::min(16, 2 * S)));
        CHECK(t.stage_memory[i] <= p.cluster.gpu_memory);
      }
      // The all-reduce of a chunk's gradients runs while the node's other
      // chunks still compute: some of the node's is hidden, never more than all.
      CHECK(t.allreduce_hidden > 0);
      CHECK(t.allreduce_hidden <= AllReduceSeconds(p, t.node_gradient_bytes));
      // The simulated pipeline runs every chunk's ops (and a drawing names them).
      const auto ops = SimulatePipeline(p, t, 8, {}, nullptr);
      CHECK(ops.size() == static_cast<size_t>(S * t.chunks * 8 * (t.schedule->splits_backward ? 3 : 2)));
    }
  }
}

TEST_CASE("a chunked stage's memory: one chunk equals the single-range form, two add each chunk's own size",
          "[plan][chunks]") {
  Problem p = ChunkProblem("interleaved", 2, 8);
  p.cluster.overhead_bytes = 1000;
  StageShape a{1, 4, 1}, b{9, 12, 1};
  const std::vector<schedule::Op> one{{schedule::Op::kForward, 0}, {schedule::Op::kForward, 1},
                                      {schedule::Op::kBackward, 0}, {schedule::Op::kBackward, 1}};
  const uint64_t single = StageMemoryBytes(p, 1, 4, 1, 2);
  CHECK(StageMemoryBytes(p, {a}, one) <= single);
  CHECK(StageMemoryBytes(p, {a}, one) + 4 >= single);
  // F0 of both chunks held at once: both chunks' activations, and both weights.
  const std::vector<schedule::Op> two{{schedule::Op::kForward, 0, 0}, {schedule::Op::kForward, 0, 1},
                                      {schedule::Op::kBackward, 0, 1}, {schedule::Op::kBackward, 0, 0}};
  const uint64_t both = StageMemoryBytes(p, {a, b}, two);
  CHECK(both + p.cluster.overhead_bytes + 8 >= StageMemoryBytes(p, 1, 4, 1, 1) + StageMemoryBytes(p, 9, 12, 1, 1));
  CHECK(both < StageMemoryBytes(p, 1, 4, 1, 1) + StageMemoryBytes(p, 9, 12, 1, 1));  // one overhead, not two
}

TEST_CASE("a chunked plan: the file carries slices and chunks back, Validate and fetch lists read every range",
          "[plan][chunks]") {
  const Problem p = ChunkProblem("zb-v", 4, 16);
  auto ts = BuildTemplates(p);
  REQUIRE(ts.ok());
  auto inst = Instantiate(p, *ts);
  REQUIRE(inst.ok());
  CHECK(Validate(p, *ts, *inst) == "");
  const pb::Profile profile = testing::ProfileOf(p);
  PlanMeta meta;
  meta.global_batch = 16;
  meta.profile = &profile;
  for (int i = 0; i < 4; ++i) meta.hosts.push_back("h" + std::to_string(i));
  const pb::Plan plan = ToProto(p, *ts, *inst, meta);
  const pb::PipelineTemplate* chunked = nullptr;
  for (const auto& t : plan.templates())
    if (t.chunks() > 1) chunked = &t;
  REQUIRE(chunked != nullptr);
  CHECK(chunked->schedule() == "zb-v");
  CHECK(chunked->slices_size() == chunked->stages_size() * 2);
  auto back = FromProto(plan);
  INFO(back.status().message());
  REQUIRE(back.ok());
  for (size_t i = 0; i < ts->templates.size(); ++i) {
    const Template& a = ts->templates[i];
    const Template& b = back->templates.templates[i];
    CHECK(b.chunks == a.chunks);
    REQUIRE(b.slices.size() == a.slices.size());
    for (size_t k = 0; k < a.slices.size(); ++k) {
      CHECK(b.slices[k].first == a.slices[k].first);
      CHECK(b.slices[k].last == a.slices[k].last);
      CHECK(b.slices[k].node == a.slices[k].node);
    }
    if (a.chunks > 1) CHECK(b.OrderCosts() == a.OrderCosts());  // what the workers order by
  }
  // Slices that do not cover the layers, or chunks under a one-chunk
  // schedule: the file is refused, naming the template.
  pb::Plan gap = plan;
  for (auto& t : *gap.mutable_templates())
    if (t.chunks() > 1) t.mutable_slices(1)->set_first_layer(t.slices(1).first_layer() + 1);
  CHECK_THAT(FromProto(gap).status().message(), Catch::Contains("slices do not cover layers"));
  pb::Plan wrong = plan;
  for (auto& t : *wrong.mutable_templates())
    if (t.chunks() > 1) t.set_schedule("zb-h1");
  CHECK_THAT(FromProto(wrong).status().message(), Catch::Contains("chunks a stage under schedule zb-h1"));
  // A GPU too small for what a chunked stage holds: Validate names its ranges.
  Problem small = p;
  small.cluster.gpu_memory = 1;
  const std::string why = Validate(small, *ts, *inst);
  CHECK_THAT(why, Catch::Contains("needs") && Catch::Contains(","));
  // A node lost: the fetch list brings every layer of the new pipelines'
  // nodes that they do not hold, over all their ranges.
  const int gone = inst->pipelines.front().nodes.front();
  const Recovery r = Reinstantiate(p, *ts, *inst, {gone});
  CHECK(r.ok);
  if (r.ok) {
    for (const auto& pipe : r.next.pipelines) {
      const Template* t = ts->ForNodes(pipe.template_nodes);
      REQUIRE(t != nullptr);
      for (int pos = 0; pos < t->nodes; ++pos)
        for (int i = t->FirstStageOn(pos); i <= t->LastStageOn(pos); ++i)
          for (const auto& [first, last] : t->LayersOf(i))
            for (int l = first; l <= last; ++l) {
              // Either it held the layer in the old layout, or it fetches it.
              bool held = false, fetched = false;
              for (size_t j = 0; j < inst->pipelines.size(); ++j) {
                const auto& old = inst->pipelines[j];
                const Template* ot = ts->ForNodes(old.template_nodes);
                for (int q = 0; q < ot->nodes; ++q)
                  if (old.nodes[q] == pipe.nodes[pos] && ot->StageOf(l) >= ot->FirstStageOn(q) &&
                      ot->StageOf(l) <= ot->LastStageOn(q))
                    held = true;
              }
              for (const auto& f : r.fetches) fetched = fetched || (f.node == pipe.nodes[pos] && f.layer == l);
              CHECK((held || fetched));
            }
    }
  }
}

}  // namespace
}  // namespace ob::plan
