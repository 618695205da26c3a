// ob-plan --explain: a Plan as human tables in the nccl-tests manner
// ('#' comments, a units row, fixed-width rows, a summary footer). Works from
// the Plan alone. Torch-free, pure.
#pragma once

#include <string>

#include "ob/plan.pb.h"

namespace ob::plan {

std::string ExplainPlan(const pb::Plan& plan);

}  // namespace ob::plan
