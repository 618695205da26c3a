// The GPT (design/model.md) as an ordered list of planner layers, each buildable alone:
//
//   global index 0          embed   ids [b,t] int64      -> x [b,t,h]
//   global index 1..L       block   x [b,t,h]            -> x [b,t,h]   (block i-1)
//   global index L+1        head    x [b,t,h], y [b,t]   -> scalar mean cross-entropy
//
// Pre-LN blocks (x + attn(ln_1(x)); x + mlp(ln_2(x))), tanh-GELU MLP, learned
// positions, LM head tied to the token table.
//
// Initialisation is deterministic and independent of which other layers exist:
// layer i draws from a CPU generator seeded with Mix64(seed, i) (GPT-2 init:
// N(0, 0.02) weights, N(0, 0.02/sqrt(2L)) for residual projections, zero
// biases, LayerNorm 1/0). A stand-alone head draws its LM weight from layer 0's
// stream, so it equals the embed's token table. Modules are built on CPU; move
// them with ->to(device) so CPU and CUDA start from the same weights.
//
// Parameter names (stable; checkpoints key on them), relative to a layer:
//   embed: wte.weight [V,h], wpe.weight [s,h]
//   block: ln_1.{weight,bias}, attn.c_attn.{weight,bias} [3h,h],[3h],
//          attn.c_proj.{weight,bias}, ln_2.{weight,bias},
//          mlp.c_fc.{weight,bias} [4h,h],[4h], mlp.c_proj.{weight,bias} [h,4h],[h]
//          (Linear weights are [out, in], i.e. HF GPT-2's Conv1D transposed)
//   head:  ln_f.{weight,bias}, lm_head.weight [V,h] -- the last only when the
//          head does not share its stage with the embed; when it does, the tied
//          tensor is registered once, as the embed's wte.weight.
// A GptStage prefixes each with the layer's global index: "0.wte.weight",
// "3.attn.c_attn.weight" (block 2), "13.ln_f.weight" (gpt2's head).
//
// Tensor parallelism (tensor_parallel.h): layers built with a TpGroup of
// t > 1 ranks hold their rank's shard of each parameter (same names, the
// shard's shape), initialised as the shard of the unsharded layer's, and
// compute with the group; without one (or t = 1) they are the model above.
//
// Thread-safety: like any torch::nn::Module, not safe for concurrent mutation.
// Failure: shape mismatches throw c10::Error (callers catch at their boundary).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ob/model.pb.h"
#include "ob/model/compute_copies.h"
#include "ob/model/config.h"
#include "ob/model/recompute.h"
#include "ob/model/tensor_parallel.h"

namespace ob::model {

// One planner layer. forward(input, targets): embed and blocks ignore targets;
// the head returns the mean loss, or the logits [b,t,V] if targets is undefined.
class PlannerLayerImpl : public torch::nn::Module {
 public:
  PlannerLayerImpl(pb::LayerKind kind, int index, std::string name)
      : kind_(kind), index_(index), name_(std::move(name)) {}
  virtual torch::Tensor forward(const torch::Tensor& input, const torch::Tensor& targets) = 0;

  // The layer as consecutive segments, forward = segment S-1 ∘ ... ∘ 0:
  // a parameter's gradient is final once the backward of its segment is
  // done, so the worker can hand a block's MLP gradients to the all-reduce
  // while its attention's backward still runs. One segment by default.
  virtual int num_segments() const { return 1; }
  virtual torch::Tensor forward_segment(int segment, const torch::Tensor& input, const torch::Tensor& targets) {
    (void)segment;
    return forward(input, targets);
  }
  // The segment of a parameter, by its name within the layer.
  virtual int segment_of(const std::string& parameter) const {
    (void)parameter;
    return 0;
  }

  // What the layer keeps for its backward (recompute.h); only blocks
  // recompute, the other layers keep everything whatever it is set to.
  virtual void set_recompute(Recompute r) { recompute_ = r; }
  Recompute recompute() const { return recompute_; }

  pb::LayerKind kind() const { return kind_; }
  int index() const { return index_; }          // global index
  const std::string& name() const { return name_; }  // "embed", "block.3", "head"

