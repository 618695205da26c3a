// The order in which one pipeline stage runs its forward and backward passes
// during an iteration under 1F1B (PipeDream-Flush, as Megatron-LM runs it),
// and the order in which it exchanges activations and gradients with its
// neighbours. Torch-free, pure.
//
// Stage i of S with m micro-batches runs min(S − i − 1, m) warm-up forwards,
// then alternates one forward and one backward until every forward has run,
// then drains the remaining backwards. Forwards and backwards each go in
// micro-batch order; stage i never holds more than min(S − i, m) micro-batches
// whose forward ran and whose backward has not (the memory bound the planner
// assumes, design/formulas.md).
//
// Communication (StageProgram). NCCL's point-to-point is a rendezvous: a send
// does not complete until the peer has posted the matching receive, and a
// rank's operations on one channel run in the order it issued them. Issued
// one by one in compute order (send a_j, then receive g_k, ...), 1F1B
// deadlocks already at S = 2, m = 2: in the steady state both neighbours
// send first. So the program batches, in the steady state, the send of a
// forward's output with the receive of the gradient the next backward
// needs, and the send of a backward's input gradient with the receive of
// the next forward's input; each batch is posted at once (ncclGroupStart/
// End under NCCL) and completes as a whole, and the next forward's input is
// thereby posted before this stage computes anything else. CheckRendezvous
// replays the programs of a whole pipeline against that channel model and
// finds any cycle of waits; schedule_test runs it for every S <= 8, m <= 16.
//
// ob::plan::Simulate1F1B times the same compute order; this is what workers
// execute.
#pragma once

#include <string>
#include <vector>

namespace ob::runtime {

struct PipelineOp {
  bool forward = true;  // false: backward
  int microbatch = 0;   // 0-based, local to the pipeline
};

// The 2·m ops of `stage` in execution order; empty when m <= 0.
// REQUIRES: 0 <= stage < num_stages.
std::vector<PipelineOp> OneFOneB(int stage, int num_stages, int microbatches);

// One message across a stage boundary: micro-batch `microbatch`'s
// activation (sent forward, stage s to s + 1) or its gradient (sent
// backward, s + 1 to s).
struct P2p {
  bool send = true;        // false: receive
  bool activation = true;  // false: gradient
  int peer = 0;            // the other stage
  int microbatch = 0;
  bool operator==(const P2p& o) const {
    return send == o.send && activation == o.activation && peer == o.peer &&
           microbatch == o.microbatch;
  }
};

// One instruction of a stage's program: a compute (forward or backward of a
// micro-batch) or a batch of messages posted together and waited for
// together (never empty).
struct StageInstr {
  enum Kind { kForward, kBackward, kComm } kind = kForward;
  int microbatch = 0;       // kForward, kBackward
  std::vector<P2p> comm;    // kComm
};

// The whole program of `stage`: OneFOneB's computes with the messages they
// need, batched as described above. Every forward of micro-batch j is
// preceded (not necessarily immediately) by the batch that receives its
// input on stages > 0, every backward by the one that receives its output
// gradient on stages < S − 1, and each result is sent in the first batch
// after it is computed. REQUIRES: 0 <= stage < num_stages.
std::vector<StageInstr> StageProgram(int stage, int num_stages, int microbatches);

// Replays one program per stage (programs[s] is stage s's) against
// rendezvous-only channels: a rank blocks on its current batch until every
// message in it has met its counterpart (a send of stage a to b with the
// same kind and micro-batch meets a receive of b from a) in the peer's
// current batch; computes never block. Returns "" when every program runs
// to its end, else a description of the stuck state (each stage's pending
// batch), which is a deadlock. Also reports messages with no counterpart.
std::string CheckRendezvous(const std::vector<std::vector<StageInstr>>& programs);

// "send a3→1" etc., for diagnostics.
std::string Describe(const std::vector<P2p>& batch);

}  // namespace ob::runtime
