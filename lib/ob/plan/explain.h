// ob-plan --explain: a Plan as human tables in the nccl-tests manner
// ('#' comments, a units row, fixed-width rows, a summary footer). Works from
// the Plan alone. Torch-free, pure.
#pragma once

#include <string>
#include <vector>

#include "ob/metrics.pb.h"
#include "ob/plan.pb.h"
#include "ob/status.h"

namespace ob::plan {

std::string ExplainPlan(const pb::Plan& plan);
// ExplainPlan's lines on the standby master's costs.
std::string ExplainStandby(const pb::Plan& plan);

// ob-plan --explain --measured METRICS: the plan's predictions beside what
// a run of it measured (ob-launch --metrics records), from the records of
// the run's first generation (the plan's own instantiation; later ones are
// re-instantiations) after its first kMeasuredWarmupSteps steps, medians
// over the steps: the iteration (rank 0's step time), and per stage in
// use, its compute a step (Stage.compute_seconds × the pipeline's
// micro-batches against the slowest of its ranks' forward + backward) and
// its memory (as the predicted peak line counts it, against the largest
// peak of its ranks: RSS on the CPU, the allocator's peak on a GPU).
// kDataErr naming `name` when no such step is there.
constexpr uint64_t kMeasuredWarmupSteps = 5;
Result<std::string> CompareMeasured(const pb::Plan& plan, const std::vector<pb::Metrics>& records,
                                    const std::string& name);

}  // namespace ob::plan
