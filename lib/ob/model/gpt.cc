// GPT planner layers: embed, pre-LN blocks, tied head (see gpt.h for shapes).
#include "ob/model/gpt.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <unordered_set>

#include "ob/model/compute_copies.h"
#include "ob/model/cross_entropy.h"
#include "ob/model/data.h"
#include "ob/model/linear.h"
#include "ob/model/llama.h"
#include "ob/torch_compat.h"

namespace ob::model {
namespace {

// GPT-2's initialisation scale for weights.
constexpr double kInitStd = 0.02;

// Layer i's own generator: initialisation does not depend on the stage layout.
at::Generator LayerGenerator(uint64_t seed, int global_index) {
  return compat::MakeCpuGenerator(Mix64(seed, static_cast<uint64_t>(global_index)));
}

void InitNormal(const torch::Tensor& w, double std, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  w.normal_(0.0, std, gen);
}

void InitLinear(const Dense& l, double std, at::Generator& gen) {
  InitNormal(l->weight, std, gen);
  torch::NoGradGuard no_grad;
  l->bias.zero_();
}

// The token table [V,h], drawn first from layer 0's stream by both the embed
// and a stand-alone head, so the two copies start equal.
void InitTokenTable(const torch::Tensor& w, at::Generator& gen) { InitNormal(w, kInitStd, gen); }

bool Sharded(const TpGroupPtr& tp) { return tp != nullptr && tp->size > 1; }

// x·Wᵀ + b through Linear (linear.h: at::linear, whose backward adds the
// weight gradient into its fp32 gradient in one product), not
// torch::nn::Linear::forward: the C++ frontend's linear multiplies and then
// adds the bias in place for inputs of more than 2 dimensions, so under bf16
// autocast it adds an fp32 bias into a bf16 product with a slow mixed-dtype
// kernel, where at::linear puts the bias into the matrix product (seen on an
// H100: 32 ms of a 420 ms gpt2-medium step).
torch::Tensor Affine(const Dense& l, const torch::Tensor& x) { return Linear(x, l->weight, l->bias); }

// The residual stream in the compute dtype. Under bf16 autocast the
// embed's sum is cast to bf16 once, and the layer norms read and write
// bf16 (statistics in fp32 inside the kernel; gain and bias from their
// compute copies, their gradients summed in fp32: LayerNorm, linear.h)
// where autocast would run them in fp32:
// otherwise every block reads and writes its residual stream in fp32 and
// casts each norm's output back to bf16 for the next product, two casts
// forward and two backward a block and twice the bytes of every residual
// add and norm (Megatron-LM, likewise, keeps the residual stream in bf16
// unless asked for fp32). Without autocast, torch's layer_norm, as the
// module's forward runs it.
torch::Tensor Norm(torch::nn::LayerNorm& ln, const torch::Tensor& x) {
  return LayerNorm(x, ln->weight, ln->bias, ln->options.normalized_shape(), ln->options.eps());
}

torch::Tensor InComputeDtype(const torch::Tensor& x) {
  const auto dtype = compat::AutocastDtype(x);
  return dtype && x.is_floating_point() ? x.to(*dtype) : x;
}

}  // namespace

DenseImpl::DenseImpl(int64_t in, int64_t out, bool with_bias) {
  weight = register_parameter("weight", torch::empty({out, in}));
  if (with_bias) bias = register_parameter("bias", torch::empty({out}));
}

TableImpl::TableImpl(int64_t rows, int64_t width) {
  weight = register_parameter("weight", torch::empty({rows, width}));
}

EmbedLayerImpl::EmbedLayerImpl(const GptConfig& cfg, uint64_t seed, TpGroupPtr tp, bool init)
    : PlannerLayerImpl(pb::LAYER_EMBED, 0, "embed"), vocab_(cfg.vocab_size), tp_(std::move(tp)) {
  wte = register_module("wte", Table(cfg.vocab_size, cfg.n_embd));
  if (!cfg.llama()) wpe = register_module("wpe", Table(cfg.n_positions, cfg.n_embd));
  if (init) {
    auto gen = LayerGenerator(seed, 0);
    InitTokenTable(wte->weight, gen);
    if (wpe) InitNormal(wpe->weight, kInitStd, gen);
  }
  if (Sharded(tp_)) ShardParameters(*this, *tp_);
}

torch::Tensor EmbedLayerImpl::forward(const torch::Tensor& ids, const torch::Tensor&) {
  const int64_t t = ids.size(1);
  auto pos = torch::arange(t, ids.options().dtype(torch::kLong));
  auto tokens = Sharded(tp_) ? TpEmbedding(wte->weight, ids, vocab_, *tp_) : torch::embedding(wte->weight, ids);
  if (!wpe) return InComputeDtype(tokens);  // positions are rotations in the blocks
  return InComputeDtype(tokens + torch::embedding(wpe->weight, pos).unsqueeze(0));  // [b,t,h]
}

namespace {

// Causal attention of q, k, v [b,t,a·d] split into a heads: [b,a,t,d].
// Selective: autograd keeps q, k and v, and the backward computes the
// scores and probabilities again.
torch::Tensor Core(const std::vector<torch::Tensor>& qkv, int64_t a, bool selective) {
  auto core = [a](const std::vector<torch::Tensor>& z) {
    const int64_t b = z[0].size(0), t = z[0].size(1), d = z[0].size(2) / a;
    auto heads = [&](const torch::Tensor& w) { return w.view({b, t, a, d}).transpose(1, 2); };
    return std::vector<torch::Tensor>{compat::CausalSelfAttention(heads(z[0]), heads(z[1]), heads(z[2]))};
  };
  return (selective ? Checkpointed(core, {qkv[0], qkv[1], qkv[2]}) : core({qkv[0], qkv[1], qkv[2]})).front();
}

}  // namespace

CausalSelfAttentionImpl::CausalSelfAttentionImpl(int n_embd, int n_head, TpGroupPtr tp)
    : n_head(n_head), tp(std::move(tp)) {
  c_attn = register_module("c_attn", Dense(n_embd, 3 * n_embd));
  c_proj = register_module("c_proj", Dense(n_embd, n_embd));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), h = x.size(2);
  const int64_t d = h / n_head;
  if (Sharded(tp)) {  // our heads' q, k, v, then our columns of the projection
    const int64_t a = n_head / tp->size, local = a * d;
    auto qkv = Affine(c_attn, CopyToTp(x, *tp)).split(local, 2);  // 3 x [b,t,a·d]
    auto y = Core(qkv, a, selective);
    y = Linear(y.transpose(1, 2).contiguous().view({b, t, local}), c_proj->weight, {});
    return ReduceFromTp(y, *tp) + c_proj->bias;
  }
  auto qkv = Affine(c_attn, x).split(h, /*dim=*/2);  // 3 x [b,t,h]
  auto y = Core(qkv, n_head, selective);  // [b,a,t,d]
  return Affine(c_proj, y.transpose(1, 2).contiguous().view({b, t, h}));
}

