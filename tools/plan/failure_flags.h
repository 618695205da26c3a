// ob-plan's -f auto flags (the failure model of plan/reliability.h), kept
// apart from the planner's own.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "ob/plan/reliability.h"
#include "ob/status.h"

namespace ob::plan_tool {

struct FailureFlags {
  std::string node_mtbf, repair_time = "1h", horizon = "30d", recovery_time = "5s", restart_time = "10m",
                         checkpoint_cost = "5s", standby_master = "on", takeover_time = "3s";
};

void AddFailureFlags(CLI::App& app, FailureFlags* f);
// The model they describe; kUsage naming the flag that is not a duration
// (ChooseFaults checks the values).
Result<plan::FailureModel> FailureModelOf(const FailureFlags& f);

}  // namespace ob::plan_tool
