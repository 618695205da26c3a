// The Llama family's block (design/model.md), as Hugging Face's LlamaDecoderLayer,
// MistralDecoderLayer, Qwen2DecoderLayer and Qwen3DecoderLayer compute it:
//
//   x + o(attn(rope(qnorm(q(n1(x)))), rope(knorm(k(n1(x)))), v(n1(x))))
//   y + down(silu(gate(n2(y))) · up(n2(y)))
//
// n1, n2: RMSNorm (statistics in fp32, `weight * normalized.to(dtype)`);
// q [H·d, h], k and v [K·d, h] (with biases for Qwen2), qnorm/knorm
// per-head RMSNorms of weight [d] (Qwen3), applied before the rotation;
// rope: rotate-half rotary embedding (dimension i pairs with i + d/2),
// frequencies from llama_config.h RopeInverseFrequencies; query head j
// attends with kv head j / (H/K); o [h, H·d]; gate and up [I, h], down
// [h, I]. No weight permutation is needed for HF files.
//
// Parameter names, relative to the block: ln_1.weight, attn.q_proj.weight
// (.bias), attn.k_proj.*, attn.v_proj.*, attn.q_norm.weight,
// attn.k_norm.weight, attn.o_proj.weight, ln_2.weight,
// mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight. The
// family's embed (wte only) and head (ln_f, an RMSNorm, and lm_head unless
// tied) are gpt.h's layers.
//
// Tensor parallelism (tensor_parallel.h): q, k, v, gate and up by rows (a
// rank holds H/t query heads and K/t kv heads, so its query heads' kv
// heads are its own), o and down by columns, norms replicated.
#pragma once

#include <torch/torch.h>

#include "ob/model/config.h"
#include "ob/model/gpt.h"

namespace ob::model {

// Hugging Face's RMSNorm of the last dimension: x·rsqrt(mean(x²) + eps) in
// fp32, cast to x's dtype, times the weight.
torch::Tensor RmsNormOf(const torch::Tensor& x, const torch::Tensor& weight, double eps);

class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(int64_t width, double eps);
  torch::Tensor forward(const torch::Tensor& x) { return RmsNormOf(x, weight, eps); }
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RmsNorm);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  LlamaAttentionImpl(const GptConfig& cfg, TpGroupPtr tp);
  torch::Tensor forward(const torch::Tensor& x);

  Dense q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RmsNorm q_norm{nullptr}, k_norm{nullptr};  // Qwen3 only
  // The rotation, the key/value repeat and the attention recomputed in the
  // backward: q, k, v kept as the projections (and norms) left them.
  bool selective = false;

 private:
  // cos and sin [t, d] of positions 0..t-1 on x's device, in fp32
  // (computed once for the longest sequence seen).
  std::pair<torch::Tensor, torch::Tensor> Rotation(int64_t t, const torch::Device& device);

  int heads_, kv_heads_, head_dim_;  // this rank's heads
  TpGroupPtr tp_;
  torch::Tensor inv_freq_;  // [d/2] fp32, CPU
  torch::Tensor cos_, sin_;
};
TORCH_MODULE(LlamaAttention);

class SwiGluImpl : public torch::nn::Module {
 public:
  SwiGluImpl(const GptConfig& cfg, TpGroupPtr tp);
  torch::Tensor forward(const torch::Tensor& x);
  Dense gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  bool selective = false;  // silu(gate)·up recomputed in the backward: gate and up kept

 private:
  TpGroupPtr tp_;
};
TORCH_MODULE(SwiGlu);

// Block `block` (0-based; global index block + 1) of a Llama-family model.
class LlamaBlockLayerImpl : public PlannerLayerImpl {
 public:
  LlamaBlockLayerImpl(const GptConfig& cfg, int block, uint64_t seed, TpGroupPtr tp = nullptr, bool init = true);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& targets) override;
  // Segment 0: x + attention; segment 1: y + MLP.
  int num_segments() const override { return 2; }
  torch::Tensor forward_segment(int segment, const torch::Tensor& x, const torch::Tensor& targets) override;
  int segment_of(const std::string& parameter) const override;
  void set_recompute(Recompute r) override;

  RmsNorm ln_1{nullptr}, ln_2{nullptr};
  LlamaAttention attn{nullptr};
  SwiGlu mlp{nullptr};

 private:
  torch::Tensor Segment(int segment, const torch::Tensor& x);
};

}  // namespace ob::model