MlpImpl::MlpImpl(int n_embd, TpGroupPtr tp) : tp(std::move(tp)) {
  c_fc = register_module("c_fc", Dense(n_embd, 4 * n_embd));
  c_proj = register_module("c_proj", Dense(4 * n_embd, n_embd));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  if (Sharded(tp)) {  // our columns of c_fc, our rows of c_proj's input
    auto m = GeluMlp(CopyToTp(x, *tp), c_fc->weight, c_fc->bias, c_proj->weight, {}, selective);
    return ReduceFromTp(m, *tp) + c_proj->bias;
  }
  return GeluMlp(x, c_fc->weight, c_fc->bias, c_proj->weight, c_proj->bias, selective);
}

BlockLayerImpl::BlockLayerImpl(const GptConfig& cfg, int block, uint64_t seed, TpGroupPtr tp, bool init)
    : PlannerLayerImpl(pb::LAYER_BLOCK, block + 1, "block." + std::to_string(block)) {
  const int64_t h = cfg.n_embd;
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({h})));
  attn = register_module("attn", CausalSelfAttention(cfg.n_embd, cfg.n_head, tp));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({h})));
  mlp = register_module("mlp", Mlp(cfg.n_embd, tp));
  // Residual projections are scaled down by sqrt(2L) (GPT-2 paper, §2.3).
  const double residual_std = kInitStd / std::sqrt(2.0 * cfg.n_layer);
  if (init) {
    auto gen = LayerGenerator(seed, index());
    InitLinear(attn->c_attn, kInitStd, gen);
    InitLinear(attn->c_proj, residual_std, gen);
    InitLinear(mlp->c_fc, kInitStd, gen);
    InitLinear(mlp->c_proj, residual_std, gen);
  }
  if (Sharded(tp)) ShardParameters(*this, *tp);
}