 private:
  pb::LayerKind kind_;
  int index_;
  std::string name_;
  Recompute recompute_ = Recompute::kNone;
};
using PlannerLayer = std::shared_ptr<PlannerLayerImpl>;

// A layer's tensor-parallel group: null for the unsharded model.
using TpGroupPtr = std::shared_ptr<TpGroup>;

// The parameters of a linear map, weight [out,in] and bias [out], and of a
// lookup table [rows,width], allocated but not initialised: the layers draw
// them from their own generators (or a restore copies them in), so
// torch::nn::Linear's and Embedding's own initialisation would be a full
// pass over every weight thrown away (1.5 s of gpt2-medium's 4 s build on
// 2 cores).
class DenseImpl : public torch::nn::Module {
 public:
  // Without `with_bias`, bias stays undefined (the Llama family's layers).
  DenseImpl(int64_t in, int64_t out, bool with_bias = true);
  torch::Tensor weight, bias;
};
TORCH_MODULE(Dense);
class TableImpl : public torch::nn::Module {
 public:
  TableImpl(int64_t rows, int64_t width);
  torch::Tensor weight;
};
TORCH_MODULE(Table);

// Token + position embedding. Layer constructors draw their parameters from
// `seed` when `init`, else leave them uninitialised for a caller that sets
// every one (a restore: drawing gpt2-medium's takes seconds).
class EmbedLayerImpl : public PlannerLayerImpl {
 public:
  EmbedLayerImpl(const GptConfig& cfg, uint64_t seed, TpGroupPtr tp = nullptr, bool init = true);
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& targets) override;
  torch::Tensor token_table() const { return wte->weight; }  // this rank's rows when sharded

  Table wte{nullptr}, wpe{nullptr};  // wpe: GPT-2 only (the Llama family rotates)

 private:
  int64_t vocab_;
  TpGroupPtr tp_;
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(int n_embd, int n_head, TpGroupPtr tp = nullptr);
  torch::Tensor forward(const torch::Tensor& x);

