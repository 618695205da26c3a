// Pipeline schedules (design/schedule.md): the order in which each stage of
// one pipeline runs its forwards and backwards during an iteration. A
// schedule is one file that states that order (one_f_one_b.cc, zb_h1.cc,
// zb_h2.cc) and one line in the registry (registry.cc). Everything else
// follows from the order and is shared: the messages a stage exchanges
// (program.h), its time for given op costs (timing.h), and how many
// micro-batches it holds at once (Peaks, below). The planner, the simulator
// and the workers all read this room, so they agree on what a schedule does.
//
// Ops. A forward (F) keeps its activations for the backward. 1F1B runs the
// whole backward at once (kBackward). The zero-bubble schedules (Qi et al.,
// ICLR 2024) split it: the input gradient first (kInputGrad, "B", which the
// previous stage waits for), the weight gradients later (kWeightGrad, "W",
// which only the optimizer needs); W fills the time a stage would otherwise
// wait. Between its B and its W a micro-batch keeps only what W reads (the
// dense layers' inputs and their output gradients).
//
// Torch-free, pure. Thread-safe: orders derived by simulation are cached
// behind a lock.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ob::schedule {

struct Op {
  enum Type : uint8_t {
    kForward,
    kBackward,    // input and weight gradients together
    kInputGrad,   // B: the input gradient, sent upstream at once
    kWeightGrad,  // W: the weight gradients of a micro-batch whose B ran
  };
  Type type = kForward;
  int microbatch = 0;  // 0-based, local to the pipeline
  bool operator==(const Op& o) const { return type == o.type && microbatch == o.microbatch; }
};

// One stage's op times (seconds, or any one unit): a micro-batch's
// forward, its input gradient (B), its weight gradients (W; a kBackward
// takes B + W), and the one-way transfer to the next stage of its
// activation and back of the gradient (0 on the last stage). What a
// schedule derived by simulation orders for (Schedule::orders), and what
// timing.h times an order with.
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
  bool operator==(const StageCosts& o) const {
    return forward == o.forward && input_grad == o.input_grad && weight_grad == o.weight_grad &&
           send == o.send && send_back == o.send_back;
  }
};

// F = B = W = 1, transfers free, on each of `stages` stages: the costs the
// zero-bubble paper's hand-made schedules assume.
std::vector<StageCosts> UnitCosts(int stages);

using PipelineOrders = std::vector<std::vector<Op>>;

struct Schedule {
  std::string_view name;     // as ob-plan --schedule and the plan spell it: "1f1b"
  std::string_view summary;  // one line: what it does and what it costs
  bool splits_backward = false;
  // The ops of `stage` of `stages` for `microbatches` micro-batches, in
  // execution order: every micro-batch's F, then its backward (kBackward,
  // or kInputGrad and later kWeightGrad), forwards and backwards each in
  // micro-batch order. Empty when microbatches <= 0.
  // REQUIRES: 0 <= stage < stages.
  std::vector<Op> (*order)(int stage, int stages, int microbatches) = nullptr;
  // Optional: every stage's order at once, made for the stages' op costs
  // (costs.size() stages), shared. A schedule that places each op where it
  // fits best (zb-h1, zb-h2) orders by the pipeline's own costs: with W
  // cheaper than F, say, unit-cost orders leave a stage idle where
  // another order would not. Deterministic in the costs, so that the
  // planner and every worker of a pipeline, reading the same plan, run
  // one order.
  std::shared_ptr<const PipelineOrders> (*orders)(const std::vector<StageCosts>& costs, int microbatches) = nullptr;
};

// Every stage's order of a pipeline under `s` (orders[i] is stage i's),
// made for `costs` (one per stage); shared, so that readers timing many
// templates copy nothing. The first form at UnitCosts(stages).
std::shared_ptr<const PipelineOrders> Orders(const Schedule& s, int stages, int microbatches);
std::shared_ptr<const PipelineOrders> Orders(const Schedule& s, const std::vector<StageCosts>& costs,
                                             int microbatches);

// Every schedule, 1F1B first (the default, and what plans made before
// schedules run).
const std::vector<const Schedule*>& All();
// The schedule named `name`; "" is 1F1B. nullptr for an unknown name.
const Schedule* Find(std::string_view name);
const Schedule& OneFOneB();
// "1f1b, zb-h1, zb-h2": for help texts and errors.
std::string Names();

// What a stage holds at one moment: micro-batches whose forward ran and
// whose backward (or B) has not (their whole activations), and those whose
// B ran and whose W has not (what W reads).
struct Held {
  int activations = 0;
  int weight_inputs = 0;
};
// The most a stage holds at once over `order`: the points (a, w) that no
// other moment's dominates, ascending in a. 1F1B's is one point (a, 0).
std::vector<Held> Peaks(const std::vector<Op>& order);
// Peaks of each stage of a pipeline under `s` at m micro-batches, in the
// orders made for `costs`.
std::vector<std::vector<Held>> PipelinePeaks(const Schedule& s, const std::vector<StageCosts>& costs,
                                             int microbatches);
// The largest a·activation_bytes + w·weight_input_bytes over `peaks`.
uint64_t PeakBytes(const std::vector<Held>& peaks, uint64_t activation_bytes, uint64_t weight_input_bytes);

// "F3", "B3", "W3", "BW3" (kBackward): for diagnostics and tests.
std::string Describe(const Op& op);
std::string Describe(const std::vector<Op>& order);

}  // namespace ob::schedule
