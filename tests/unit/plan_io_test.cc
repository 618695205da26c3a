// Plans survive the round trip through protobuf: the master rebuilds the
// planner's view (problem, templates, instantiation) from the file alone.
#include <catch2/catch.hpp>

#include "ob/io/message.h"
#include "ob/plan/explain.h"
#include "ob/plan/plan_io.h"
#include "ob/plan/recovery.h"
#include "ob/schedule/schedule.h"
#include "plan_testing.h"

namespace {

using ob::plan::testing::ProfileOf;

// A planned problem and its Plan protobuf, hosts named host0, host1, ...
struct Planned {
  ob::plan::Problem problem;
  ob::pb::Profile profile;
  ob::plan::TemplateSet templates;
  ob::plan::Instantiation instantiation;
  std::vector<std::string> hosts;
  ob::pb::Plan plan;
};

Planned PlanUniform(int blocks, int nodes, int faults, int microbatches) {
  Planned out;
  out.problem = ob::plan::testing::UniformProblem(blocks, nodes, faults, microbatches);
  out.profile = ProfileOf(out.problem);
  auto ts = ob::plan::BuildTemplates(out.problem);
  REQUIRE(ts.ok());
  out.templates = *ts;
  auto inst = ob::plan::Instantiate(out.problem, out.templates);
  REQUIRE(inst.ok());
  out.instantiation = *inst;
  ob::plan::PlanMeta meta;
  meta.global_batch = microbatches;
  meta.profile = &out.profile;
  for (int i = 0; i < nodes; ++i) meta.hosts.push_back("host" + std::to_string(i));
  out.hosts = meta.hosts;
  out.plan = ob::plan::ToProto(out.problem, out.templates, out.instantiation, meta);
  return out;
}

}  // namespace

TEST_CASE("a plan round-trips through protobuf and still recovers") {
  const Planned planned = PlanUniform(10, 8, 1, 32);
  const auto& p = planned.problem;
  const auto* ts = &planned.templates;
  const auto* inst = &planned.instantiation;

  std::string bytes = ob::io::SerializeMessage(planned.plan, ob::io::kPlanFormatVersion);
  ob::pb::Plan back;
  REQUIRE(ob::io::ParseMessage(bytes, "plan.pb", ob::io::kPlanFormatVersion, &back).ok());
  auto loaded = ob::plan::FromProto(back);
  REQUIRE(loaded.ok());
  CHECK(loaded->hosts == planned.hosts);
  CHECK(loaded->problem.num_layers() == p.num_layers());
  CHECK(loaded->problem.microbatches == p.microbatches);
  REQUIRE(loaded->templates.templates.size() == ts->templates.size());
  CHECK(loaded->templates.min_nodes == ts->min_nodes);
  for (size_t i = 0; i < ts->templates.size(); ++i) {
    const auto& a = ts->templates[i];
    const auto& b = loaded->templates.templates[i];
    CHECK(a.nodes == b.nodes);
    CHECK(a.bottleneck == b.bottleneck);
    CHECK(a.total == b.total);
    REQUIRE(a.stages.size() == b.stages.size());
    for (size_t s = 0; s < a.stages.size(); ++s) {
      CHECK(a.stages[s].first == b.stages[s].first);
      CHECK(a.stages[s].last == b.stages[s].last);
    }
  }
  REQUIRE(loaded->instantiation.pipelines.size() == inst->pipelines.size());
  for (size_t i = 0; i < inst->pipelines.size(); ++i) {
    CHECK(loaded->instantiation.pipelines[i].nodes == inst->pipelines[i].nodes);
    CHECK(loaded->instantiation.pipelines[i].microbatches == inst->pipelines[i].microbatches);
  }
  CHECK(ob::plan::Validate(loaded->problem, loaded->templates, loaded->instantiation).empty());
  // The master's path: lose a node, re-instantiate from what the file holds.
  auto r = ob::plan::Reinstantiate(loaded->problem, loaded->templates, loaded->instantiation, {3});
  CHECK(r.ok);
  CHECK(ob::plan::ExplainPlan(back).find("# instantiation") != std::string::npos);
}

TEST_CASE("inconsistent plans are refused, naming what is wrong") {
  const ob::pb::Plan good = PlanUniform(6, 4, 1, 8).plan;

  auto plan = good;
  plan.mutable_instantiation()->mutable_pipelines(0)->set_node_ids(0, 99);
  CHECK_THAT(ob::plan::FromProto(plan).status().message(), Catch::Contains("node 99"));
  plan = good;
  plan.mutable_templates(0)->mutable_stages(0)->set_last_layer(1000);
  CHECK(ob::plan::FromProto(plan).status().code() == ob::Code::kDataErr);
  plan = good;
  plan.clear_hosts();
  CHECK_THAT(ob::plan::FromProto(plan).status().message(), Catch::Contains("hosts"));
  plan = good;
  plan.mutable_profile()->clear_layers();
  CHECK_THAT(ob::plan::FromProto(plan).status().message(), Catch::Contains("no layers"));
}