torch::Tensor BlockLayerImpl::forward(const torch::Tensor& x, const torch::Tensor&) {
  if (recompute() == Recompute::kFull) {
    return Checkpointed([this](const torch::Tensor& z) { return Segment(1, Segment(0, z)); }, x);
  }
  return Segment(1, Segment(0, x));
}

torch::Tensor BlockLayerImpl::forward_segment(int segment, const torch::Tensor& x, const torch::Tensor&) {
  assert(segment == 0 || segment == 1);
  if (recompute() == Recompute::kFull) {
    return Checkpointed([this, segment](const torch::Tensor& z) { return Segment(segment, z); }, x);
  }
  return Segment(segment, x);
}

torch::Tensor BlockLayerImpl::Segment(int segment, const torch::Tensor& x) {
  if (segment == 0) return x + attn->forward(Norm(ln_1, x));
  return x + mlp->forward(Norm(ln_2, x));
}

void BlockLayerImpl::set_recompute(Recompute r) {
  PlannerLayerImpl::set_recompute(r);
  attn->selective = mlp->selective = r == Recompute::kSelective;
}

int BlockLayerImpl::segment_of(const std::string& parameter) const {
  return parameter.rfind("ln_2.", 0) == 0 || parameter.rfind("mlp.", 0) == 0 ? 1 : 0;
}

LmHeadImpl::LmHeadImpl(int vocab_size, int n_embd) {
  weight = register_parameter("weight", torch::empty({vocab_size, n_embd}));
}

HeadLayerImpl::HeadLayerImpl(const GptConfig& cfg, uint64_t seed, torch::Tensor tied, TpGroupPtr tp, bool init)
    : PlannerLayerImpl(pb::LAYER_HEAD, cfg.n_layer + 1, "head"), vocab_(cfg.vocab_size), tp_(std::move(tp)) {
  const int64_t h = cfg.n_embd;
  if (cfg.llama()) {
    rms_f = register_module("ln_f", std::make_shared<RmsNormImpl>(h, cfg.norm_eps));
  } else {
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({h})));
  }
  if (tied.defined()) {
    // Not registered: the stage already holds it as the embed's wte.weight.
    lm_weight_ = std::move(tied);
    tied_ = true;
  } else {
    lm_head = register_module("lm_head", LmHead(cfg.vocab_size, cfg.n_embd));
    lm_weight_ = lm_head->weight;
    if (init) {
      // Tied: a copy of the token table (layer 0's stream); untied: the
      // head's own draw.
      auto gen = LayerGenerator(seed, cfg.tied ? 0 : index());
      InitTokenTable(lm_weight_, gen);
    }
  }
  // A tied table is sharded by its embed already.
  if (Sharded(tp_)) ShardParameters(*this, *tp_);
}

torch::Tensor PaddedLogitsOf(const torch::Tensor& x, const torch::Tensor& w, int64_t multiple) {
  // Under autocast, the weight's compute copy, padded once a step
  // (ComputeCopies), where autocast would pad it in fp32 and cast the
  // padded table every micro-batch (no leaf, so not in its cache).
  if (const auto dtype = compat::AutocastDtype(x); dtype && w.scalar_type() != *dtype) {
    auto wc = ComputeWeight(w, *dtype, multiple);
    compat::AutocastOff off;
    return torch::matmul(x.to(*dtype), wc.t());
  }
  const int64_t v = w.size(0);
  if (multiple <= 1 || v % multiple == 0) return torch::matmul(x, w.t());
  return torch::matmul(x, torch::constant_pad_nd(w, {0, 0, 0, PaddedRows(v, multiple) - v}).t());
}

