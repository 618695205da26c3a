// How every process names the weights a generation starts from (control.proto's
// WeightSource) in its logs: the master in events.log, a worker in its
// refusal, in one form so that the two can be matched.
#pragma once

#include <string>

#include "ob/control.pb.h"

namespace ob::launch {

// "initial", "checkpoint:PATH" or "snapshots", then " step=S lineage=L":
// the form events.log and the workers' refusals use.
std::string DescribeSource(const pb::WeightSource& s);

}  // namespace ob::launch
