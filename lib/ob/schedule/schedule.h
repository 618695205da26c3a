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
  // Optional: every stage's order at once, shared (a schedule that derives
  // its orders for the whole pipeline at once keeps them; see Orders).
  std::shared_ptr<const std::vector<std::vector<Op>>> (*orders)(int stages, int microbatches) = nullptr;
};

// Every stage's order of a pipeline of `stages` under `s` (orders[i] is
// stage i's); shared, so that readers timing many templates copy nothing.
std::shared_ptr<const std::vector<std::vector<Op>>> Orders(const Schedule& s, int stages, int microbatches);

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
// Peaks of each stage of a pipeline of `stages` under `s` at m micro-batches
// (cached: the planner asks for the same shapes again and again).
const std::vector<std::vector<Held>>& PipelinePeaks(const Schedule& s, int stages, int microbatches);
// The largest a·activation_bytes + w·weight_input_bytes over `peaks`.
uint64_t PeakBytes(const std::vector<Held>& peaks, uint64_t activation_bytes, uint64_t weight_input_bytes);

// "F3", "B3", "W3", "BW3" (kBackward): for diagnostics and tests.
std::string Describe(const Op& op);
std::string Describe(const std::vector<Op>& order);

}  // namespace ob::schedule
