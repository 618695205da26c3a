// The Llama family's block (see llama.h).
#include "ob/model/llama.h"

#include <cassert>
#include <cmath>

#include "ob/model/data.h"
#include "ob/model/linear.h"
#include "ob/model/llama_config.h"
#include "ob/model/tensor_parallel.h"
#include "ob/torch_compat.h"

namespace ob::model {
namespace {

constexpr double kLlamaInitStd = 0.02;

bool TpSharded(const TpGroupPtr& tp) { return tp != nullptr && tp->size > 1; }

// x with its two halves of the last dimension as (-second, first).
torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// x [b, heads, t, d] rotated by cos/sin [t, d] (fp32), in x's dtype.
torch::Tensor Rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const auto c = cos.to(x.scalar_type()), s = sin.to(x.scalar_type());
  return x * c + RotateHalf(x) * s;
}

}  // namespace

torch::Tensor RmsNormOf(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const auto dtype = x.scalar_type();
  auto x32 = x.to(torch::kFloat);
  auto y = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight.to(dtype) * y.to(dtype);
}

RmsNormImpl::RmsNormImpl(int64_t width, double eps) : eps(eps) {
  weight = register_parameter("weight", torch::ones({width}));
}

LlamaAttentionImpl::LlamaAttentionImpl(const GptConfig& cfg, TpGroupPtr tp) : tp_(std::move(tp)) {
  const int t = TpSharded(tp_) ? tp_->size : 1;
  const int64_t h = cfg.n_embd, d = cfg.head_dim();
  heads_ = cfg.n_head / t;
  kv_heads_ = cfg.kv_heads() / t;
  head_dim_ = cfg.head_dim();
  // Built whole, then sharded by the layer (ShardParameters).
  q_proj = register_module("q_proj", Dense(h, cfg.n_head * d, cfg.qkv_bias));
  k_proj = register_module("k_proj", Dense(h, cfg.kv_heads() * d, cfg.qkv_bias));
  v_proj = register_module("v_proj", Dense(h, cfg.kv_heads() * d, cfg.qkv_bias));
  o_proj = register_module("o_proj", Dense(cfg.n_head * d, h, false));
  if (cfg.qk_norm) {
    q_norm = register_module("q_norm", RmsNorm(d, cfg.norm_eps));
    k_norm = register_module("k_norm", RmsNorm(d, cfg.norm_eps));
  }
  const std::vector<double> f = RopeInverseFrequencies(cfg);
  inv_freq_ = torch::tensor(std::vector<float>(f.begin(), f.end()), torch::kFloat);
}

std::pair<torch::Tensor, torch::Tensor> LlamaAttentionImpl::Rotation(int64_t t, const torch::Device& device) {
  if (!cos_.defined() || cos_.size(0) < t || cos_.device() != device) {
    torch::NoGradGuard no_grad;
    auto pos = torch::arange(t, torch::kFloat);
    auto freqs = torch::outer(pos, inv_freq_);         // [t, d/2], fp32 as HF's
    auto emb = torch::cat({freqs, freqs}, -1);           // [t, d]
    cos_ = emb.cos().to(device);
    sin_ = emb.sin().to(device);
  }
  return {cos_.narrow(0, 0, t), sin_.narrow(0, 0, t)};
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), d = head_dim_;
  const auto in = TpSharded(tp_) ? CopyToTp(x, *tp_) : x;
  auto q = Linear(in, q_proj->weight, q_proj->bias).view({b, t, heads_, d});
  auto k = Linear(in, k_proj->weight, k_proj->bias).view({b, t, kv_heads_, d});
  auto v = Linear(in, v_proj->weight, v_proj->bias).view({b, t, kv_heads_, d});
  if (q_norm) {
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  auto core = [this, t](const std::vector<torch::Tensor>& z) {
    auto [cos, sin] = Rotation(t, z[0].device());
    auto q = Rotate(z[0].transpose(1, 2), cos, sin);  // [b, H, t, d]
    auto k = Rotate(z[1].transpose(1, 2), cos, sin);  // [b, K, t, d]
    auto v = z[2].transpose(1, 2);
    if (heads_ != kv_heads_) {  // query head j reads kv head j / (H/K)
      k = k.repeat_interleave(heads_ / kv_heads_, 1);
      v = v.repeat_interleave(heads_ / kv_heads_, 1);
    }
    return std::vector<torch::Tensor>{compat::CausalSelfAttention(q, k, v)};  // [b, H, t, d]
  };
  auto y = (selective ? Checkpointed(core, {q, k, v}) : core({q, k, v})).front();
  y = Linear(y.transpose(1, 2).contiguous().view({b, t, heads_ * d}), o_proj->weight, {});
  return TpSharded(tp_) ? ReduceFromTp(y, *tp_) : y;
}

