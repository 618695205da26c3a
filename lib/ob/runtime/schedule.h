// The order in which one pipeline stage runs its forward and backward passes
// during an iteration under 1F1B (PipeDream-Flush, as Megatron-LM runs it).
// Torch-free, pure.
//
// Stage i of S with m micro-batches runs min(S − i − 1, m) warm-up forwards,
// then alternates one forward and one backward until every forward has run,
// then drains the remaining backwards. Forwards and backwards each go in
// micro-batch order; stage i never holds more than min(S − i, m) micro-batches
// whose forward ran and whose backward has not (the memory bound the planner
// assumes, SPEC §4.1). Run on every stage of a pipeline with blocking receives
// and non-blocking sends, the orders cannot deadlock.
//
// ob::plan::Simulate1F1B times the same order; this is what workers execute.
#pragma once

#include <vector>

namespace ob::runtime {

struct PipelineOp {
  bool forward = true;  // false: backward
  int microbatch = 0;   // 0-based, local to the pipeline
};

// The 2·m ops of `stage` in execution order; empty when m <= 0.
// REQUIRES: 0 <= stage < num_stages.
std::vector<PipelineOp> OneFOneB(int stage, int num_stages, int microbatches);

}  // namespace ob::runtime
