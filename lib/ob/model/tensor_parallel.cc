// Tensor-parallel GPT stage (see tensor_parallel.h).
#include "ob/model/tensor_parallel.h"

#include <cassert>
#include <sstream>

namespace ob::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group lives in the TpGroup of the stage that built the graph, which
// outlives every backward of it: the context keeps its address.
compat::Backend* GroupOf(AutogradContext* ctx) {
  return reinterpret_cast<compat::Backend*>(ctx->saved_data["group"].toInt());
}

torch::Tensor AllReduced(const torch::Tensor& x, compat::Backend* group,
                         c10d::ReduceOp op = c10d::ReduceOp::SUM) {
  std::vector<torch::Tensor> v = {x.contiguous().clone()};
  c10d::AllreduceOptions opts;
  opts.reduceOp = op;
  group->allreduce(v, opts)->wait();
  return v[0];
}

struct CopyToTpFn : public torch::autograd::Function<CopyToTpFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {AllReduced(grad[0], GroupOf(ctx)), torch::Tensor()};
  }
};

struct ReduceFromTpFn : public torch::autograd::Function<ReduceFromTpFn> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x, int64_t group) {
    return AllReduced(x, reinterpret_cast<compat::Backend*>(group));
  }
  static variable_list backward(AutogradContext*, variable_list grad) { return {grad[0], torch::Tensor()}; }
};

int64_t GroupId(const TpGroup& g) { return reinterpret_cast<int64_t>(g.group.get()); }

// "3.attn.c_attn.weight" -> "attn.c_attn.weight".
std::string LayerParam(const std::string& name) { return name.substr(name.find('.') + 1); }

// Registers `t` under the dotted `path` below `root`, making plain modules
// for the path's inner names, so named_parameters() reproduces the path.
void RegisterAt(torch::nn::Module& root, const std::string& path, const torch::Tensor& t) {
  torch::nn::Module* m = &root;
  size_t start = 0;
  for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', start)) {
    const std::string part = path.substr(start, dot - start);
    auto children = m->named_children();
    auto* found = children.find(part);
    m = found != nullptr ? found->get() : m->register_module(part, std::make_shared<torch::nn::Module>()).get();
    start = dot + 1;
  }
  m->register_parameter(path.substr(start), t);
}

}  // namespace

Status CheckTensorParallel(const GptConfig& cfg, int t) {
  if (t < 1) return Status::Config("tensor parallelism " + std::to_string(t) + " is not a degree");
  if (cfg.n_head % t != 0) {
    return Status::Config("tensor parallelism " + std::to_string(t) + " does not divide the model's " +
                          std::to_string(cfg.n_head) + " attention heads");
  }
  if ((4 * cfg.n_embd) % t != 0 || t > cfg.vocab_size) {
    return Status::Config("tensor parallelism " + std::to_string(t) + " does not divide the MLP width " +
                          std::to_string(4 * cfg.n_embd) + " or exceeds the vocabulary");
  }
  return Status::Ok();
}

torch::Tensor CopyToTp(const torch::Tensor& x, const TpGroup& g) {
  if (g.size == 1) return x;
  return CopyToTpFn::apply(x, GroupId(g));
}

torch::Tensor ReduceFromTp(const torch::Tensor& x, const TpGroup& g) {
  if (g.size == 1) return x;
  return ReduceFromTpFn::apply(x, GroupId(g));
}

ShardKind ShardKindOf(const std::string& p) {
  if (p == "wte.weight" || p == "lm_head.weight") return ShardKind::kVocabRows;
  if (p == "attn.c_attn.weight" || p == "attn.c_attn.bias") return ShardKind::kHeadRows;
  if (p == "mlp.c_fc.weight" || p == "mlp.c_fc.bias") return ShardKind::kRows;
  if (p == "attn.c_proj.weight" || p == "mlp.c_proj.weight") return ShardKind::kColumns;
  return ShardKind::kReplicated;  // LayerNorms, wpe, row-parallel biases
}

