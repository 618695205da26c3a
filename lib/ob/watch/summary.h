// The terminal summary of ob-watch (stdout is a terminal): one row per rank
// of the newest generation — host, rank, pipeline, stage, last step, step
// and compute time, tokens/s, loss, memory, seconds since heard, state —
// event counts by kind and the most recent events. Comment lines start
// with '#', as in every ob table. Pure function of the state.
#pragma once

#include <string>

#include "ob/watch/state.h"

namespace ob::watch {

std::string SummaryTable(const RunState& run, const DetectorOptions& o, const std::string& source,
                         size_t recent_events);

}  // namespace ob::watch