TEST_CASE("the plan names the profile it came from by digest") {
  auto p = ob::plan::testing::UniformProblem(6, 4, 1, 8);
  auto profile = ProfileOf(p);
  const std::string d = ob::plan::ProfileDigest(profile);
  CHECK(d.size() == 5 + 16);
  CHECK(d.rfind("xxh3:", 0) == 0);
  profile.mutable_layers(1)->mutable_costs(0)->set_forward_seconds(1.0);
  CHECK(ob::plan::ProfileDigest(profile) != d);
}

TEST_CASE("ob-plan's --measured puts a run's steps beside the plan's predictions") {
  const Planned planned = PlanUniform(6, 4, 1, 8);
  const ob::pb::Plan& plan = planned.plan;
  const auto& in = plan.instantiation();
  REQUIRE(in.pipelines_size() >= 2);
  // Two generations; only the first, after its warm-up steps, counts: its
  // steps take twice the prediction, every stage computes 1.5× its own.
  std::vector<ob::pb::Metrics> records;
  uint32_t rank = 0;
  for (int i = 0; i < in.pipelines_size(); ++i) {
    const auto* t = &plan.templates(0);
    for (const auto& c : plan.templates())
      if (c.nodes() == in.pipelines(i).template_nodes()) t = &c;
    for (int j = 0; j < t->stages_size(); ++j, ++rank) {
      const double compute = t->stages(j).compute_seconds() * in.pipelines(i).microbatches();
      for (uint64_t step = 0; step < 12; ++step) {
        ob::pb::Metrics m;
        m.set_rank(rank);
        m.set_pipeline(static_cast<uint32_t>(i));
        m.set_stage(static_cast<uint32_t>(j));
        m.set_generation(1);
        m.set_step(step);
        const bool warm = step >= ob::plan::kMeasuredWarmupSteps;
        m.set_step_seconds(in.iteration_seconds() * (warm ? 2 : 50));
        m.set_forward_seconds(compute * (warm ? 0.5 : 20));
        m.set_backward_seconds(compute * (warm ? 1.0 : 20));
        m.set_peak_memory_bytes(t->stages(j).memory_bytes() * 2);
        records.push_back(m);
        m.set_generation(2);
        m.set_step_seconds(in.iteration_seconds() * 9);
        records.push_back(m);
        ob::pb::Metrics beat;  // heartbeats carry no step time
        beat.set_heartbeat(true);
        beat.set_rank(rank);
        beat.set_generation(1);
        beat.set_step(step);
        records.push_back(beat);
      }
    }
  }
  auto got = ob::plan::CompareMeasured(plan, records, "run.m");
  REQUIRE(got.ok());
  INFO(*got);
  CHECK_THAT(*got, Catch::Contains("# measured (run.m: generation 1, steps 5-11"));
  CHECK_THAT(*got, Catch::Contains("(2.00x)"));
  // Every stage row: compute ratio 1.50, memory ratio 2.00 (a GPU profile:
  // the stage's memory alone).
  size_t rows = 0;
  for (size_t at = got->find("  1.50 "); at != std::string::npos; at = got->find("  1.50 ", at + 1)) ++rows;
  CHECK(rows == rank);
  CHECK(got->find("  2.00\n") != std::string::npos);

  // A file without a step after the warm-up, or of another plan, is refused.
  std::vector<ob::pb::Metrics> early(records.begin(), records.begin() + 3);
  early[0].set_step(1);
  early[1].set_step(1);
  auto none = ob::plan::CompareMeasured(plan, early, "run.m");
  CHECK(none.status().code() == ob::Code::kDataErr);
  CHECK_THAT(none.status().message(), Catch::Contains("run.m: no step of rank 0"));
  records[3 * 6].set_pipeline(99);  // generation 1, step 6
  auto other = ob::plan::CompareMeasured(plan, records, "run.m");
  CHECK(other.status().code() == ob::Code::kDataErr);
  CHECK_THAT(other.status().message(), Catch::Contains("not a run of this plan"));
}