torch::Tensor LogitsOf(const torch::Tensor& x, const torch::Tensor& w, int64_t multiple) {
  auto logits = PaddedLogitsOf(x, w, multiple);
  return logits.size(-1) == w.size(0) ? logits : logits.narrow(-1, 0, w.size(0));
}

// On a GPU the head's products run over a vocabulary padded to a multiple
// of 64: GPT-2's 50,257 words make every leading dimension odd, and cuBLAS
// then falls back to unaligned kernels that ran gpt2-medium's head at about
// 100 TFLOP/s on an H100 (82 ms of a 331 ms step). On the CPU, where
// alignment buys nothing, the product is the plain one, bit for bit.
int64_t HeadRowsMultiple(const torch::Device& device) { return device.is_cuda() ? 64 : 1; }

namespace {
int64_t HeadPadding(const torch::Tensor& x) { return HeadRowsMultiple(x.device()); }
}  // namespace

torch::Tensor HeadLayerImpl::Normed(const torch::Tensor& x) {
  if (rms_f) return static_cast<RmsNormImpl&>(*rms_f).forward(x);
  return Norm(ln_f, x);
}

torch::Tensor HeadLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& targets) {
  if (Sharded(tp_)) {  // logits for our vocabulary range only: [b,t,V_r]
    TORCH_CHECK(targets.defined(), "a tensor-parallel head needs the targets");
    auto logits = LogitsOf(CopyToTp(Normed(x), *tp_), lm_weight_, HeadPadding(x));
    return TpCrossEntropy(logits, targets, vocab_, *tp_);
  }
  auto h = Normed(x);
  if (!targets.defined()) return LogitsOf(h, lm_weight_, HeadPadding(x)).contiguous();  // [b,t,V]
  // The loss in fp32 whatever the autocast (cross_entropy.h), of the padded
  // product itself: the fused kernels give the padding a zero gradient, so
  // the logits are not narrowed (nor their gradient widened back); ATen's
  // path takes the words' columns.
  auto logits = PaddedLogitsOf(h, lm_weight_, HeadPadding(x));  // [b,t,P]
  return CrossEntropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}), lm_weight_.size(0));
}

PlannerLayer MakeLayer(const GptConfig& cfg, int global_index, uint64_t seed, TpGroupPtr tp, bool init) {
  assert(global_index >= 0 && global_index < cfg.num_layers());
  assert(!Sharded(tp) || CheckTensorParallel(cfg, tp->size).ok());
  if (global_index == 0) return std::make_shared<EmbedLayerImpl>(cfg, seed, tp, init);
  if (global_index == cfg.num_layers() - 1) {
    return std::make_shared<HeadLayerImpl>(cfg, seed, torch::Tensor(), tp, init);
  }
  if (cfg.llama()) return std::make_shared<LlamaBlockLayerImpl>(cfg, global_index - 1, seed, tp, init);
  return std::make_shared<BlockLayerImpl>(cfg, global_index - 1, seed, tp, init);
}

GptStageImpl::GptStageImpl(const GptConfig& cfg, int first, int last, uint64_t seed, TpGroupPtr tp,
                           bool init)
    : GptStageImpl(cfg, std::vector<std::pair<int, int>>{{first, last}}, seed, std::move(tp), init) {}

