// 1F1B op order for one stage (see schedule.h).
#include "ob/runtime/schedule.h"

#include <algorithm>
#include <cassert>

namespace ob::runtime {

std::vector<PipelineOp> OneFOneB(int stage, int num_stages, int microbatches) {
  assert(0 <= stage && stage < num_stages);
  std::vector<PipelineOp> ops;
  if (microbatches <= 0) return ops;
  ops.reserve(2 * static_cast<size_t>(microbatches));
  const int warmup = std::min(num_stages - stage - 1, microbatches);
  int next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward) ops.push_back({true, next_forward});
  while (next_forward < microbatches) {
    ops.push_back({true, next_forward++});
    ops.push_back({false, next_backward++});
  }
  while (next_backward < microbatches) ops.push_back({false, next_backward++});
  return ops;
}

}  // namespace ob::runtime
