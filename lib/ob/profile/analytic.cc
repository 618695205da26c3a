#include "ob/profile/analytic.h"

#include <algorithm>

#include "ob/profile/profile.h"

namespace ob::profile {
namespace {

constexpr double kRingStepLatency = 5e-6;  // seconds per ring step (NVLink, NCCL)

std::string LayerName(pb::LayerKind kind, int index) {
  switch (kind) {
    case pb::LAYER_EMBED: return "embed";
    case pb::LAYER_HEAD: return "head";
    default: return "block." + std::to_string(index - 1);
  }
}

}  // namespace

double TrainingFlopsPerToken(const model::GptConfig& c, pb::LayerKind kind, int seq_len) {
  const double h = c.n_embd, V = c.vocab_size;
  // The attention's two products (QKᵀ and its product with V) over the
  // query heads' width H·d (h for GPT-2; Qwen3's is not).
  const double attn_width = static_cast<double>(c.n_head) * c.head_dim();
  switch (kind) {
    case pb::LAYER_EMBED: return 0.0;
    case pb::LAYER_BLOCK: return 6.0 * static_cast<double>(model::BlockParams(c)) + 12.0 * attn_width * seq_len;
    case pb::LAYER_HEAD: return 6.0 * (V * h + (c.llama() ? h : 2.0 * h));
    default: return 0.0;
  }
}

double LlmcFlopsPerToken(const model::GptConfig& c, pb::LayerKind kind, int seq_len) {
  const double attn_width = static_cast<double>(c.n_head) * c.head_dim();
  switch (kind) {
    case pb::LAYER_EMBED: return 6.0 * static_cast<double>(model::EmbeddingParams(c));
    case pb::LAYER_BLOCK: return 6.0 * static_cast<double>(model::BlockParams(c)) + 6.0 * attn_width * seq_len;
    case pb::LAYER_HEAD: return 6.0 * static_cast<double>(model::HeadOwnParams(c));
    default: return 0.0;
  }
}

uint64_t ActivationBytes(const model::GptConfig& c, pb::LayerKind kind, int b, int s,
                         int elem_bytes, bool fused_attention) {
  const uint64_t sbh = static_cast<uint64_t>(s) * b * c.n_embd;
  switch (kind) {
    case pb::LAYER_EMBED: return static_cast<uint64_t>(s) * b * 8;
    case pb::LAYER_BLOCK: {
      // design/formulas.md gives bytes for 16-bit activations; scale by elem_bytes / 2.
      const double h = c.n_embd;
      const double scores = fused_attention ? 0.0 : 5.0 * c.n_head * s / h;
      double per = 34.0 + scores;
      if (c.llama()) {
        // What autograd keeps of a Llama block, 2 bytes an element: the
        // two norms' inputs and outputs (4h), q, its rotation and the
        // attention's output (3·H·d), k and v (2·K·d; rotated k counted in
        // the attention's own), the SwiGLU's gate, up, silu(gate) and
        // product (4I): per token 2·(4h + 3Hd + 2Kd + 4I) bytes.
        const double q = static_cast<double>(c.n_head) * c.head_dim(),
                     kv = static_cast<double>(c.kv_heads()) * c.head_dim();
        per = 2.0 * (4 * h + 3 * q + 2 * kv + 4.0 * c.mlp_width()) / h + scores;
      }
      return static_cast<uint64_t>(static_cast<double>(sbh) * per * elem_bytes / 2.0);
    }
    case pb::LAYER_HEAD:
      return sbh * elem_bytes + static_cast<uint64_t>(s) * b * c.vocab_size * 4;
    default: return 0;
  }
}

// What a block keeps in the selective mode (model/recompute.h): none's
// without the attention's scores and probabilities, and without the MLP
// activation's output (GPT-2: design/formulas.md less the GELU's output, 8,
// kept by neither; Llama: the rotated q and silu(gate), 2Hd + 2I of
// 2·(4h + 3Hd + 2Kd + 4I)); full: the block's input.
uint64_t SelectiveActivationBytes(const model::GptConfig& c, int b, int s, int elem_bytes) {
  const uint64_t sbh = static_cast<uint64_t>(s) * b * c.n_embd;
  const double h = c.n_embd;
  double per = 26.0;
  if (c.llama()) {
    const double q = static_cast<double>(c.n_head) * c.head_dim(),
                 kv = static_cast<double>(c.kv_heads()) * c.head_dim();
    per = 2.0 * (4 * h + 2 * q + 2 * kv + 3.0 * c.mlp_width()) / h;
  }
  return static_cast<uint64_t>(static_cast<double>(sbh) * per * elem_bytes / 2.0);
}

// The FLOPs the selective mode computes again a micro-batch: the
// attention core's two products (q·kᵀ and p·v, 2·2·b·s²·H·d, halved by
// the causal mask where the kernel skips it: taken whole, as
// TrainingFlopsPerToken does).
double SelectiveRecomputeFlops(const model::GptConfig& c, int b, int s) {
  return 4.0 * b * static_cast<double>(s) * s * c.n_head * c.head_dim();
}

// What a block's micro-batch keeps between its input gradient and its
// weight gradients under a zero-bubble schedule (model/weight_grads.h):
// each dense layer's input and output gradient. GPT-2, per token: the
// inputs h (ln_1's output, read by c_attn), h (attention's output), h
// (ln_2's), 4h (GELU's), and the gradients of c_attn (3h), c_proj (h),
// c_fc (4h) and the MLP's c_proj (h): 16h. Llama: the inputs h (q, k and v
// share it), H·d (o_proj's), h (gate and up share it), I (down's), and the
// gradients H·d + 2K·d + h + 2I + h.
uint64_t WeightInputBytes(const model::GptConfig& c, int b, int s, int elem_bytes) {
  const double tokens = static_cast<double>(b) * s, h = c.n_embd;
  double per = 16.0 * h;
  if (c.llama()) {
    const double q = static_cast<double>(c.n_head) * c.head_dim(),
                 kv = static_cast<double>(c.kv_heads()) * c.head_dim(), mlp = c.mlp_width();
    per = (2 * h + q + mlp) + (q + 2 * kv + 2 * h + 2 * mlp);
  }
  return static_cast<uint64_t>(tokens * per * elem_bytes);
}

double RingAllReduceSeconds(uint64_t bytes, int group, double bus_gbps) {
  if (group <= 1) return 0.0;
  const double d = group;
  return 2.0 * (d - 1) / d * static_cast<double>(bytes) / (bus_gbps * 1e9) +
         2.0 * (d - 1) * kRingStepLatency;
}

Result<pb::Profile> AnalyticProfile(const model::GptConfig& c, const AnalyticOptions& o) {
  const GpuSpec& g = o.gpu;
  // fp32 products run on the CUDA cores, bf16's on the tensor cores: an
  // H100 is 15 times slower in fp32, and a plan priced at bf16's peak
  // would predict fp32 steps 15 times too fast.
  const double peak_tflops = DensePeakTflops(g, o.fp32);
  if (!(peak_tflops > 0))
    return Status::Config(std::string("--peak-tflops must be positive (") + (o.fp32 ? "fp32" : "bf16") +
                          " peak of GPU '" + g.name + "')");
  if (g.memory_bytes == 0) return Status::Config("--mem-gib must be positive");
  if (!(g.efficiency > 0 && g.efficiency <= 1)) return Status::Config("--efficiency must be in (0, 1]");
  if (!(g.memory_gbps > 0) || !(g.allreduce_gbps > 0))
    return Status::Config("GPU '" + g.name + "' lacks memory or all-reduce bandwidth");
  OB_ASSIGN_OR_RETURN(pb::Profile p, NewLayerProfile(c, pb::PROFILE_ANALYTIC,
                                                     o.fp32 ? "float32" : "bfloat16", o.seq_len,
                                                     o.microbatches));
  const int s = static_cast<int>(p.sequence_length());
  const int e = o.fp32 ? 4 : 2;                   // bytes per weight/activation element
  // Model state as ob-launch keeps it: fp32 weights (the masters), fp32
  // gradients (summed and all-reduced in fp32), two fp32 AdamW moments, and
  // under bf16 each weight's bf16 compute copy (model/compute_copies.h).
  const int param_bytes_per_param = o.fp32 ? 4 : 4 + 2;
  const int grad_bytes_per_param = 4;
  const int opt_bytes_per_param = 8;
  const int max_group = o.max_group > 0 ? o.max_group : g.gpus_per_node;
  const double flops_per_s = peak_tflops * 1e12 * g.efficiency;
  const double bytes_per_s = g.memory_gbps * 1e9;

  auto* dev = p.mutable_device();
  dev->set_kind(g.name);
  dev->set_name(g.description);
  dev->set_peak_tflops(peak_tflops);  // the peak of the profile's dtype
  dev->set_memory_bytes(g.memory_bytes);
  dev->set_efficiency(g.efficiency);
  dev->set_devices_per_node(g.gpus_per_node);
  dev->set_allreduce_gbps(g.allreduce_gbps);
  p.set_fused_attention(o.fused_attention);

  for (int i = 0; i < c.num_layers(); ++i) {
    const pb::LayerKind kind =
        i == 0 ? pb::LAYER_EMBED : (i == c.num_layers() - 1 ? pb::LAYER_HEAD : pb::LAYER_BLOCK);
    auto* l = p.add_layers();
    l->set_index(i);
    l->set_kind(kind);
    l->set_name(LayerName(kind, i));
    uint64_t params = 0, tied = 0;
    switch (kind) {
      case pb::LAYER_EMBED: params = model::EmbeddingParams(c); break;
      case pb::LAYER_BLOCK: params = model::BlockParams(c); break;
      default:  // a tied head's table is the embed's, counted there too
        tied = c.tied ? static_cast<uint64_t>(c.vocab_size) * c.n_embd : 0;
        params = model::HeadOwnParams(c) + tied;
    }
    l->set_parameter_count(params);
    l->set_tied_parameter_count(tied);
    l->set_parameter_bytes(params * param_bytes_per_param);
    l->set_gradient_bytes(params * grad_bytes_per_param);
    l->set_optimizer_state_bytes(params * opt_bytes_per_param);

    for (int b : o.microbatches) {
      const double tokens = static_cast<double>(b) * s;
      const double flops = TrainingFlopsPerToken(c, kind, s) * tokens;
      const uint64_t act = ActivationBytes(c, kind, b, s, e, o.fused_attention);
      const uint64_t out = kind == pb::LAYER_HEAD ? 4 : static_cast<uint64_t>(tokens) * c.n_embd * e;
      // Roofline: weights are read once per pass and activations written
      // forward and read backward; embed is only that memory traffic.
      const double fwd_bytes = static_cast<double>(params * e + act + out);
      const double bwd_bytes = static_cast<double>(2 * params * e + act + out);
      auto* cost = l->add_costs();
      cost->set_microbatch(b);
      cost->set_forward_flops(flops / 3.0);
      cost->set_backward_flops(flops * 2.0 / 3.0);
      cost->set_forward_seconds(std::max(flops / 3.0 / flops_per_s, fwd_bytes / bytes_per_s));
      cost->set_backward_seconds(std::max(flops * 2.0 / 3.0 / flops_per_s, bwd_bytes / bytes_per_s));
      cost->set_activation_bytes(act);
      cost->set_output_bytes(out);
      if (kind == pb::LAYER_BLOCK) {
        // Selective computes the core again (its products, at the peak) and
        // reads and writes the activations it recomputes (memory-bound);
        // full runs the forward again.
        const uint64_t sel = SelectiveActivationBytes(c, b, s, e);
        cost->set_selective_activation_bytes(sel);
        cost->set_full_activation_bytes(out);
        cost->set_selective_recompute_seconds(std::max(SelectiveRecomputeFlops(c, b, s) / flops_per_s,
                                                       static_cast<double>(act > sel ? act - sel : 0) / bytes_per_s));
        cost->set_full_recompute_seconds(cost->forward_seconds());
        // The weight gradients' products (dyᵀ·x, as many FLOPs as the
        // forward's dense products, 2 a parameter a token), as their share
        // of the backward's FLOPs.
        const double w_flops = 2.0 * tokens * static_cast<double>(params);
        cost->set_weight_grad_seconds(cost->backward_seconds() * std::min(1.0, w_flops / (flops * 2.0 / 3.0)));
        cost->set_weight_input_bytes(WeightInputBytes(c, b, s, e));
      }
    }
    for (int d = 1; d <= max_group; d *= 2) {
      auto* ar = l->add_allreduce();
      ar->set_group_size(d);
      ar->set_bytes(l->gradient_bytes());
      ar->set_seconds(RingAllReduceSeconds(l->gradient_bytes(), d, g.allreduce_gbps));
    }
  }
  return p;
}

}  // namespace ob::profile
