// Tensor parallelism inside a node (design/model.md, design/launch.md): the layers of a GPT
// stage (gpt.h) built with a TpGroup of t > 1 ranks hold rank r's shard of
// every parameter and compute Megatron-style:
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
// the loss. Every rank of the group returns the same activations and loss,
// and the same gradients of replicated parameters and of the stage input.
//
// Ownership of parameters is (global layer, name, shard r of t) everywhere:
// ShardOf / MergeShards are the one definition of the layout, used by the
// layers, and by whatever moves shards between ranks or to files.
//
// A layer built without a group (or t = 1) is the unsharded model, with
// GptStage's arithmetic unchanged. Thread-safety: like torch::nn::Module.
// Failure: bad degrees are kConfig from CheckTensorParallel; collectives
// throw c10::Error (a peer gone), which the caller catches at its boundary.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ob/model/config.h"
#include "ob/model/pieces.h"
#include "ob/status.h"
#include "ob/torch_compat.h"

namespace ob::model {

// The ranks of one stage's TP group, and the group (Gloo on CPU, NCCL on
// CUDA); `group` may be null when size is 1, and may be set after the
// layers are built (a worker builds its stage, then joins its groups), but
// before their first forward.
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
// Whether `full` (a whole tensor of `layer_param`) splits in t shards as
// ShardOf takes them: a whole tensor read from a file may not.
bool SplitsInto(const std::string& layer_param, const torch::Tensor& full, int t);
torch::Tensor MergeShards(const std::string& layer_param, const std::vector<torch::Tensor>& shards);

// Pieces: replicas split with different degrees (a pipeline of t = 2 beside
// one of t = 4) meet at a common refinement. With T a multiple of every
// degree (their least common multiple), piece P (0 <= P < T) of a parameter
// is shard P of T; rank r of t holds the T/t pieces [r·T/t, (r+1)·T/t), and its shard is
// their MergeShards. A replicated parameter is one piece, every rank's
// whole tensor. `vocab` is the model's V (vocabulary rows split at
// ⌊P·V/T⌋, which for P = r·T/t is rank r's own first row).
//
// PieceViews: views into rank r of t's `shard` that make up piece P: one
// view, or three (q, k and v rows) for kHeadRows; writing them writes the
// shard. PieceOf: the piece as one new tensor (MergeShards of the views).
// REQUIRES: t divides T, P within rank r's pieces, CheckTensorParallel(T).
std::vector<torch::Tensor> PieceViews(const std::string& layer_param, const torch::Tensor& shard, int t,
                                      int r, int T, int piece, int64_t vocab);
torch::Tensor PieceOf(const std::string& layer_param, const torch::Tensor& shard, int t, int r, int T,
                      int piece, int64_t vocab);
// FirstPiece (pieces.h): where rank r of t's pieces start.

// The pieces of the sharded layers (gpt.cc) that talk to the group:
// rank g.rank's rows [VocabRange) of the token table looked up for `ids`
// (ids outside the range contribute zeros) and summed over the group; and
// the mean cross-entropy over the whole vocabulary from each rank's logits
// for its range [b,s,V_r] (fp32, from all-reduces of the max, the sum of
// exponentials and the target's logit: no rank forms the whole logits).
torch::Tensor TpEmbedding(const torch::Tensor& table_shard, const torch::Tensor& ids, int64_t vocab,
                          const TpGroup& g);
torch::Tensor TpCrossEntropy(const torch::Tensor& logits_shard, const torch::Tensor& targets,
                             int64_t vocab, const TpGroup& g);

// Replaces every parameter of `layer` (named relative to the layer, as
// above) by rank g.rank's shard of it, in place (the tensors keep their
// identity: a tied head's reference follows the embed's table).
void ShardParameters(torch::nn::Module& layer, const TpGroup& g);

}  // namespace ob::model