std::pair<int64_t, int64_t> VocabRange(int64_t vocab, int t, int r) {
  return {vocab * r / t, vocab * (r + 1) / t};
}

torch::Tensor ShardOf(const std::string& p, const torch::Tensor& full, int t, int r) {
  torch::NoGradGuard no_grad;
  switch (ShardKindOf(p)) {
    case ShardKind::kReplicated:
      return full.clone();
    case ShardKind::kRows:
      return full.chunk(t, 0)[r].clone();
    case ShardKind::kColumns:
      return full.chunk(t, 1)[r].clone();
    case ShardKind::kHeadRows: {
      auto qkv = full.chunk(3, 0);
      return torch::cat({qkv[0].chunk(t, 0)[r], qkv[1].chunk(t, 0)[r], qkv[2].chunk(t, 0)[r]}, 0);
    }
    case ShardKind::kVocabRows: {
      auto [lo, hi] = VocabRange(full.size(0), t, r);
      return full.slice(0, lo, hi).clone();
    }
  }
  return full.clone();
}

torch::Tensor MergeShards(const std::string& p, const std::vector<torch::Tensor>& shards) {
  torch::NoGradGuard no_grad;
  switch (ShardKindOf(p)) {
    case ShardKind::kReplicated:
      return shards.front().clone();
    case ShardKind::kRows:
    case ShardKind::kVocabRows:
      return torch::cat(shards, 0);
    case ShardKind::kColumns:
      return torch::cat(shards, 1);
    case ShardKind::kHeadRows: {
      std::vector<torch::Tensor> q, k, v;
      for (const auto& s : shards) {
        auto parts = s.chunk(3, 0);
        q.push_back(parts[0]);
        k.push_back(parts[1]);
        v.push_back(parts[2]);
      }
      return torch::cat({torch::cat(q, 0), torch::cat(k, 0), torch::cat(v, 0)}, 0);
    }
  }
  return shards.front().clone();
}

TpGptStageImpl::TpGptStageImpl(const GptConfig& cfg, int first, int last, uint64_t seed, TpGroup g)
    : cfg_(cfg), first_(first), last_(last), tp_(std::move(g)) {
  assert(CheckTensorParallel(cfg, tp_.size).ok());
  GptStage full(cfg, first, last, seed);  // the unsharded weights, then our shards of them
  for (const auto& item : full->named_parameters()) {
    torch::Tensor shard = ShardOf(LayerParam(item.key()), item.value(), tp_.size, tp_.rank);
    RegisterAt(*this, item.key(), shard);
    params_[item.key()] = shard;
  }
}

torch::Tensor TpGptStageImpl::P(int layer, const std::string& name) const {
  return params_.at(std::to_string(layer) + "." + name);
}

torch::Tensor TpGptStageImpl::Embed(const torch::Tensor& ids) {
  const torch::Tensor wte = P(0, "wte.weight");
  torch::Tensor tokens;
  if (tp_.size == 1) {
    tokens = torch::embedding(wte, ids);
  } else {  // ids outside our range look up row 0 and are zeroed before the sum
    auto [lo, hi] = VocabRange(cfg_.vocab_size, tp_.size, tp_.rank);
    auto mine = (ids >= lo).logical_and(ids < hi);
    auto local = torch::where(mine, ids - lo, torch::zeros_like(ids));
    tokens = ReduceFromTp(torch::embedding(wte, local) * mine.unsqueeze(-1).to(wte.dtype()), tp_);
  }
  auto pos = torch::arange(ids.size(1), ids.options().dtype(torch::kLong));
  return tokens + torch::embedding(P(0, "wpe.weight"), pos).unsqueeze(0);
}

