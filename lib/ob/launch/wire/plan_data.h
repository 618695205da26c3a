// The plan as every process of a run reads it (design: launch): the
// master before any worker starts, each worker when it starts, the same
// way, so that they agree. Torch-free, so that ob-launch itself, the master
// and the agents, does not load LibTorch (only ob-launch-worker does).
#pragma once

#include <string>

#include "ob/model/config.h"
#include "ob/plan.pb.h"
#include "ob/plan/plan_io.h"
#include "ob/status.h"

namespace ob::launch {

// A plan file as the master checks it: the message, its loaded form and its
// model (validated), read once (a plan piped in, "-" or a FIFO, can be read
// only once, and a file replaced between two reads would be checked as one
// plan and run as another). Errors name the file.
struct PlanData {
  std::string name;  // the file, as messages name it (io::DisplayName)
  pb::Plan plan;
  plan::LoadedPlan loaded;
  model::GptConfig cfg;
};
Result<PlanData> LoadPlanData(const std::string& path);
// The same of a plan already read (a standby master's, from its master);
// `name` for messages.
Result<PlanData> PlanDataOf(pb::Plan plan, const std::string& name);

// The tokens a sample holds: the plan's sequence length, or the model's
// positions when the plan leaves it unset.
int SequenceLength(const pb::Plan& plan, const model::GptConfig& cfg);

// The plan was profiled for one precision (Profile.dtype, "float32" or
// "bfloat16"); a run in another is refused: kConfig naming the plan file
// and both (kConfig, exit 78). `precision` as ob-launch --precision takes it.
Status CheckPrecisionForPlan(const PlanData& plan, const std::string& precision);

}  // namespace ob::launch
