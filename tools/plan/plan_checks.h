// ob-plan's checks and choices outside the planner proper: --host-memory
// and --shard-optimizer.
#pragma once

#include <string>

#include "ob/plan/problem.h"
#include "ob/plan/templates.h"
#include "ob/profile.pb.h"
#include "ob/status.h"

namespace ob::plan_tool {

// --host-memory GIB: every template's nodes hold their stages' snapshots
// (kSnapshotBytesPerParameter a parameter); the first node that would not
// is named (kConfig).
Status CheckHostMemory(const pb::Profile& profile, const plan::TemplateSet& ts, double host_memory_gib);

// --shard-optimizer MODE: the S of p's optimizer state (design/shard.md),
// from n0 alone: the same for every f and node count of one profile and
// set of flags. kUsage for a MODE that is not off, on, auto or a count
// from 1 to 64.
Result<int> ChooseShards(plan::Problem p, const std::string& mode);

}  // namespace ob::plan_tool
