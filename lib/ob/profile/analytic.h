// Analytic layer costs from FLOPs and bytes (design/formulas.md), for hardware we do not
// have. Torch-free and pure: the same inputs always give the same Profile.
//
// Conventions, per planner layer and per micro-batch of b sequences of s
// tokens (h hidden, a heads, V vocabulary, L blocks, e bytes per element of
// the training dtype):
//   block  params 12h²+13h; training FLOPs per token 6·(12h²+13h) + 12·h·s
//          (the 6N rule plus attention), one third forward, two thirds backward;
//          activations kept s·b·h·(34 + 5·a·s/h)·e/2 (the 5as/h term dropped
//          with fused attention); output s·b·h·e.
//   embed  params V·h + s·h; table lookups, no FLOPs: time is the bytes moved
//          (gather forward, scatter-add backward) at HBM bandwidth; keeps the
//          token ids (8 bytes each) for backward.
//   head   params 2h (final LayerNorm) + the tied V·h weight it holds a copy of;
//          FLOPs per token 6·(V·h + 2h); keeps its LayerNorm input and the fp32
//          logits s·b·V·4; outputs the loss.
// Summed, the FLOPs equal 6·N + 12·L·h·s of design/formulas.md less the 6·s·h of the
// position table, which is a lookup. Model state is what ob-launch keeps:
// under bf16 18 bytes per parameter, 4 + 2 weights (the fp32 master and its
// bf16 compute copy), 4 gradients (summed and all-reduced in fp32, as
// Megatron-LM accumulates them for bf16), 8 for the two Adam moments; under
// fp32 4 + 4 + 8. (design/formulas.md for mixed precision assumes bf16
// gradients, which ob does not keep.) A layer's time is max(FLOPs / (peak·efficiency),
// bytes / HBM bandwidth), the peak being the dtype's: bf16's tensor-core
// peak, or under fp32 the CUDA cores' fp32 peak (ob does not enable TF32).
// Gradient all-reduce over a group of d GPUs is a
// ring: 2(d−1)/d · bytes / bus bandwidth + 2(d−1) · 5 µs.
#pragma once

#include <cstdint>
#include <vector>

#include "ob/model/config.h"
#include "ob/profile.pb.h"
#include "ob/profile/gpus.h"

namespace ob::profile {

struct AnalyticOptions {
  GpuSpec gpu;                       // peak, memory, bandwidths, efficiency
  std::vector<int> microbatches{1};  // sequences per micro-batch
  int seq_len = 0;                   // 0: the model's context length
  bool fused_attention = false;      // drop the 5as/h activation term
  bool fp32 = false;                 // fp32 training instead of bf16 mixed precision
  int max_group = 0;                 // all-reduce group sizes up to this; 0: gpus_per_node
};

// Per-token training FLOPs of one planner layer (forward + backward), as
// PaLM (Chowdhery et al. 2022, appendix B) counts them: 6 per parameter of
// its products and 12·(a·d)·s for the attention's two products over a
// sequence of s, masked or not; a whole model's 6N + 12·L·(a·d)·s, N its
// parameters less the embedding (the tied head's matrix counted once, at
// the head). What ob's MFU divides by (metrics field `mfu`).
double TrainingFlopsPerToken(const model::GptConfig& c, pb::LayerKind kind, int seq_len);
// The same as llm.c counts them: 6 per parameter, every one (the embedding
// and the position table too, the tied matrix once, at the embedding), and
// 6·(a·d)·s for the attention, half of PaLM's since the causal mask skips
// half of the products; a whole model's 6N + 6·L·(a·d)·s, N every
// parameter. The metrics' `mfu_llmc`, comparable with llm.c's figures:
// lower than `mfu` where the attention weighs (at s = 1024, 6.0% lower for
// gpt2-medium, 5.3% for gpt2-large).
double LlmcFlopsPerToken(const model::GptConfig& c, pb::LayerKind kind, int seq_len);
// Activation bytes one layer keeps from forward to backward, per micro-batch.
uint64_t ActivationBytes(const model::GptConfig& c, pb::LayerKind kind, int b, int s,
                         int elem_bytes, bool fused_attention);
// Time of a ring all-reduce of `bytes` over `group` devices at `bus_gbps`.
double RingAllReduceSeconds(uint64_t bytes, int group, double bus_gbps);

// The whole analytic profile. kConfig when the options are unusable
// (non-positive peak, memory, efficiency outside (0, 1], micro-batch < 1).
Result<pb::Profile> AnalyticProfile(const model::GptConfig& c, const AnalyticOptions& opts);

}  // namespace ob::profile