  int n_head;  // of the whole layer; a rank of t computes n_head / t
  TpGroupPtr tp;
  bool selective = false;  // the core recomputed in the backward: q, k, v kept
  Dense c_attn{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(int n_embd, TpGroupPtr tp = nullptr);
  torch::Tensor forward(const torch::Tensor& x);

  TpGroupPtr tp;
  bool selective = false;  // gelu's output recomputed in the backward from the pre-activation
  Dense c_fc{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(Mlp);

// Transformer block `block` (0-based; global index block + 1).
class BlockLayerImpl : public PlannerLayerImpl {
 public:
  BlockLayerImpl(const GptConfig& cfg, int block, uint64_t seed, TpGroupPtr tp = nullptr,
                 bool init = true);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& targets) override;
  // Segment 0: x + attn(ln_1(x)); segment 1: y + mlp(ln_2(y)).
  int num_segments() const override { return 2; }
  torch::Tensor forward_segment(int segment, const torch::Tensor& x, const torch::Tensor& targets) override;
  int segment_of(const std::string& parameter) const override;
  void set_recompute(Recompute r) override;

  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  Mlp mlp{nullptr};

 private:
  torch::Tensor Segment(int segment, const torch::Tensor& x);
};

// Final LayerNorm + tied LM head + loss. With `tied` defined (the embed's
// token table, same stage) the head uses that tensor and registers no
// lm_head.weight of its own; otherwise it owns a copy initialised like it.
// The LM head's own weight [V,h], a module so that it is named lm_head.weight.
class LmHeadImpl : public torch::nn::Module {
 public:
  LmHeadImpl(int vocab_size, int n_embd);
  torch::Tensor weight;
};
TORCH_MODULE(LmHead);

// x·wᵀ for a head weight w of V rows: [..., V]. With multiple > 1 and V not
// a multiple of it, the product runs over w padded with zero rows to the
// next multiple and the result is the first V columns (a view); the values
// and gradients are those of the plain product.
torch::Tensor LogitsOf(const torch::Tensor& x, const torch::Tensor& w, int64_t multiple);
// The same product before the narrowing: [..., P], P the padded vocabulary.
// Under autocast, w's compute copy (ComputeWeight).
torch::Tensor PaddedLogitsOf(const torch::Tensor& x, const torch::Tensor& w, int64_t multiple);
// The multiple the head pads its vocabulary to on `device` (64 on a GPU, 1).
int64_t HeadRowsMultiple(const torch::Device& device);

class HeadLayerImpl : public PlannerLayerImpl {
 public:
  HeadLayerImpl(const GptConfig& cfg, uint64_t seed, torch::Tensor tied = {}, TpGroupPtr tp = nullptr,
                bool init = true);
  // Sharded, the head needs the targets (no rank forms the whole logits).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& targets) override;
  // The LM weight [V,h] (this rank's rows when sharded): the stage's own
  // copy, or the tied embed table.
  torch::Tensor lm_weight() const { return lm_weight_; }
  bool tied() const { return tied_; }

  torch::nn::LayerNorm ln_f{nullptr};        // GPT-2
  std::shared_ptr<torch::nn::Module> rms_f;  // the Llama family's RMSNorm, named ln_f
  LmHead lm_head{nullptr};  // null when tied

 private:
  torch::Tensor Normed(const torch::Tensor& x);

  torch::Tensor lm_weight_;
  bool tied_ = false;
  int64_t vocab_;
  TpGroupPtr tp_;
};

// Builds planner layer `global_index` (0 .. cfg.num_layers()-1) alone.
// REQUIRES: cfg.Validate().ok(), 0 <= global_index < cfg.num_layers(), and
// CheckTensorParallel(cfg, tp->size).ok() with a group.
PlannerLayer MakeLayer(const GptConfig& cfg, int global_index, uint64_t seed, TpGroupPtr tp = nullptr,
                       bool init = true);

// The layers [first, last] (global indices, inclusive) a pipeline stage owns,
// run in order; or, for a stage of several chunks (interleaved, zb-v:
// design/schedule.md), several such ranges, each a chunk run on its own.
// When it holds both embed and head they share one LM tensor. Submodules
// are registered under their global index ("0", "1", ...), so
// named_parameters() yields "<global index>.<layer parameter name>".
class GptStageImpl : public torch::nn::Module {
 public:
  // REQUIRES: 0 <= first <= last < cfg.num_layers(); with `tp`,
  // CheckTensorParallel(cfg, tp->size).ok(). Every layer shares `tp`.
  // `init` false: parameters uninitialised (see EmbedLayerImpl).
  GptStageImpl(const GptConfig& cfg, int first, int last, uint64_t seed, TpGroupPtr tp = nullptr,
               bool init = true);
  // Chunks: `ranges` [first, last] in chunk order, none overlapping.
  GptStageImpl(const GptConfig& cfg, const std::vector<std::pair<int, int>>& ranges, uint64_t seed,
               TpGroupPtr tp = nullptr, bool init = true);

  // input: ids [b,t] if the stage holds the embed, else activations [b,t,h].
  // Returns activations [b,t,h], or the scalar loss if it holds the head
  // (logits [b,t,V] if targets is undefined). Runs every layer in order:
  // REQUIRES one chunk.
  torch::Tensor forward(const torch::Tensor& input, const torch::Tensor& targets = {});
  // The same through chunk c's layers alone.
  torch::Tensor forward_chunk(int c, const torch::Tensor& input, const torch::Tensor& targets = {});

  // The first and last layer it holds (with chunks, layers between may be
  // others').
  int first() const { return first_; }
  int last() const { return last_; }
  const std::vector<std::pair<int, int>>& ranges() const { return ranges_; }
  int chunks() const { return static_cast<int>(ranges_.size()); }
  // Its layers in chunk order, and chunk c's.
  const std::vector<PlannerLayer>& layers() const { return layers_; }
  std::vector<PlannerLayer> chunk_layers(int c) const;
  bool holds(int global_index) const {
    return global_index >= 0 && global_index < static_cast<int>(position_.size()) && position_[global_index] >= 0;
  }
  // REQUIRES: holds(global_index).
  const PlannerLayer& layer(int global_index) const { return layers_[position_[global_index]]; }
  // The chunk holding it. REQUIRES: holds(global_index).
  int chunk_of(int global_index) const;
  bool has_embed() const { return holds(0); }
  bool has_head() const { return holds(cfg_.num_layers() - 1); }
  // The LM weights whose gradients a pipeline sums between first and last
  // stage (design/model.md): the embed's wte.weight and/or the head's
  // lm_head.weight; none for a model whose head is untied (Llama's own
  // lm_head is a parameter of the head like any other).
  std::vector<torch::Tensor> tied_weights() const;
  const GptConfig& config() const { return cfg_; }
  // The stage's TP group (null when unsharded), as the layers see it.
  const TpGroupPtr& tp() const { return tp_; }
  // Compute-dtype copies of its parameters (compute_copies.h), the head's
  // table padded as the head pads it on the parameters' device.
  std::unique_ptr<ComputeCopies> MakeComputeCopies(at::ScalarType dtype) const;

 private:
  GptConfig cfg_;
  int first_ = 0, last_ = -1;
  TpGroupPtr tp_;
  std::vector<std::pair<int, int>> ranges_;
  std::vector<PlannerLayer> layers_;
  std::vector<int> position_;  // global index → index in layers_, -1 where not held
};
TORCH_MODULE(GptStage);

// Compute-dtype copies (compute_copies.h) of the parameters of `layers`
// (a tied table once), a head's table padded as the head pads it on the
// parameters' device.
std::unique_ptr<ComputeCopies> MakeComputeCopies(const std::vector<PlannerLayer>& layers, at::ScalarType dtype);

// Parameters counted once per distinct storage (tied weights count once).
int64_t CountUniqueParameters(const torch::nn::Module& module);

}  // namespace ob::model
