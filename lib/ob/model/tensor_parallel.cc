// Tensor parallelism: shards and the collectives of the sharded layers (see tensor_parallel.h).
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

// Gloo (CPU tensors) sums no bf16: there the sum runs in fp32 and comes
// back in the input's dtype; NCCL sums bf16 itself.
torch::Tensor AllReduced(const torch::Tensor& x, compat::Backend* group,
                         c10d::ReduceOp op = c10d::ReduceOp::SUM) {
  const bool widen = !x.is_cuda() && x.scalar_type() == torch::kBFloat16;
  std::vector<torch::Tensor> v = {widen ? x.to(torch::kFloat).contiguous() : x.contiguous().clone()};
  c10d::AllreduceOptions opts;
  opts.reduceOp = op;
  group->allreduce(v, opts)->wait();
  return widen ? v[0].to(x.scalar_type()) : v[0];
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

}  // namespace

Status CheckTensorParallel(const GptConfig& cfg, int t) {
  if (t < 1) return Status::Config("tensor parallelism " + std::to_string(t) + " is not a degree");
  if (cfg.n_head % t != 0) {
    return Status::Config("tensor parallelism " + std::to_string(t) + " does not divide the model's " +
                          std::to_string(cfg.n_head) + " attention heads");
  }
  // Each rank computes whole kv heads: a degree above them would need
  // them replicated (and their gradients summed) across the ranks that
  // share one, which ob does not do.
  if (cfg.kv_heads() % t != 0) {
    return Status::Config("tensor parallelism " + std::to_string(t) + " does not divide the model's " +
                          std::to_string(cfg.kv_heads()) + " key/value heads");
  }
  if (cfg.mlp_width() % t != 0 || t > cfg.vocab_size) {
    return Status::Config("tensor parallelism " + std::to_string(t) + " does not divide the MLP width " +
                          std::to_string(cfg.mlp_width()) + " or exceeds the vocabulary");
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
  // The Llama family (llama.h): q, k and v separately by heads (k and v by
  // kv heads), the SwiGLU's gate and up by rows; o and down by columns.
  if (p == "attn.q_proj.weight" || p == "attn.q_proj.bias" || p == "attn.k_proj.weight" || p == "attn.k_proj.bias" ||
      p == "attn.v_proj.weight" || p == "attn.v_proj.bias" || p == "mlp.gate_proj.weight" || p == "mlp.up_proj.weight") {
    return ShardKind::kRows;
  }
  if (p == "attn.o_proj.weight" || p == "mlp.down_proj.weight") return ShardKind::kColumns;
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

bool SplitsInto(const std::string& p, const torch::Tensor& full, int t) {
  switch (ShardKindOf(p)) {
    case ShardKind::kReplicated: return true;
    case ShardKind::kVocabRows: return full.dim() >= 1 && full.size(0) >= t;
    case ShardKind::kRows: return full.dim() >= 1 && full.size(0) % t == 0;
    case ShardKind::kHeadRows: return full.dim() >= 1 && full.size(0) % (3 * t) == 0;
    case ShardKind::kColumns: return full.dim() >= 2 && full.size(1) % t == 0;
  }
  return false;
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

std::vector<torch::Tensor> PieceViews(const std::string& p, const torch::Tensor& shard, int t, int r, int T,
                                      int piece, int64_t vocab) {
  const int k = T / t, i = piece - FirstPiece(t, r, T);
  assert(T % t == 0 && 0 <= i && i < k);
  switch (ShardKindOf(p)) {
    case ShardKind::kReplicated:
      return {shard};
    case ShardKind::kRows:
      return {shard.chunk(k, 0)[i]};
    case ShardKind::kColumns:
      return {shard.chunk(k, 1)[i]};
    case ShardKind::kHeadRows: {
      auto qkv = shard.chunk(3, 0);
      return {qkv[0].chunk(k, 0)[i], qkv[1].chunk(k, 0)[i], qkv[2].chunk(k, 0)[i]};
    }
    case ShardKind::kVocabRows: {
      const int64_t base = VocabRange(vocab, t, r).first;  // rank r's first row
      auto [lo, hi] = VocabRange(vocab, T, piece);
      return {shard.slice(0, lo - base, hi - base)};
    }
  }
  return {shard};
}

torch::Tensor PieceOf(const std::string& p, const torch::Tensor& shard, int t, int r, int T, int piece,
                      int64_t vocab) {
  torch::NoGradGuard no_grad;
  auto views = PieceViews(p, shard, t, r, T, piece, vocab);
  if (views.size() == 1) return views[0].clone();
  return torch::cat(views, 0);
}

torch::Tensor TpEmbedding(const torch::Tensor& table, const torch::Tensor& ids, int64_t vocab,
                          const TpGroup& g) {
  if (g.size == 1) return torch::embedding(table, ids);
  // Ids outside our range look up row 0 and are zeroed before the sum.
  auto [lo, hi] = VocabRange(vocab, g.size, g.rank);
  auto mine = (ids >= lo).logical_and(ids < hi);
  auto local = torch::where(mine, ids - lo, torch::zeros_like(ids));
  return ReduceFromTp(torch::embedding(table, local) * mine.unsqueeze(-1).to(table.dtype()), g);
}

torch::Tensor TpCrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab,
                             const TpGroup& g) {
  auto lf = logits.reshape({-1, logits.size(-1)}).to(torch::kFloat);
  if (g.size == 1) return torch::nn::functional::cross_entropy(lf, targets.reshape({-1}));
  // loss = log Σ_r Σ_v exp(l_v − M) − (l_target − M),  M the global max.
  torch::Tensor max;
  {
    torch::NoGradGuard no_grad;
    max = AllReduced(std::get<0>(lf.max(-1)), g.group.get(), c10d::ReduceOp::MAX);
  }
  auto shifted = lf - max.unsqueeze(-1);
  auto sum_exp = ReduceFromTp(shifted.exp().sum(-1), g);
  auto [lo, hi] = VocabRange(vocab, g.size, g.rank);
  auto t = targets.reshape({-1});
  auto mine = (t >= lo).logical_and(t < hi);
  auto local = torch::where(mine, t - lo, torch::zeros_like(t));
  auto target_logit = ReduceFromTp(shifted.gather(1, local.unsqueeze(1)).squeeze(1) * mine.to(torch::kFloat), g);
  return (sum_exp.log() - target_logit).mean();
}

void ShardParameters(torch::nn::Module& layer, const TpGroup& g) {
  if (g.size == 1) return;
  torch::NoGradGuard no_grad;
  for (auto& item : layer.named_parameters()) {
    item.value().set_data(ShardOf(item.key(), item.value(), g.size, g.rank));
  }
}

}  // namespace ob::model