torch::Tensor TpGptStageImpl::Block(int l, const torch::Tensor& x) {
  const int64_t b = x.size(0), s = x.size(1), h = x.size(2);
  const int64_t heads = cfg_.n_head / tp_.size, d = h / cfg_.n_head, local = heads * d;
  auto ln = [&](const torch::Tensor& z, const std::string& n) {
    return torch::layer_norm(z, {h}, P(l, n + ".weight"), P(l, n + ".bias"));
  };
  // Attention: our heads' q, k, v, then our part of the output projection.
  auto a = CopyToTp(ln(x, "ln_1"), tp_);
  auto qkv = torch::linear(a, P(l, "attn.c_attn.weight"), P(l, "attn.c_attn.bias")).split(local, 2);
  auto split = [&](const torch::Tensor& z) { return z.view({b, s, heads, d}).transpose(1, 2); };
  auto y = compat::CausalSelfAttention(split(qkv[0]), split(qkv[1]), split(qkv[2]));
  y = torch::linear(y.transpose(1, 2).contiguous().view({b, s, local}), P(l, "attn.c_proj.weight"));
  auto x1 = x + (ReduceFromTp(y, tp_) + P(l, "attn.c_proj.bias"));
  // MLP: our columns of c_fc, our rows of c_proj's input.
  auto m = CopyToTp(ln(x1, "ln_2"), tp_);
  m = at::gelu(torch::linear(m, P(l, "mlp.c_fc.weight"), P(l, "mlp.c_fc.bias")), "tanh");
  m = torch::linear(m, P(l, "mlp.c_proj.weight"));
  return x1 + (ReduceFromTp(m, tp_) + P(l, "mlp.c_proj.bias"));
}

torch::Tensor TpGptStageImpl::Head(const torch::Tensor& x, const torch::Tensor& targets) {
  const int L = cfg_.num_layers() - 1;
  const int64_t h = x.size(2);
  const torch::Tensor w = has_embed() ? P(0, "wte.weight") : P(L, "lm_head.weight");
  auto z = torch::layer_norm(x, {h}, P(L, "ln_f.weight"), P(L, "ln_f.bias"));
  auto logits = torch::matmul(CopyToTp(z, tp_), w.t());  // [b,s,V_r]
  if (tp_.size == 1) {
    if (!targets.defined()) return logits;
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                                                targets.reshape({-1}));
  }
  // The cross-entropy over the vocabulary's shards, in fp32:
  //   loss = log Σ_r Σ_v exp(l_v − M) − (l_target − M),  M the global max.
  TORCH_CHECK(targets.defined(), "a tensor-parallel head needs the targets");
  auto lf = logits.reshape({-1, logits.size(-1)}).to(torch::kFloat);
  torch::Tensor max;
  {
    torch::NoGradGuard no_grad;
    max = AllReduced(std::get<0>(lf.max(-1)), tp_.group.get(), c10d::ReduceOp::MAX);
  }
  auto shifted = lf - max.unsqueeze(-1);
  auto sum_exp = ReduceFromTp(shifted.exp().sum(-1), tp_);
  auto [lo, hi] = VocabRange(cfg_.vocab_size, tp_.size, tp_.rank);
  auto t = targets.reshape({-1});
  auto mine = (t >= lo).logical_and(t < hi);
  auto local = torch::where(mine, t - lo, torch::zeros_like(t));
  auto target_logit = ReduceFromTp(shifted.gather(1, local.unsqueeze(1)).squeeze(1) * mine.to(torch::kFloat), tp_);
  return (sum_exp.log() - target_logit).mean();
}

torch::Tensor TpGptStageImpl::forward(const torch::Tensor& input, const torch::Tensor& targets) {
  torch::Tensor x = input;
  for (int l = first_; l <= last_; ++l) {
    if (l == 0) {
      x = Embed(x);
    } else if (l == cfg_.num_layers() - 1) {
      x = Head(x, targets);
    } else {
      x = Block(l, x);
    }
  }
  return x;
}

std::vector<torch::Tensor> TpGptStageImpl::tied_weights() const {
  std::vector<torch::Tensor> out;
  if (has_embed()) out.push_back(P(0, "wte.weight"));
  if (has_head() && !has_embed()) out.push_back(P(cfg_.num_layers() - 1, "lm_head.weight"));
  return out;
}

}  // namespace ob::model
