// A schedule's iteration for given op costs (design/schedule.md, Time): each
// stage runs its order, each op as soon as the stage is free and its input
// has arrived. A forward waits for the previous (virtual) stage's forward
// of the same micro-batch plus the transfer; a backward (or B) for the
// next one's plus the transfer back, and, on the last, for its own
// forward; a W for its own B. A transfer between chunks of one stage is
// free. Transfers overlap compute. What the planner
// predicts, ob-plan --schedule-svg draws and tests compare orders by.
// Torch-free, pure.
#pragma once

#include <vector>

#include "ob/schedule/schedule.h"

namespace ob::schedule {

struct TimedOp {
  int stage = 0;
  Op op;
  double start = 0, end = 0;  // seconds from the start of the iteration
};

// Every op of every stage, stage by stage, each stage's in its order (s's
// orders made for `costs`, one per virtual stage: stages × chunks).
// Empty when microbatches <= 0 or costs is empty.
std::vector<TimedOp> Simulate(const Schedule& s, const std::vector<StageCosts>& costs, int microbatches,
                              int chunks = 1);
// The same for given orders (one per stage; costs one per virtual stage,
// a multiple of orders.size(), the chunks laid out by `placement`): a
// pipeline runs the orders made for its template's nominal costs, timed
// here with its own links'.
std::vector<TimedOp> Simulate(const PipelineOrders& orders, const std::vector<StageCosts>& costs, int microbatches,
                              Placement placement = Placement::kLoop);
// The latest end of Simulate's ops (0 when there are none).
double Makespan(const std::vector<TimedOp>& ops);
// Makespan(Simulate(s, costs, m)) without keeping the ops; and for given
// orders.
double Makespan(const Schedule& s, const std::vector<StageCosts>& costs, int microbatches, int chunks = 1);
double Makespan(const PipelineOrders& orders, const std::vector<StageCosts>& costs, int microbatches,
                Placement placement = Placement::kLoop);

}  // namespace ob::schedule
