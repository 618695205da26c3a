#include "plan_testing.h"

#include <random>

#include "ob/plan/instantiation.h"
#include "ob/plan/templates.h"

namespace ob::plan::testing {

Problem RandomProblem(uint64_t seed, const RandomProblemOptions& o) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Problem p;
  const int layers = pick(3, o.max_layers);
  uint64_t total_state = 0, max_layer = 0;
  for (int i = 0; i < layers; ++i) {
    LayerCost c;
    c.forward = uniform(0.5e-3, 5e-3);
    c.backward = c.forward * uniform(1.5, 2.5);
    c.state_bytes = static_cast<uint64_t>(uniform(1, 100)) << 20;
    c.gradient_bytes = c.state_bytes / 4;
    c.activation_bytes = static_cast<uint64_t>(uniform(1, 50)) << 20;
    c.output_bytes = static_cast<uint64_t>(uniform(0.1, 8) * (1 << 20));
    c.is_block = i > 0 && i + 1 < layers;
    total_state += c.state_bytes + 4 * c.activation_bytes;
    max_layer = std::max(max_layer, c.state_bytes + 4 * c.activation_bytes);
    p.layers.push_back(c);
  }
  p.cluster.nodes = pick(1, o.max_nodes);
  p.cluster.gpus_per_node = pick(1, o.max_gpus_per_node);
  p.cluster.gpu_memory = static_cast<uint64_t>(uniform(static_cast<double>(max_layer),
                                                       static_cast<double>(total_state)));
  p.cluster.link_bytes_per_s = uniform(1e9, 25e9);
  p.cluster.link_latency = uniform(1e-6, 50e-6);
  p.cluster.intra_bytes_per_s = uniform(50e9, 300e9);
  p.faults = pick(0, o.max_faults);
  p.microbatch_size = 1;
  p.microbatches = pick(p.faults + 1, 4 * (p.faults + 1) + 8);
  p.sequence_length = 128;
  p.n_embd = 256;
  p.n_head = 4;
  return p;
}

pb::Profile ProfileOf(const Problem& p) {
  pb::Profile prof;
  prof.set_mode(pb::PROFILE_ANALYTIC);
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
    l->set_kind(i == 0 ? pb::LAYER_EMBED
                       : (i + 1 == p.num_layers() ? pb::LAYER_HEAD : pb::LAYER_BLOCK));
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

Problem UniformProblem(int blocks, int nodes, int faults, int microbatches, int gpus_per_node) {
  Problem p;
  auto layer = [](double f, uint64_t state, uint64_t act, uint64_t out, bool block) {
    LayerCost c;
    c.forward = f;
    c.backward = 2 * f;
    c.state_bytes = state;
    c.gradient_bytes = state / 4;
    c.activation_bytes = act;
    c.output_bytes = out;
    c.is_block = block;
    return c;
  };
  p.layers.push_back(layer(0.2e-3, 64 << 20, 1 << 20, 1 << 20, false));
  for (int i = 0; i < blocks; ++i) p.layers.push_back(layer(2e-3, 96 << 20, 8 << 20, 1 << 20, true));
  p.layers.push_back(layer(3e-3, 64 << 20, 16 << 20, 4, false));
  p.cluster.nodes = nodes;
  p.cluster.gpus_per_node = gpus_per_node;
  p.cluster.gpu_memory = 64ull << 30;
  p.faults = faults;
  p.microbatch_size = 1;
  p.microbatches = microbatches;
  p.sequence_length = 1024;
  p.n_embd = 1024;
  p.n_head = 16;
  return p;
}

LoadedPlan TwoNodeStagesPlan(int nodes, int faults) {
  LoadedPlan lp;
  lp.problem = UniformProblem(4, nodes, faults, 8);
  for (uint64_t mib = 1024; mib >= 128; mib -= 16) {
    lp.problem.cluster.gpu_memory = mib << 20;
    auto ts = BuildTemplates(lp.problem);
    if (ts.ok() && ts->min_nodes == 2) {
      lp.templates = *ts;
      break;
    }
  }
  if (lp.templates.min_nodes != 2) return lp;
  auto inst = Instantiate(lp.problem, lp.templates);
  if (inst.ok()) lp.instantiation = *inst;
  for (int n = 0; n < nodes; ++n) lp.hosts.push_back("h" + std::to_string(n));
  return lp;
}

}  // namespace ob::plan::testing
