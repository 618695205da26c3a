// Tensor parallelism inside a node (SPEC §2, §5): a pipeline stage of the
// GPT split over the t ranks of a TP group, Megatron-style.
//
//   attention  c_attn column-parallel: rank r holds the q, k and v rows of
//              its heads [r·a/t, (r+1)·a/t); c_proj row-parallel: the columns
//              of its heads; c_proj's bias replicated, added once after the
//              all-reduce;
//   MLP        c_fc column-parallel (rows and bias split in t equal parts),
//              c_proj row-parallel (columns split), bias replicated;
//   embedding  vocabulary-parallel: rank r owns token ids
//              [⌊r·V/t⌋, ⌊(r+1)·V/t⌋) (V need not divide by t: no padding, so
//              the losses are the unsharded model's); a masked lookup, then
//              an all-reduce; wpe replicated;
//   LM head    the same vocabulary shard (tied: the embed's tensor when the
//              stage holds both); logits only for the shard, never [b,s,V];
//              the cross-entropy from all-reduces of the max (no gradient),
//              the sum of exponentials and the target's logit;
//   LayerNorms replicated.
//
// One all-reduce after each row-parallel layer in forward (ReduceFromTp)
// and its conjugate before each column-parallel layer in backward
// (CopyToTp): 2 per block each way, 1 for the embedding, 3 small ones for
// the loss. Every rank of the group returns the same activations and loss.
//
// Ownership of parameters is (global layer, name, shard r of t) everywhere:
// ShardOf / MergeShards are the one definition of the layout, used by the
// stage here, and to be used by snapshots, recovery copies and checkpoints.
//
// t = 1 is the unsharded model: no communication, GptStage's arithmetic up
// to rounding (biases of row-parallel layers are added after the product). Thread-safety: like torch::nn::Module. Failure: bad degrees are
// kConfig from CheckTensorParallel; collectives throw c10::Error (a peer
// gone), which the caller catches at its boundary.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ob/model/config.h"
#include "ob/model/gpt.h"
#include "ob/status.h"
#include "ob/torch_compat.h"

namespace ob::model {

// The ranks of one stage's TP group, and the group (Gloo on CPU, NCCL on
// CUDA); `group` may be null when size is 1.
struct TpGroup {
  int rank = 0;
  int size = 1;
  c10::intrusive_ptr<compat::Backend> group;
};

// kConfig unless t divides the heads and the MLP width and t <= V.
Status CheckTensorParallel(const GptConfig& cfg, int t);

// Identity forward, all-reduce (sum) of the gradient backward.
torch::Tensor CopyToTp(const torch::Tensor& x, const TpGroup& g);
// All-reduce (sum) forward, identity backward.
torch::Tensor ReduceFromTp(const torch::Tensor& x, const TpGroup& g);

// How a parameter (named as in gpt.h, relative to its layer: "wte.weight",
// "attn.c_attn.bias", "lm_head.weight") is split.
enum class ShardKind {
  kReplicated,  // every rank holds all of it
  kRows,        // dim 0 in t equal parts
  kColumns,     // dim 1 in t equal parts
  kHeadRows,    // dim 0 = [q; k; v], each in t equal parts (rank r: its heads' rows of each)
  kVocabRows,   // dim 0 in the vocabulary ranges above
};
ShardKind ShardKindOf(const std::string& layer_param);

// Rank r's ids [first, last) of a vocabulary of V over t ranks.
std::pair<int64_t, int64_t> VocabRange(int64_t vocab, int t, int r);

// Rank r of t's shard of `full` (a copy), and the full tensor from the t
// shards in rank order. REQUIRES: CheckTensorParallel(t) for the model.
torch::Tensor ShardOf(const std::string& layer_param, const torch::Tensor& full, int t, int r);
torch::Tensor MergeShards(const std::string& layer_param, const std::vector<torch::Tensor>& shards);

// Global layers [first, last] sharded for g (size t, rank r). Parameters
// are named as GptStage's ("<global layer>.<name>"), each the shard; initial
// weights are exactly the shards of GptStage(cfg, first, last, seed)'s.
class TpGptStageImpl : public torch::nn::Module {
 public:
  // REQUIRES: CheckTensorParallel(cfg, g.size).ok(), 0 <= first <= last < cfg.num_layers().
  TpGptStageImpl(const GptConfig& cfg, int first, int last, uint64_t seed, TpGroup g);

  // As GptStage::forward: ids [b,s] or activations [b,s,h] in, activations
  // out, or the mean loss when the stage holds the head. The head needs
  // `targets` when t > 1 (no rank forms the whole logits).
  torch::Tensor forward(const torch::Tensor& input, const torch::Tensor& targets = {});

  int first() const { return first_; }
  int last() const { return last_; }
  bool has_embed() const { return first_ == 0; }
  bool has_head() const { return last_ == cfg_.num_layers() - 1; }
  const TpGroup& tp() const { return tp_; }
  // The LM weight shards a pipeline sums between its first and last stage
  // (as GptStage::tied_weights), for this rank's vocabulary range.
  std::vector<torch::Tensor> tied_weights() const;
  const GptConfig& config() const { return cfg_; }

 private:
  torch::Tensor P(int layer, const std::string& name) const;
  torch::Tensor Embed(const torch::Tensor& ids);
  torch::Tensor Block(int layer, const torch::Tensor& x);
  torch::Tensor Head(const torch::Tensor& x, const torch::Tensor& targets);

  GptConfig cfg_;
  int first_, last_;
  TpGroup tp_;
  std::map<std::string, torch::Tensor> params_;  // "<layer>.<name>" -> registered shard
};
TORCH_MODULE(TpGptStage);

}  // namespace ob::model
