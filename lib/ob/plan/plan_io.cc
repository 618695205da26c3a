#include "ob/plan/plan_io.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <xxhash.h>

#include <cstdio>

#include "ob/clock.h"
#include "ob/io/text.h"
#include "ob/profile/profile.h"

namespace ob::plan {
namespace {

void SetOpCosts(const schedule::StageCosts& c, pb::Stage* st) {
  st->set_forward_seconds(c.forward);
  st->set_input_grad_seconds(c.input_grad);
  st->set_weight_grad_seconds(c.weight_grad);
  st->set_send_seconds(c.send);
  st->set_send_back_seconds(c.send_back);
}

// A stage's or slice's layers, degree and recomputation mode, and its
// compute per micro-batch.
void SetShape(const StageShape& s, double compute_seconds, pb::Stage* st) {
  st->set_first_layer(s.first);
  st->set_last_layer(s.last);
  st->set_gpus(s.tp);
  st->set_tensor_parallel(s.tp);
  st->set_recompute(static_cast<pb::Recompute>(s.recompute));
  st->set_compute_seconds(compute_seconds);
}

void TemplateToProto(const Problem& p, const Template& t, pb::PipelineTemplate* out) {
  out->set_nodes(t.nodes);
  out->set_stages_per_node(t.stages_per_node);
  out->set_tensor_parallel(t.tp);
  out->set_bottleneck_seconds(t.bottleneck);
  out->set_total_seconds(t.total);
  out->set_node_gradient_bytes(t.node_gradient_bytes);
  out->set_update_seconds(t.update_seconds);
  // 1F1B's template keeps the fields of plans before schedules unset.
  if (t.schedule != &schedule::OneFOneB()) {
    out->set_schedule(std::string(t.schedule->name));
    out->set_saved_seconds_one(t.saved_one);
    out->set_saved_seconds(t.saved);
    out->set_saved_at_microbatches(static_cast<uint32_t>(t.saved_at));
  }
  const int S = static_cast<int>(t.stages.size());
  for (int i = 0; i < S; ++i) {
    const StageShape& s = t.stages[i];
    auto* st = out->add_stages();
    double compute = 0;  // with chunks, all its slices'
    for (const StageShape& c : t.ChunksOf(i)) compute += StageComputeSeconds(p, c);
    SetShape(s, compute, st);
    st->set_seconds(t.stage_seconds[i]);
    st->set_memory_bytes(t.stage_memory[i]);
    st->set_memory_capacity_bytes(p.cluster.gpu_memory);
    st->set_node(static_cast<uint32_t>(t.NodeOf(i)));
    const schedule::Held held = t.HeldBy(i);
    st->set_in_flight(static_cast<uint32_t>(held.activations));
    st->set_weight_inputs(static_cast<uint32_t>(held.weight_inputs));
    // Chunked stages: no figure without recomputation (their memory is at
    // their orders' peak), 0 saved.
    const uint64_t plain = t.chunks > 1 ? t.stage_memory[i]
                                        : StageMemoryBytes(p, s.first, s.last, s.tp, held, model::Recompute::kNone);
    st->set_recompute_saved_bytes(plain > t.stage_memory[i] ? plain - t.stage_memory[i] : 0);
    if (t.schedule != &schedule::OneFOneB() && t.chunks <= 1 && t.op_costs.size() == static_cast<size_t>(S))
      SetOpCosts(t.op_costs[static_cast<size_t>(i)], st);
  }
  if (t.chunks > 1) {
    out->set_chunks(static_cast<uint32_t>(t.chunks));
    out->set_allreduce_hidden_seconds(t.allreduce_hidden);
    for (size_t k = 0; k < t.slices.size(); ++k) {
      const StageShape& s = t.slices[k];
      auto* sl = out->add_slices();
      SetShape(s, StageComputeSeconds(p, s), sl);
      sl->set_node(static_cast<uint32_t>(s.node));
      if (t.op_costs.size() == t.slices.size()) SetOpCosts(t.op_costs[k], sl);
    }
  }
}

// The op costs of a stage or slice as the plan stores them, checked.
Result<schedule::StageCosts> OpCostsOf(const pb::Stage& s, const std::string& who) {
  const schedule::StageCosts c{s.forward_seconds(), s.input_grad_seconds(), s.weight_grad_seconds(), s.send_seconds(),
                               s.send_back_seconds()};
  for (double v : {c.forward, c.input_grad, c.weight_grad, c.send, c.send_back}) {
    if (!std::isfinite(v) || v < 0)
      return Status::DataErr(who + ": stage of layers " + std::to_string(s.first_layer()) + "-" +
                             std::to_string(s.last_layer()) + ": op costs must be finite and non-negative");
  }
  return c;
}

// A chunked template's slices (TemplateFromProto): they cover the layers
// in order, S·chunks of them, each stage's first/last its chunk 0's.
Status ReadSlices(const Problem& p, const pb::PipelineTemplate& in, const std::string& who, Template* t) {
  const int S = static_cast<int>(t->stages.size());
  t->chunks = static_cast<int>(in.chunks());
  t->allreduce_hidden = in.allreduce_hidden_seconds();
  if (!std::isfinite(t->allreduce_hidden) || t->allreduce_hidden < 0)
    return Status::DataErr(who + ": allreduce_hidden_seconds must be finite and non-negative");
  if (!t->schedule->chunked() || t->chunks < t->schedule->min_chunks || t->chunks > t->schedule->max_chunks)
    return Status::DataErr(who + ": " + std::to_string(t->chunks) + " chunks a stage under schedule " +
                           std::string(t->schedule->name) + " (it takes " + std::to_string(t->schedule->min_chunks) +
                           " to " + std::to_string(t->schedule->max_chunks) + ")");
  if (t->mixed()) return Status::DataErr(who + ": a mixed template with chunks");
  if (in.slices_size() != S * t->chunks)
    return Status::DataErr(who + ": " + std::to_string(in.slices_size()) + " slices, expected " +
                           std::to_string(S * t->chunks));
  const schedule::Chain chain = t->chain();
  int next = 0;
  t->op_costs.clear();
  for (int k = 0; k < in.slices_size(); ++k) {
    const pb::Stage& s = in.slices(k);
    if (static_cast<int>(s.first_layer()) != next || s.last_layer() < s.first_layer() ||
        static_cast<int>(s.last_layer()) >= p.num_layers())
      return Status::DataErr(who + ": slices do not cover layers 0.." + std::to_string(p.num_layers() - 1) +
                             " in order");
    const StageShape& st = t->stages[chain.StageOf(k)];
    if (!pb::Recompute_IsValid(s.recompute()) || static_cast<int>(s.tensor_parallel()) != st.tp)
      return Status::DataErr(who + ": slice of layers " + std::to_string(s.first_layer()) + "-" +
                             std::to_string(s.last_layer()) + ": its degree or recompute mode is not its stage's");
    StageShape sh{static_cast<int>(s.first_layer()), static_cast<int>(s.last_layer()), st.tp, t->NodeOf(chain.StageOf(k)),
                  static_cast<model::Recompute>(s.recompute())};
    t->slices.push_back(sh);
    OB_ASSIGN_OR_RETURN(schedule::StageCosts c, OpCostsOf(s, who));
    t->op_costs.push_back(c);
    next = sh.last + 1;
  }
  if (next != p.num_layers())
    return Status::DataErr(who + ": slices end at layer " + std::to_string(next - 1) + " of " +
                           std::to_string(p.num_layers() - 1));
  for (int i = 0; i < S; ++i) {
    const StageShape& head = t->slices[chain.At(i, 0)];
    if (t->stages[i].first != head.first || t->stages[i].last != head.last)
      return Status::DataErr(who + ": stage " + std::to_string(i) + " does not name its first chunk's layers");
  }
  return Status::Ok();
}

Result<Template> TemplateFromProto(const Problem& p, const pb::PipelineTemplate& in) {
  Template t;
  t.nodes = static_cast<int>(in.nodes());
  t.stages_per_node = static_cast<int>(in.stages_per_node());
  t.tp = static_cast<int>(in.tensor_parallel());
  t.bottleneck = in.bottleneck_seconds();
  t.total = in.total_seconds();
  t.node_gradient_bytes = in.node_gradient_bytes();
  t.update_seconds = in.update_seconds();
  const std::string who = "template for " + std::to_string(t.nodes) + " nodes";
  t.schedule = schedule::Find(in.schedule());
  if (t.schedule == nullptr)
    return Status::DataErr(who + ": unknown schedule \"" + in.schedule() + "\" (this ob runs " + schedule::Names() + ")");
  t.saved_one = in.saved_seconds_one();
  t.saved = in.saved_seconds();
  t.saved_at = std::max(1, static_cast<int>(in.saved_at_microbatches()));
  // stages_per_node 0: a mixed template, whose stages name their nodes.
  if (t.nodes < 1 || t.tp < 1)
    return Status::DataErr(who + ": nodes and tensor_parallel must be positive");
  if (!t.mixed() && in.stages_size() != t.nodes * t.stages_per_node)
    return Status::DataErr(who + ": " + std::to_string(in.stages_size()) + " stages, expected " +
                           std::to_string(t.nodes * t.stages_per_node));
  const int g = p.cluster.gpus_per_node;
  const bool chunked = in.chunks() > 1;  // stages name their chunk 0's layers: ReadSlices checks them
  int next = 0, node = 0, node_gpus = 0;
  for (const auto& s : in.stages()) {
    if (!chunked && (static_cast<int>(s.first_layer()) != next || s.last_layer() < s.first_layer() ||
                     static_cast<int>(s.last_layer()) >= p.num_layers()))
      return Status::DataErr(who + ": stages do not cover layers 0.." +
                             std::to_string(p.num_layers() - 1) + " in order");
    if (t.mixed()) {  // nodes in order, each used and filled by its stages (the runtime checks degrees)
      const int n = static_cast<int>(s.node());
      if (n == node + 1 && node_gpus == g) {
        node = n, node_gpus = 0;
      } else if (n != node) {
        return Status::DataErr(who + ": stage on node " + std::to_string(n) + " after node " +
                               std::to_string(node) + "'s " + std::to_string(node_gpus) + " of " +
                               std::to_string(g) + " GPUs");
      }
      node_gpus += static_cast<int>(s.tensor_parallel());
      if (node_gpus > g)
        return Status::DataErr(who + ": node " + std::to_string(n) + "'s stages use more than " +
                               std::to_string(g) + " GPUs");
    }
    if (!pb::Recompute_IsValid(s.recompute()))
      return Status::DataErr(who + ": stage of layers " + std::to_string(s.first_layer()) + "-" +
                             std::to_string(s.last_layer()) + ": unknown recompute mode " +
                             std::to_string(s.recompute()));
    t.stages.push_back({static_cast<int>(s.first_layer()), static_cast<int>(s.last_layer()),
                        static_cast<int>(s.tensor_parallel()), static_cast<int>(s.node()),
                        static_cast<model::Recompute>(s.recompute())});
    t.stage_seconds.push_back(s.seconds());
    t.stage_memory.push_back(s.memory_bytes());
    t.stage_held.push_back({static_cast<int>(s.in_flight()), static_cast<int>(s.weight_inputs())});
    OB_ASSIGN_OR_RETURN(schedule::StageCosts c, OpCostsOf(s, who));
    t.op_costs.push_back(c);
    next = static_cast<int>(s.last_layer()) + 1;
  }
  if (chunked) {
    OB_RETURN_IF_ERROR(ReadSlices(p, in, who, &t));
    next = p.num_layers();
  } else if (in.slices_size() > 0) {
    return Status::DataErr(who + ": slices without chunks");
  }
  if (next != p.num_layers())
    return Status::DataErr(who + ": stages end at layer " + std::to_string(next - 1) + " of " +
                           std::to_string(p.num_layers() - 1));
  if (t.mixed() && (node != t.nodes - 1 || node_gpus != g))
    return Status::DataErr(who + ": its stages fill " + std::to_string(node + 1) + " node(s), not " +
                           std::to_string(t.nodes));
  return t;
}

}  // namespace

std::string ProfileDigest(const pb::Profile& profile) {
  std::string bytes;
  profile.SerializeToString(&bytes);
  return io::HashText("xxh3:", XXH3_64bits(bytes.data(), bytes.size()));
}

double BubbleFraction(const TemplateSet& ts, const Instantiation& inst, const PipelineTimes& times) {
  double all = 0;
  for (const auto& pipe : inst.pipelines)
    if (const Template* t = ts.ForNodes(pipe.template_nodes)) all += t->stages.size() * inst.iteration_seconds;
  return all > 0 ? 1.0 - times.busy / all : 0.0;
}

void SetInstantiation(const Problem& p, const TemplateSet& ts, const Instantiation& inst,
                      pb::Plan* plan) {
  auto* in = plan->mutable_instantiation();
  in->Clear();
  const PipelineTimes times = TimePipelines(p, ts, inst);
  for (size_t j = 0; j < inst.pipelines.size(); ++j) {
    const auto& pipe = inst.pipelines[j];
    auto* out = in->add_pipelines();
    out->set_template_nodes(pipe.template_nodes);
    for (int id : pipe.nodes) {
      out->add_node_ids(id);
      out->add_nodes(id < plan->hosts_size() ? plan->hosts(id) : "node" + std::to_string(id));
    }
    out->set_microbatches(pipe.microbatches);
    if (j < times.seconds.size()) out->set_seconds(times.seconds[j]);
    if (j < times.stage_busy.size())
      for (double b : times.stage_busy[j]) out->add_stage_compute_seconds(b);
  }
  in->set_iteration_seconds(inst.iteration_seconds);
  if (inst.iteration_seconds > 0 && plan->global_batch() > 0)
    in->set_tokens_per_second(static_cast<double>(plan->global_batch()) * p.sequence_length /
                              inst.iteration_seconds);
  in->set_bubble_fraction(BubbleFraction(ts, inst, times));
}

pb::Plan ToProto(const Problem& p, const TemplateSet& ts, const Instantiation& inst,
                 const PlanMeta& meta) {
  pb::Plan plan;
  plan.set_created_unix_ms(UnixMs());
  if (meta.profile) {
    *plan.mutable_model() = meta.profile->model();
    *plan.mutable_profile() = *meta.profile;
    plan.set_profile_digest(ProfileDigest(*meta.profile));
  }
  if (meta.bandwidth) *plan.mutable_bandwidth() = *meta.bandwidth;
  plan.set_faults(p.faults);
  if (p.shards > 1) plan.set_optimizer_shards(static_cast<uint32_t>(p.shards));
  plan.set_nodes(p.cluster.nodes);
  plan.set_gpus_per_node(p.cluster.gpus_per_node);
  plan.set_min_nodes(ts.min_nodes);
  plan.set_global_batch(meta.global_batch);
  plan.set_microbatch(p.microbatch_size);
  plan.set_microbatches(p.microbatches);
  plan.set_sequence_length(p.sequence_length);
  plan.set_gpu_memory_bytes(p.cluster.gpu_memory);
  plan.set_seed(meta.seed);
  auto* c = plan.mutable_cluster();
  c->set_link_bytes_per_s(p.cluster.link_bytes_per_s);
  c->set_link_latency_seconds(p.cluster.link_latency);
  c->set_intra_node_bytes_per_s(p.cluster.intra_bytes_per_s);
  c->set_overhead_bytes(p.cluster.overhead_bytes);
  c->set_overhead_fraction(p.cluster.overhead_fraction);
  c->set_local(p.cluster.local);
  for (int i = 0; i < p.cluster.nodes; ++i)
    plan.add_hosts(i < static_cast<int>(meta.hosts.size()) ? meta.hosts[i] : "node" + std::to_string(i));
  for (const auto& t : ts.templates) TemplateToProto(p, t, plan.add_templates());

  auto* in = plan.mutable_instantiation();
  SetInstantiation(p, ts, inst, &plan);
  if (inst.iteration_seconds > 0)
    in->set_tokens_per_second(static_cast<double>(meta.global_batch) * p.sequence_length /
                              inst.iteration_seconds);
  in->set_placed_iteration_seconds(meta.placed_seconds);
  in->set_identity_iteration_seconds(meta.identity_seconds);
  return plan;
}

Result<LoadedPlan> FromProto(const pb::Plan& plan) {
  Cluster cluster;
  cluster.nodes = static_cast<int>(plan.nodes());
  cluster.gpus_per_node = static_cast<int>(plan.gpus_per_node());
  cluster.gpu_memory = plan.gpu_memory_bytes();
  cluster.link_bytes_per_s = plan.cluster().link_bytes_per_s();
  cluster.link_latency = plan.cluster().link_latency_seconds();
  cluster.intra_bytes_per_s = plan.cluster().intra_node_bytes_per_s();
  cluster.overhead_bytes = plan.cluster().overhead_bytes();
  cluster.overhead_fraction = plan.cluster().overhead_fraction();
  cluster.local = plan.cluster().local();  // MakeProblem fits its collectives again
  auto problem = MakeProblem(plan.profile(), cluster, static_cast<int>(plan.faults()),
                             static_cast<int>(plan.global_batch()), static_cast<int>(plan.microbatch()));
  if (!problem.ok()) return problem.status().WithContext("plan's profile");
  LoadedPlan out;
  out.problem = std::move(problem).value();
  out.problem.shards = std::max<int>(1, static_cast<int>(std::min<uint32_t>(plan.optimizer_shards(), 1u << 20)));
  const Problem& p = out.problem;
  out.hosts.assign(plan.hosts().begin(), plan.hosts().end());
  if (static_cast<int>(out.hosts.size()) != cluster.nodes)
    return Status::DataErr("plan lists " + std::to_string(out.hosts.size()) + " hosts for " +
                           std::to_string(cluster.nodes) + " nodes");
  out.templates.min_nodes = static_cast<int>(plan.min_nodes());
  for (int i = 0; i < plan.templates_size(); ++i) {
    OB_ASSIGN_OR_RETURN(Template t, TemplateFromProto(p, plan.templates(i)));
    if (t.nodes != out.templates.min_nodes + i)
      return Status::DataErr("plan's templates are not consecutive from n0 = " +
                             std::to_string(out.templates.min_nodes));
    out.templates.templates.push_back(std::move(t));
  }
  std::set<int> seen;
  for (const auto& pipe : plan.instantiation().pipelines()) {
    PipelineInstance pi;
    pi.template_nodes = static_cast<int>(pipe.template_nodes());
    pi.microbatches = static_cast<int>(pipe.microbatches());
    if (!out.templates.ForNodes(pi.template_nodes) ||
        pipe.node_ids_size() != pi.template_nodes)
      return Status::DataErr("plan's pipeline on " + std::to_string(pipe.node_ids_size()) +
                             " nodes has no template of that size");
    for (uint32_t id : pipe.node_ids()) {
      if (static_cast<int>(id) >= cluster.nodes || !seen.insert(static_cast<int>(id)).second)
        return Status::DataErr("plan's pipelines name node " + std::to_string(id) +
                               " twice or out of range");
      pi.nodes.push_back(static_cast<int>(id));
    }
    out.instantiation.pipelines.push_back(std::move(pi));
  }
  out.instantiation.iteration_seconds = plan.instantiation().iteration_seconds();
  return out;
}

}  // namespace ob::plan