TEST_CASE("a mixed template round-trips and one whose stages do not fill their nodes is refused") {
  // plan_templates_test's case: the head alone on node 1's two GPUs.
  Planned out;
  out.problem = ob::plan::testing::UniformProblem(4, 2, 0, 32, 2);
  out.problem.cluster.intra_bytes_per_s = 2.796e9;
  out.problem.layers.back().forward = 8e-3;
  out.problem.layers.back().backward = 16e-3;
  out.problem.mixed_stages = true;
  out.profile = ProfileOf(out.problem);
  auto ts = ob::plan::BuildTemplates(out.problem);
  REQUIRE(ts.ok());
  const ob::plan::Template* t = ts->ForNodes(2);
  REQUIRE(t);
  REQUIRE(t->mixed());
  auto inst = ob::plan::Instantiate(out.problem, *ts);
  REQUIRE(inst.ok());
  ob::plan::PlanMeta meta;
  meta.global_batch = 32;
  meta.profile = &out.profile;
  meta.hosts = {"host0", "host1"};
  const ob::pb::Plan plan = ob::plan::ToProto(out.problem, *ts, *inst, meta);
  CHECK(plan.templates(1).stages_per_node() == 0);
  CHECK(plan.templates(1).stages(2).node() == 1);
  auto loaded = ob::plan::FromProto(plan);
  REQUIRE(loaded.ok());
  const ob::plan::Template* back = loaded->templates.ForNodes(2);
  REQUIRE(back);
  CHECK(back->mixed());
  REQUIRE(back->stages.size() == t->stages.size());
  for (size_t s = 0; s < t->stages.size(); ++s) {
    CHECK(back->stages[s].first == t->stages[s].first);
    CHECK(back->stages[s].tp == t->stages[s].tp);
    CHECK(back->NodeOf(static_cast<int>(s)) == t->NodeOf(static_cast<int>(s)));
  }
  CHECK_THAT(ob::plan::ExplainPlan(plan), Catch::Contains("mix mix"));

  auto bad = plan;  // node 0's stages would use 3 of its 2 GPUs
  bad.mutable_templates(1)->mutable_stages(1)->set_tensor_parallel(2);
  CHECK_THAT(ob::plan::FromProto(bad).status().message(), Catch::Contains("use more than 2 GPUs"));
  bad = plan;  // node 1 left with one of its two GPUs
  bad.mutable_templates(1)->mutable_stages(2)->set_tensor_parallel(1);
  CHECK_THAT(ob::plan::FromProto(bad).status().message(), Catch::Contains("fill"));
  bad = plan;  // a stage on a node after a node it left half empty
  bad.mutable_templates(1)->mutable_stages(1)->set_node(1);
  CHECK_THAT(ob::plan::FromProto(bad).status().message(), Catch::Contains("after node 0's 1 of 2 GPUs"));
}

TEST_CASE("a zero-bubble template's workers make, from the file, the order the planner timed") {
  ob::plan::Problem p = ob::plan::testing::UniformProblem(10, 6, 1, 24);
  for (auto& l : p.layers) {
    if (!l.is_block) continue;
    l.weight_grad = l.backward * 0.3;  // W cheaper than F: orders at these costs differ from unit ones
    l.weight_input_bytes = 1 << 20;
  }
  p.schedules = ob::schedule::All();
  const ob::pb::Profile profile = ProfileOf(p);
  auto ts = ob::plan::BuildTemplates(p);
  REQUIRE(ts.ok());
  auto inst = ob::plan::Instantiate(p, *ts);
  REQUIRE(inst.ok());
  ob::plan::PlanMeta meta;
  meta.global_batch = 24;
  meta.profile = &profile;
  for (int i = 0; i < 6; ++i) meta.hosts.push_back("host" + std::to_string(i));
  const ob::pb::Plan plan = ob::plan::ToProto(p, *ts, *inst, meta);
  ob::pb::Plan back;
  REQUIRE(ob::io::ParseMessage(ob::io::SerializeMessage(plan, ob::io::kPlanFormatVersion), "plan.pb",
                               ob::io::kPlanFormatVersion, &back)
              .ok());
  auto loaded = ob::plan::FromProto(back);
  REQUIRE(loaded.ok());
  int split = 0, differs = 0;
  for (size_t i = 0; i < ts->templates.size(); ++i) {
    const auto& a = ts->templates[i];
    const auto& b = loaded->templates.templates[i];
    INFO(a.nodes << " nodes, " << a.schedule->name);
    CHECK(b.schedule == a.schedule);
    if (!a.schedule->splits_backward) continue;
    ++split;
    REQUIRE(a.op_costs.size() == a.Virtual().size());
    CHECK(b.chunks == a.chunks);
    CHECK(b.OrderCosts() == a.op_costs);
    for (int m : {1, 3, 8, 24}) {
      const auto orders = ob::schedule::Orders(*a.schedule, a.op_costs, m, a.chunks);
      CHECK(*ob::schedule::Orders(*b.schedule, b.OrderCosts(), m, b.chunks) == *orders);
      if (*orders != *ob::schedule::Orders(*a.schedule, static_cast<int>(a.stages.size()), m, a.chunks)) ++differs;
    }
  }
  CHECK(split > 0);
  CHECK(differs > 0);  // the costs change some order, so carrying them matters
  // A stage's op costs that are not finite and non-negative: the file is refused.
  ob::pb::Plan bad = back;
  for (auto& t : *bad.mutable_templates()) {
    if (t.schedule().empty()) continue;
    t.mutable_stages(0)->set_weight_grad_seconds(-1);
    break;
  }
  auto refused = ob::plan::FromProto(bad);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(), Catch::Contains("op costs"));
}