SwiGluImpl::SwiGluImpl(const GptConfig& cfg, TpGroupPtr tp) : tp_(std::move(tp)) {
  gate_proj = register_module("gate_proj", Dense(cfg.n_embd, cfg.mlp_width(), false));
  up_proj = register_module("up_proj", Dense(cfg.n_embd, cfg.mlp_width(), false));
  down_proj = register_module("down_proj", Dense(cfg.mlp_width(), cfg.n_embd, false));
}

torch::Tensor SwiGluImpl::forward(const torch::Tensor& x) {
  const auto in = TpSharded(tp_) ? CopyToTp(x, *tp_) : x;
  auto act = [](const std::vector<torch::Tensor>& z) { return std::vector<torch::Tensor>{torch::silu(z[0]) * z[1]}; };
  std::vector<torch::Tensor> gate_up{Linear(in, gate_proj->weight, {}), Linear(in, up_proj->weight, {})};
  auto m = (selective ? Checkpointed(act, gate_up) : act(gate_up)).front();
  auto y = Linear(m, down_proj->weight, {});
  return TpSharded(tp_) ? ReduceFromTp(y, *tp_) : y;
}

LlamaBlockLayerImpl::LlamaBlockLayerImpl(const GptConfig& cfg, int block, uint64_t seed, TpGroupPtr tp, bool init)
    : PlannerLayerImpl(pb::LAYER_BLOCK, block + 1, "block." + std::to_string(block)) {
  ln_1 = register_module("ln_1", RmsNorm(cfg.n_embd, cfg.norm_eps));
  attn = register_module("attn", LlamaAttention(cfg, tp));
  ln_2 = register_module("ln_2", RmsNorm(cfg.n_embd, cfg.norm_eps));
  mlp = register_module("mlp", SwiGlu(cfg, tp));
  if (init) {
    // N(0, 0.02), the residual projections (o, down) scaled by 1/sqrt(2L)
    // as GPT-2's; biases zero, norms one. Drawn whole, in a fixed order,
    // from the layer's own generator, then sharded: every layout starts
    // from the same weights.
    torch::NoGradGuard no_grad;
    auto gen = compat::MakeCpuGenerator(Mix64(seed, static_cast<uint64_t>(index())));
    const double residual_std = kLlamaInitStd / std::sqrt(2.0 * cfg.n_layer);
    for (const Dense& l : {attn->q_proj, attn->k_proj, attn->v_proj}) {
      l->weight.normal_(0.0, kLlamaInitStd, gen);
      if (l->bias.defined()) l->bias.zero_();
    }
    attn->o_proj->weight.normal_(0.0, residual_std, gen);
    mlp->gate_proj->weight.normal_(0.0, kLlamaInitStd, gen);
    mlp->up_proj->weight.normal_(0.0, kLlamaInitStd, gen);
    mlp->down_proj->weight.normal_(0.0, residual_std, gen);
  }
  if (TpSharded(tp)) ShardParameters(*this, *tp);
}

torch::Tensor LlamaBlockLayerImpl::forward(const torch::Tensor& x, const torch::Tensor&) {
  if (recompute() == Recompute::kFull) {
    return Checkpointed([this](const torch::Tensor& z) { return Segment(1, Segment(0, z)); }, x);
  }
  return Segment(1, Segment(0, x));
}

torch::Tensor LlamaBlockLayerImpl::forward_segment(int segment, const torch::Tensor& x, const torch::Tensor&) {
  assert(segment == 0 || segment == 1);
  if (recompute() == Recompute::kFull) {
    return Checkpointed([this, segment](const torch::Tensor& z) { return Segment(segment, z); }, x);
  }
  return Segment(segment, x);
}

torch::Tensor LlamaBlockLayerImpl::Segment(int segment, const torch::Tensor& x) {
  if (segment == 0) return x + attn->forward(ln_1->forward(x));
  return x + mlp->forward(ln_2->forward(x));
}

void LlamaBlockLayerImpl::set_recompute(Recompute r) {
  PlannerLayerImpl::set_recompute(r);
  attn->selective = mlp->selective = r == Recompute::kSelective;
}

int LlamaBlockLayerImpl::segment_of(const std::string& parameter) const {
  return parameter.rfind("ln_2.", 0) == 0 || parameter.rfind("mlp.", 0) == 0 ? 1 : 0;
}

}  // namespace ob::model
