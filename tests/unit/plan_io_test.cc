// Plans survive the round trip through protobuf: the master rebuilds the
// planner's view (problem, templates, instantiation) from the file alone.
#include <catch2/catch.hpp>

#include "ob/io/message.h"
#include "ob/plan/explain.h"
#include "ob/plan/plan_io.h"
#include "ob/plan/recovery.h"
#include "plan_testing.h"

namespace {

// A Profile with the costs of `p` (the plan stores and re-reads it).
ob::pb::Profile ProfileOf(const ob::plan::Problem& p) {
  ob::pb::Profile prof;
  prof.set_mode(ob::pb::PROFILE_ANALYTIC);
  prof.mutable_model()->set_name("uniform");
  prof.mutable_model()->set_n_layer(p.num_layers() - 2);
  prof.mutable_model()->set_n_embd(p.n_embd);
  prof.mutable_model()->set_n_head(p.n_head);
  prof.set_sequence_length(p.sequence_length);
  prof.add_microbatch_sizes(1);
  for (int i = 0; i < p.num_layers(); ++i) {
    const auto& c = p.layers[i];
    auto* l = prof.add_layers();
    l->set_index(i);
    l->set_kind(i == 0 ? ob::pb::LAYER_EMBED
                       : (i + 1 == p.num_layers() ? ob::pb::LAYER_HEAD : ob::pb::LAYER_BLOCK));
    l->set_parameter_bytes(c.gradient_bytes);
    l->set_gradient_bytes(c.gradient_bytes);
    l->set_optimizer_state_bytes(c.state_bytes - 2 * c.gradient_bytes);
    auto* cost = l->add_costs();
    cost->set_microbatch(1);
    cost->set_forward_seconds(c.forward);
    cost->set_backward_seconds(c.backward);
    cost->set_activation_bytes(c.activation_bytes);
    cost->set_output_bytes(c.output_bytes);
  }
  return prof;
}

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
