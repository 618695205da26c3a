// Between the planner's structures and the Plan protobuf (ob-formats(5)).
// A Plan carries its profile and cluster model, so LoadPlan gives back the
// Problem, the stored templates (not recomputed) and the instantiation: what
// the master needs to re-instantiate after failures in milliseconds.
// Torch-free, pure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ob/plan.pb.h"
#include "ob/plan/instantiation.h"
#include "ob/plan/placement.h"
#include "ob/plan/problem.h"
#include "ob/plan/templates.h"
#include "ob/profile.pb.h"
#include "ob/status.h"

namespace ob::plan {

// What the plan records besides the planner's results.
struct PlanMeta {
  std::vector<std::string> hosts;     // node id -> name; empty: "node0", "node1", ...
  int global_batch = 0;               // sequences
  uint64_t seed = 0;
  const pb::Profile* profile = nullptr;        // stored in the plan
  const pb::NetworkMatrix* bandwidth = nullptr;  // when placement used one
  double placed_seconds = 0, identity_seconds = 0;  // from placement, when a matrix was given
};

pb::Plan ToProto(const Problem& p, const TemplateSet& ts, const Instantiation& inst,
                 const PlanMeta& meta);

// Replaces `plan`'s instantiation with `inst` (a re-instantiation of its
// templates): pipelines with node ids and host names, predicted times.
void SetInstantiation(const Problem& p, const TemplateSet& ts, const Instantiation& inst,
                      pb::Plan* plan);

struct LoadedPlan {
  Problem problem;
  TemplateSet templates;
  Instantiation instantiation;
  std::vector<std::string> hosts;
};

// Rebuilds the planner's view of a plan. kDataErr naming what is
// inconsistent (templates not consecutive, a pipeline naming a missing
// template or node, stage layers not covering the model, ...).
Result<LoadedPlan> FromProto(const pb::Plan& plan);

// "xxh3:<16 hex digits>" of the profile's serialised bytes.
std::string ProfileDigest(const pb::Profile& profile);

// Stage idle time over all stage time, under the cost model: 1 − the
// stages' computing seconds (TimePipelines(...).busy) over stages × iteration.
double BubbleFraction(const TemplateSet& ts, const Instantiation& inst, const PipelineTimes& times);

}  // namespace ob::plan
