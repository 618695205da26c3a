#include "ob/plan/problem.h"

#include <algorithm>
#include <cmath>

namespace ob::plan {
namespace {

// design/formulas.md: block activations per micro-batch are s·b·h·(34 + 5as/h) without
// tensor parallelism and s·b·h·(10 + 24/t + 5as/(ht)) with it; the ratio
// scales a measured or analytic figure to degree t.
double TensorParallelActivationFactor(const Problem& p, int tp) {
  if (tp <= 1 || p.n_embd <= 0) return 1.0;
  const double attn = 5.0 * p.n_head * p.sequence_length / p.n_embd;
  return (10.0 + 24.0 / tp + attn / tp) / (34.0 + attn);
}

// The selective mode's share of design/formulas.md (the MLP activation's
// output no longer kept) and its tensor-parallel counterpart: the same
// ratio as the TP factor, the 8 of the activation split over t.
double SelectiveTensorParallelFactor(int tp) { return tp <= 1 ? 1.0 : (10.0 + 16.0 / tp) / 26.0; }

// What a layer keeps per micro-batch in mode r on one of tp ranks.
double KeptBytes(const Problem& p, const LayerCost& c, int tp, model::Recompute r) {
  const size_t m = static_cast<size_t>(r);
  if (!c.is_block || r == model::Recompute::kNone || !p.has_recompute_costs) {
    return static_cast<double>(c.activation_bytes) * (c.is_block ? TensorParallelActivationFactor(p, tp) : 1.0 / tp);
  }
  if (r == model::Recompute::kFull) return static_cast<double>(c.kept_bytes[m]);  // its input, whole on every rank
  return static_cast<double>(c.kept_bytes[m]) * SelectiveTensorParallelFactor(tp);
}

}  // namespace

double StageComputeSeconds(const Problem& p, const StageShape& s) {
  return StageComputeSeconds(p, s.first, s.last, s.tp, s.recompute);
}

double StageComputeSeconds(const Problem& p, int first, int last, int tp, model::Recompute r) {
  double compute = 0;
  int blocks = 0;
  const bool recomputes = r != model::Recompute::kNone && p.has_recompute_costs;
  for (int l = first; l <= last; ++l) {
    compute += p.layers[l].forward + p.layers[l].backward;
    if (recomputes && p.layers[l].is_block) compute += p.layers[l].recompute_seconds[static_cast<size_t>(r)];
    blocks += p.layers[l].is_block ? 1 : 0;
  }
  if (tp <= 1) return compute;
  // The tensor-parallel all-reduces of one micro-batch (model/gpt.cc): a
  // block's 2 forward and 2 backward of b·s·h activations; the
  // vocabulary-parallel embedding's 1 (its output) and the head's 1 (its
  // input's gradient) of b·s·h; and the head's cross-entropy's 3 of b·s
  // fp32 values (the logits' max, the sum of exponentials, the target's
  // logit), issued back to back: priced as one collective of their bytes
  // (on --local the fit's fixed cost is the wait for the slower rank
  // between products, which the second and third do not pay again).
  const bool embed = first == 0, head = last == p.num_layers() - 1 && p.num_layers() > 1;
  const double big = (r == model::Recompute::kFull && p.has_recompute_costs ? 6.0 : 4.0) * blocks + (embed ? 1 : 0) +
                     (head ? 1 : 0);
  const double tokens = static_cast<double>(p.microbatch_size) * p.sequence_length;
  const double small_bytes = head ? 3 * 4.0 * tokens : 0;
  if (p.cluster.local) {  // measured: fp32 activations between processes of this machine
    auto fit = p.cluster.local_fits.find(tp);
    if (fit != p.cluster.local_fits.end()) {
      return compute / tp + big * fit->second.Seconds(4.0 * tokens * p.n_embd) +
             (head ? fit->second.Seconds(small_bytes) : 0.0);
    }
  }
  // Ring over tp GPUs of the node, activations in 16 bits.
  auto ring = [&](double bytes) { return 2.0 * (tp - 1) / tp * bytes / p.cluster.intra_bytes_per_s; };
  return compute / tp + big * ring(2.0 * tokens * p.n_embd) + ring(small_bytes);
}

double BoundarySeconds(const Problem& p, int last, double bytes_per_s, double latency) {
  if (last + 1 >= p.num_layers()) return 0.0;  // the head sends nothing on
  const double bytes = static_cast<double>(p.layers[last].output_bytes);
  return 2.0 * (bytes / bytes_per_s + latency);  // activation forward, its gradient back
}

double StageBoundarySeconds(const Problem& p, int last, bool crosses_node) {
  if (p.cluster.local && last + 1 < p.num_layers()) {
    // A send and a receive between two processes of this machine, each
    // way: priced as the profile's two-rank collective of those bytes.
    auto fit = p.cluster.local_fits.find(2);
    if (fit != p.cluster.local_fits.end())
      return 2.0 * fit->second.Seconds(static_cast<double>(p.layers[last].output_bytes));
  }
  return BoundarySeconds(p, last, crosses_node ? p.cluster.link_bytes_per_s : p.cluster.intra_bytes_per_s,
                         p.cluster.link_latency);
}

uint64_t StageMemoryBytes(const Problem& p, int first, int last, int tp, int in_flight, model::Recompute r) {
  double state = 0, act = 0, again = 0;
  for (int l = first; l <= last; ++l) {
    const auto& c = p.layers[l];
    state += p.StateBytes(c) / tp;
    const double kept = KeptBytes(p, c, tp, r);
    act += kept;
    // A recomputing block's backward holds its activations in full again.
    again = std::max(again, KeptBytes(p, c, tp, model::Recompute::kNone) - kept);
  }
  // The stage also holds its input for each in-flight micro-batch.
  if (first > 0) act += static_cast<double>(p.layers[first - 1].output_bytes) / tp;
  const double bytes = state + act * in_flight + (in_flight > 0 ? again : 0.0);
  return static_cast<uint64_t>(bytes * (1.0 + p.cluster.overhead_fraction)) +
         p.cluster.overhead_bytes;
}

uint64_t StageMemoryBytes(const Problem& p, int first, int last, int tp, const schedule::Held& held,
                          model::Recompute r) {
  const uint64_t whole = StageMemoryBytes(p, first, last, tp, held.activations, r);
  if (held.weight_inputs <= 0) return whole;
  double w = 0;
  for (int l = first; l <= last; ++l) w += static_cast<double>(p.layers[l].weight_input_bytes) / tp;
  return whole + static_cast<uint64_t>(w * held.weight_inputs * (1.0 + p.cluster.overhead_fraction));
}

uint64_t StageMemoryBytes(const Problem& p, const std::vector<StageShape>& chunks,
                          const std::vector<schedule::Op>& order) {
  double state = 0, again = 0;
  std::vector<uint64_t> act, weight_inputs;
  for (const StageShape& ch : chunks) {
    double a = 0, w = 0;
    for (int l = ch.first; l <= ch.last; ++l) {
      const auto& c = p.layers[l];
      state += p.StateBytes(c) / ch.tp;
      const double kept = KeptBytes(p, c, ch.tp, ch.recompute);
      a += kept;
      again = std::max(again, KeptBytes(p, c, ch.tp, model::Recompute::kNone) - kept);
      w += static_cast<double>(c.weight_input_bytes) / ch.tp;
    }
    if (ch.first > 0) a += static_cast<double>(p.layers[ch.first - 1].output_bytes) / ch.tp;
    act.push_back(static_cast<uint64_t>(a));
    weight_inputs.push_back(static_cast<uint64_t>(w));
  }
  const double peak = static_cast<double>(schedule::PeakBytes(order, act, weight_inputs));
  const double bytes = state + peak + (order.empty() ? 0.0 : again);
  return static_cast<uint64_t>(bytes * (1.0 + p.cluster.overhead_fraction)) + p.cluster.overhead_bytes;
}

std::optional<model::Recompute> StageMode(const Problem& p, int first, int last, int tp, int in_flight) {
  for (model::Recompute r : p.recompute_modes) {
    if (StageMemoryBytes(p, first, last, tp, in_flight, r) <= p.cluster.gpu_memory) return r;
  }
  return std::nullopt;
}

bool StageFits(const Problem& p, int first, int last, int tp, int in_flight) {
  return StageMode(p, first, last, tp, in_flight).has_value();
}

double AllReduceSeconds(const Problem& p, uint64_t gradient_bytes) {
  if (gradient_bytes == 0) return 0.0;
  const double steps = std::ceil(std::log2(std::max(2, p.cluster.nodes)));
  return 2.0 * static_cast<double>(gradient_bytes) / p.cluster.link_bytes_per_s +
         2.0 * steps * p.cluster.link_latency;
}

Result<Problem> MakeProblem(const pb::Profile& profile, const Cluster& cluster, int faults,
                            int global_batch, int microbatch_size) {
  if (profile.layers_size() == 0)
    return Status::DataErr("profile has no layers (a network-only profile?)");
  if (cluster.nodes < 1) return Status::Config("--nodes must be at least 1");
  if (cluster.gpus_per_node < 1) return Status::Config("--gpus-per-node must be at least 1");
  if (cluster.gpu_memory == 0) return Status::Config("GPU memory is unknown: give --gpu-memory");
  if (!(cluster.link_bytes_per_s > 0) || !(cluster.intra_bytes_per_s > 0))
    return Status::Config("link bandwidths must be positive");
  if (faults < 0) return Status::Config("--faults must be >= 0");
  if (microbatch_size < 1) return Status::Config("--microbatch must be >= 1");
  if (global_batch < 1 || global_batch % microbatch_size != 0)
    return Status::Config("--global-batch " + std::to_string(global_batch) +
                          " is not a positive multiple of --microbatch " +
                          std::to_string(microbatch_size));
  Problem p;
  p.cluster = cluster;
  p.faults = faults;
  p.microbatch_size = microbatch_size;
  p.microbatches = global_batch / microbatch_size;
  p.sequence_length = static_cast<int>(profile.sequence_length());
  p.n_embd = static_cast<int>(profile.model().n_embd());
  p.n_head = static_cast<int>(profile.model().n_head());
  p.n_kv_head = static_cast<int>(profile.model().n_kv_head());
  p.mlp_width = static_cast<int>(profile.model().intermediate_size());
  const bool bf16 = profile.dtype() == "bfloat16";
  for (int i = 0; i < profile.layers_size(); ++i) {
    const auto& l = profile.layers(i);
    const std::string who = "layer " + std::to_string(i) + " (" + l.name() + ")";
    if (l.index() != static_cast<uint32_t>(i))
      return Status::DataErr(who + ": index " + std::to_string(l.index()) + " out of order");
    const pb::LayerCost* cost = nullptr;
    for (const auto& c : l.costs())
      if (c.microbatch() == static_cast<uint32_t>(microbatch_size)) cost = &c;
    if (!cost)
      return Status::DataErr(who + ": no costs at micro-batch " + std::to_string(microbatch_size) +
                             " (profile it with -b " + std::to_string(microbatch_size) + ")");
    for (double t : {cost->forward_seconds(), cost->backward_seconds()}) {
      if (!std::isfinite(t) || t <= 0)
        return Status::DataErr(who + ": forward and backward times must be positive, got " +
                               std::to_string(t));
    }
    LayerCost c;
    c.forward = cost->forward_seconds();
    c.backward = cost->backward_seconds();
    c.state_bytes = l.parameter_bytes() + l.gradient_bytes() + l.optimizer_state_bytes();
    // bf16: parameter_bytes is the fp32 master (4 a parameter) and the
    // compute copy (2); the master is sharded with the moments.
    c.sharded_bytes = l.optimizer_state_bytes() + (bf16 ? l.parameter_bytes() / 6 * 4 : 0);
    c.gradient_bytes = l.gradient_bytes();
    c.activation_bytes = cost->activation_bytes();
    c.output_bytes = cost->output_bytes();
    c.is_block = l.kind() == pb::LAYER_BLOCK;
    c.update = l.update_seconds();
    c.kept_bytes = {cost->activation_bytes(), cost->selective_activation_bytes(), cost->full_activation_bytes()};
    c.recompute_seconds = {0.0, cost->selective_recompute_seconds(), cost->full_recompute_seconds()};
    const double w = cost->weight_grad_seconds();
    if (!std::isfinite(w) || w < 0 || w > c.backward)
      return Status::DataErr(who + ": weight-gradient seconds " + std::to_string(w) +
                             " outside the backward's [0, " + std::to_string(c.backward) + "]");
    c.weight_grad = w;
    c.weight_input_bytes = cost->weight_input_bytes();
    p.layers.push_back(c);
  }
  // Every block's costs in every mode, or recomputation is not priced.
  p.has_recompute_costs = std::any_of(p.layers.begin(), p.layers.end(), [](const LayerCost& c) { return c.is_block; });
  for (const LayerCost& c : p.layers) {
    if (c.is_block && !(c.recompute_seconds[2] > 0)) p.has_recompute_costs = false;
  }
  if (p.cluster.local) {
    // Per group size, least squares of seconds on bytes over the layers'
    // all-reduces; the step's collectives use the largest group the
    // cluster's workers reach.
    std::map<int, std::vector<std::pair<double, double>>> points;
    for (const auto& l : profile.layers())
      for (const auto& a : l.allreduce())
        if (a.group_size() >= 2) points[static_cast<int>(a.group_size())].push_back({static_cast<double>(a.bytes()), a.seconds()});
    for (const auto& [group, xy] : points) {
      double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
      for (auto [x, y] : xy) n += 1, sx += x, sy += y, sxx += x * x, sxy += x * y;
      const double var = n * sxx - sx * sx;
      CollectiveFit fit;
      fit.per_byte = var > 0 ? std::max(0.0, (n * sxy - sx * sy) / var) : 0.0;
      fit.fixed = std::max(0.0, (sy - fit.per_byte * sx) / n);
      p.cluster.local_fits[group] = fit;
    }
    const int workers = cluster.nodes * cluster.gpus_per_node;
    int group = 0;
    for (const auto& [g, fit] : p.cluster.local_fits)
      if (g <= std::max(2, workers)) group = g;
    if (group == 0)
      return Status::DataErr("--local needs the profile's measured all-reduces of 2 or more ranks (ob-profile --model, --allreduce-max)");
    p.cluster.local_step = p.cluster.local_fits[group];
    const auto& curve = profile.device().contention();
    if (!curve.empty()) {
      if (curve.size() != static_cast<int>(profile.device().concurrency()))
        return Status::DataErr("device contention has " + std::to_string(curve.size()) +
                               " entries for concurrency " + std::to_string(profile.device().concurrency()));
      for (int k = 0; k < curve.size(); ++k) {
        if (!std::isfinite(curve[k]) || curve[k] <= 0 || (k == 0 && curve[k] != 1.0))
          return Status::DataErr("device contention " + std::to_string(k + 1) + " is " + std::to_string(curve[k]) +
                                 (k == 0 ? " (must be 1: one process alone)" : " (must be positive)"));
      }
      p.cluster.contention.assign(curve.begin(), curve.end());
    }
  }
  return p;
}

}  // namespace ob::plan