GptStageImpl::GptStageImpl(const GptConfig& cfg, const std::vector<std::pair<int, int>>& ranges, uint64_t seed,
                           TpGroupPtr tp, bool init)
    : cfg_(cfg), tp_(std::move(tp)), ranges_(ranges), position_(static_cast<size_t>(cfg.num_layers()), -1) {
  assert(!ranges.empty());
  first_ = cfg.num_layers();
  std::vector<int> global;  // of layers_[i]
  for (const auto& [first, last] : ranges) {
    assert(0 <= first && first <= last && last < cfg.num_layers());
    first_ = std::min(first_, first);
    last_ = std::max(last_, last);
    for (int i = first; i <= last; ++i) {
      assert(position_[i] < 0);
      position_[i] = static_cast<int>(layers_.size());
      layers_.push_back(nullptr);
      global.push_back(i);
    }
  }
  // The embed first, wherever its chunk is: the head of a stage that holds
  // it too reads its token table (one LM tensor).
  if (holds(0)) layers_[position_[0]] = MakeLayer(cfg, 0, seed, tp_, init);
  for (int i = 1; i < cfg.num_layers(); ++i) {
    if (!holds(i)) continue;
    if (i == cfg.num_layers() - 1 && holds(0) && cfg.tied) {
      auto embed = std::static_pointer_cast<EmbedLayerImpl>(layers_[position_[0]]);
      layers_[position_[i]] = std::make_shared<HeadLayerImpl>(cfg, seed, embed->token_table(), tp_, init);
    } else {
      layers_[position_[i]] = MakeLayer(cfg, i, seed, tp_, init);
    }
  }
  for (size_t k = 0; k < layers_.size(); ++k) layers_[k] = register_module(std::to_string(global[k]), layers_[k]);
}

torch::Tensor GptStageImpl::forward(const torch::Tensor& input, const torch::Tensor& targets) {
  assert(ranges_.size() == 1);
  torch::Tensor x = input;
  for (auto& layer : layers_) x = layer->forward(x, targets);
  return x;
}

torch::Tensor GptStageImpl::forward_chunk(int c, const torch::Tensor& input, const torch::Tensor& targets) {
  torch::Tensor x = input;
  for (auto& layer : chunk_layers(c)) x = layer->forward(x, targets);
  return x;
}

std::vector<PlannerLayer> GptStageImpl::chunk_layers(int c) const {
  const auto [first, last] = ranges_[static_cast<size_t>(c)];
  std::vector<PlannerLayer> out;
  for (int i = first; i <= last; ++i) out.push_back(layers_[position_[i]]);
  return out;
}

int GptStageImpl::chunk_of(int global_index) const {
  for (size_t c = 0; c < ranges_.size(); ++c) {
    if (ranges_[c].first <= global_index && global_index <= ranges_[c].second) return static_cast<int>(c);
  }
  return -1;
}

std::vector<torch::Tensor> GptStageImpl::tied_weights() const {
  std::vector<torch::Tensor> out;
  if (!cfg_.tied) return out;
  if (has_embed()) {
    out.push_back(std::static_pointer_cast<EmbedLayerImpl>(layer(0))->token_table());
  }
  if (has_head() && !has_embed()) {
    out.push_back(std::static_pointer_cast<HeadLayerImpl>(layer(cfg_.num_layers() - 1))->lm_weight());
  }
  return out;
}

std::unique_ptr<ComputeCopies> MakeComputeCopies(const std::vector<PlannerLayer>& layers, at::ScalarType dtype) {
  std::vector<torch::Tensor> params;
  torch::Tensor head;
  for (const auto& layer : layers) {
    for (auto& p : layer->parameters()) params.push_back(p);
    if (const auto* h = dynamic_cast<const HeadLayerImpl*>(layer.get())) head = h->lm_weight();
  }
  const auto device = params.empty() ? torch::Device(torch::kCPU) : params.front().device();
  return std::make_unique<ComputeCopies>(params, dtype, head, HeadRowsMultiple(device));
}

std::unique_ptr<ComputeCopies> GptStageImpl::MakeComputeCopies(at::ScalarType dtype) const {
  return model::MakeComputeCopies(layers_, dtype);
}

int64_t CountUniqueParameters(const torch::nn::Module& module) {
  std::unordered_set<const void*> seen;
  int64_t n = 0;
  for (const auto& p : module.parameters()) {
    if (seen.insert(p.data_ptr()).second) n += p.numel();
  }
  return n;
}

}  // namespace ob::model
