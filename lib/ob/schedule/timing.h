// A schedule's iteration for given op costs (design/schedule.md, Time): each
// stage runs its order, each op as soon as the stage is free and its input
// has arrived. A forward waits for the previous stage's forward of the
// same micro-batch plus the transfer; a backward (or B) for the next
// stage's plus the transfer back, and, on the last stage, for its own
// forward; a W for its own B. Transfers overlap compute. What the planner
// predicts, ob-plan --schedule-svg draws and tests compare orders by.
// Torch-free, pure.
#pragma once

#include <vector>

#include "ob/schedule/schedule.h"

namespace ob::schedule {

// One stage's op times, in seconds: a micro-batch's forward, its input
// gradient (B), its weight gradients (W; a kBackward takes B + W), and
// the one-way transfer to the next stage of its activation and back of the
// gradient (0 on the last stage).
struct StageCosts {
  double forward = 0, input_grad = 0, weight_grad = 0;
  double send = 0, send_back = 0;
  // How long an op of type t takes on this stage.
  double Seconds(Op::Type t) const {
    switch (t) {
      case Op::kForward: return forward;
      case Op::kInputGrad: return input_grad;
      case Op::kWeightGrad: return weight_grad;
      case Op::kBackward: break;
    }
    return input_grad + weight_grad;
  }
};

struct TimedOp {
  int stage = 0;
  Op op;
  double start = 0, end = 0;  // seconds from the start of the iteration
};

// Every op of every stage, stage by stage, each stage's in its order.
// Empty when microbatches <= 0 or costs is empty.
std::vector<TimedOp> Simulate(const Schedule& s, const std::vector<StageCosts>& costs, int microbatches);
// The latest end of Simulate's ops (0 when there are none).
double Makespan(const std::vector<TimedOp>& ops);
// Makespan(Simulate(s, costs, m)) without keeping the ops.
double Makespan(const Schedule& s, const std::vector<StageCosts>& costs, int microbatches);

}  // namespace ob::schedule
