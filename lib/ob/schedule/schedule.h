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
// Chunks. Interleaved 1F1B (Narayanan et al., SC'21) and ZB-V (Qi et al.)
// give each stage v > 1 model chunks: a pipeline of S stages is then a
// chain of V = S·v virtual stages, each a consecutive slice of the model,
// laid on the stages by the schedule's Placement (Chain). An op names its
// chunk; a stage runs its chunks' ops in one order; a transfer between two
// virtual stages on one stage is free (it never leaves the rank). With
// v = 1 the chain is the pipeline and every chunk is 0.
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
  uint8_t chunk = 0;   // which of the stage's chunks (0 with one; fewer than 256)
  int microbatch = 0;  // 0-based, local to the pipeline
  // Eight bytes: the planner keeps millions of ops.
  constexpr Op() = default;
  constexpr Op(Type t, int mb, int c = 0) : type(t), chunk(static_cast<uint8_t>(c)), microbatch(mb) {}
  bool operator==(const Op& o) const {
    return type == o.type && microbatch == o.microbatch && chunk == o.chunk;
  }
};

// How the virtual stages of a chain lie on the stages. kLoop (interleaved
// 1F1B): virtual stage k on stage k mod S, chunk k / S, so the chain loops
// through the pipeline v times. kVee (ZB-V, v = 2): chunk 0 down the
// stages, chunk 1 back up (virtual stage S + s on stage S − 1 − s): stage 0
// holds the first and the last slice of the model (the embedding and the
// head, and so the tied weight), and the turn at the last stage is free.
enum class Placement : uint8_t { kLoop, kVee };

// A pipeline of `stages` stages with `chunks` chunks each.
struct Chain {
  int stages = 1;
  int chunks = 1;
  Placement placement = Placement::kLoop;
  int size() const { return stages * chunks; }  // V, the virtual stages
  // Virtual stage k's stage and chunk, and the virtual stage of a stage's
  // chunk. REQUIRES: 0 <= k < size(); 0 <= stage < stages, 0 <= chunk < chunks.
  int StageOf(int k) const {
    const int c = k / stages, s = k % stages;
    return placement == Placement::kVee && c % 2 == 1 ? stages - 1 - s : s;
  }
  int ChunkOf(int k) const { return k / stages; }
  int At(int stage, int chunk) const {
    return chunk * stages + (placement == Placement::kVee && chunk % 2 == 1 ? stages - 1 - stage : stage);
  }
  // Whether the boundary between virtual stages k and k + 1 stays on one
  // stage (no message: the tensor is handed over in memory).
  bool Local(int k) const { return StageOf(k) == StageOf(k + 1); }
};

// One (virtual) stage's op times (seconds, or any one unit): a
// micro-batch's forward, its input gradient (B), its weight gradients (W;
// a kBackward takes B + W), and the one-way transfer to the next virtual
// stage of its activation and back of the gradient (0 on the last, and
// taken as 0 where the next is on the same stage, Chain::Local). What a
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

// F = B = W = 1, transfers free, on each of `stages` (virtual) stages: the
// costs the zero-bubble paper's hand-made schedules assume. With chunks,
// UnitCosts(S·v) makes each chunk cost a whole op.
std::vector<StageCosts> UnitCosts(int stages);

using PipelineOrders = std::vector<std::vector<Op>>;

struct Schedule {
  std::string_view name;     // as ob-plan --schedule and the plan spell it: "1f1b"
  std::string_view summary;  // one line: what it does and what it costs
  bool splits_backward = false;
  // The ops of `stage` of `chain` for `microbatches` micro-batches, in
  // execution order: for every chunk, every micro-batch's F, then its
  // backward (kBackward, or kInputGrad and later kWeightGrad), forwards
  // and backwards of a chunk each in micro-batch order. Empty when
  // microbatches <= 0. REQUIRES: 0 <= stage < chain.stages; chain.chunks
  // within [min_chunks, max_chunks], chain.placement == placement.
  std::vector<Op> (*order)(const Chain& chain, int stage, int microbatches) = nullptr;
  // Optional: every stage's order at once, made for the virtual stages' op
  // costs (costs.size() == chain.size()), shared. A schedule that places
  // each op where it fits best (zb-h1, zb-h2, zb-v) orders by the
  // pipeline's own costs: with W cheaper than F, say, unit-cost orders
  // leave a stage idle where another order would not. Deterministic in
  // the costs, so that the planner and every worker of a pipeline, reading
  // the same plan, run one order.
  std::shared_ptr<const PipelineOrders> (*orders)(const Chain& chain, const std::vector<StageCosts>& costs,
                                                  int microbatches) = nullptr;
  // Chunks a stage: 1 for the single-chunk schedules; the planner picks v
  // in [min_chunks, max_chunks] and lays them out by `placement`.
  int min_chunks = 1, max_chunks = 1;
  Placement placement = Placement::kLoop;
  bool chunked() const { return max_chunks > 1; }
  Chain ChainOf(int stages, int chunks = 1) const { return {stages, chunks, placement}; }
};

// Stage `stage`'s order under `s` at unit costs, with `chunks` chunks a
// stage.
std::vector<Op> Order(const Schedule& s, int stage, int stages, int microbatches, int chunks = 1);
// Every stage's order of a pipeline under `s` (orders[i] is stage i's),
// made for `costs` (one per virtual stage: stages × chunks of them);
// shared, so that readers timing many templates copy nothing. The first
// form at UnitCosts.
std::shared_ptr<const PipelineOrders> Orders(const Schedule& s, int stages, int microbatches, int chunks = 1);
std::shared_ptr<const PipelineOrders> Orders(const Schedule& s, const std::vector<StageCosts>& costs,
                                             int microbatches, int chunks = 1);

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
// B ran and whose W has not (what W reads). With chunks, counted in
// chunk-micro-batches (PeakBytes below weighs each chunk by its own size).
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
                                             int microbatches, int chunks = 1);
// The largest a·activation_bytes + w·weight_input_bytes over `peaks`.
uint64_t PeakBytes(const std::vector<Held>& peaks, uint64_t activation_bytes, uint64_t weight_input_bytes);
// The most `order` holds at once when a micro-batch of chunk c holds
// activation_bytes[c] before its B and weight_input_bytes[c] between B
// and W (one entry each with one chunk).
uint64_t PeakBytes(const std::vector<Op>& order, const std::vector<uint64_t>& activation_bytes,
                   const std::vector<uint64_t>& weight_input_bytes);

// "F3", "B3", "W3", "BW3" (kBackward), "F3.1" for chunk 1: for
// diagnostics and tests.
std::string Describe(const Op& op);
std::string Describe(const std::vector<Op>& order);

}  // namespace ob::schedule
