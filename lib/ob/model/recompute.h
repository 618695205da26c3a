// Activation recomputation (issue 56; design/model.md): a block keeps less of its
// forward for the backward and computes the rest again there.
//
//   kNone       autograd keeps what each operation saves.
//   kSelective  the attention core and the MLP's activation are recomputed:
//               a block keeps the inputs of the attention core (GPT-2: q, k,
//               v; Llama: q, k, v before the rotation and the key/value
//               repeat) and the MLP activation's input (GPT-2: the
//               pre-activation, the activation itself recomputed by the MLP's
//               backward; Llama: gate and up, silu(gate) recomputed), and
//               every product's input as before; the attention's scores and
//               probabilities (on the CPU: [b, heads, t, t] each), the
//               rotated q and k and the activation's output are not kept.
//   kFull       a block keeps its input only and runs its forward again in
//               its backward (a segment's input, for a block run segment by
//               segment: the last micro-batch of an overlapped step).
//
// Checkpointed() is the mechanism: autograd keeps its inputs and nothing of
// `fn`; its backward runs `fn` again on them with the forward's random state
// (the default generator of the CPU and, on a GPU, of its device), bf16
// autocast on or off as it was, and the same weights' compute copies
// (compute_copies.h), then back-propagates through that. The first forward
// runs `fn` with gradients on and throws its graph away, so both forwards
// take exactly the same paths (fused functions, autocast's cache): the
// outputs are the same bits, and so are the gradients (fp32 and bf16 alike).
// The recomputed forward issues its tensor-parallel collectives again, in
// the backward's order, which every rank of a stage shares.
//
// Memory: one block's (or segment's) full activations exist while it runs,
// forward and again in its backward, on top of what the stage keeps.
// Thread-safety: as autograd's.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ob/model/recompute_mode.h"

namespace ob::model {

using TensorsFn = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;

// fn(inputs), keeping only `inputs` for the backward (see above). Undefined
// inputs are passed through as undefined. Outputs are fn's, each with the
// gradient of fn's through the inputs and the parameters fn reads.
std::vector<torch::Tensor> Checkpointed(const TensorsFn& fn, const std::vector<torch::Tensor>& inputs);
// The one-input, one-output case.
torch::Tensor Checkpointed(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& x);

// How many recomputations this process's backwards have run (tests and
// logs see that a mode took effect).
int64_t RecomputeCount();

}  // namespace ob::model
