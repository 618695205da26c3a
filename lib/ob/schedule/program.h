// A stage's program (design/schedule.md, Messages): its schedule's computes
// with the messages between them, batched so that a pipeline cannot
// deadlock on rendezvous channels. What the workers execute and what the
// planner replays on shared cores. Torch-free, pure.
//
// NCCL's point-to-point is a rendezvous: a send does not complete until
// the peer has posted the matching receive, and a rank's operations on one
// channel run in the order it issued them. Issued one by one in compute
// order (send a_j, then receive g_k, ...), 1F1B deadlocks already at S = 2,
// m = 2: in the steady state both neighbours send first. So a program
// posts each input's receive in a batch just before the compute that
// needs it, and holds a result's send for that batch when the very next
// compute needs an input and goes the other way (a forward's output with
// the next backward's gradient, a backward's input gradient with the next
// forward's input); otherwise the send goes alone at once, so the
// neighbour is not kept waiting through the next compute (a W, say). Each
// batch is posted at once (ncclGroupStart/End under NCCL); the worker
// waits for its receives before the compute that needs them, and for its
// sends only at the step's end (a send's channel stays held until the
// peer receives, under NCCL, whether or not the host waits). CheckRendezvous
// replays a pipeline's programs against that channel model, each batch
// complete when all its messages met; schedule_test runs it for every
// schedule at unit costs, S <= 8, m <= 16, and for orders made for other
// costs, which greedy.h keeps only when it passes.
#pragma once

#include <string>
#include <vector>

#include "ob/schedule/schedule.h"

namespace ob::schedule {

// One message across a boundary of the chain: micro-batch `microbatch`'s
// activation (sent forward, virtual stage k to k + 1) or its gradient
// (sent backward, k + 1 to k), k = `link`. With one chunk, link is the
// lower of the two stages. Boundaries within a stage (Chain::Local) have
// no message.
struct P2p {
  bool send = true;        // false: receive
  bool activation = true;  // false: gradient
  int peer = 0;            // the other stage
  int microbatch = 0;
  int link = 0;            // the virtual boundary crossed
  bool operator==(const P2p& o) const {
    return send == o.send && activation == o.activation && peer == o.peer && microbatch == o.microbatch &&
           link == o.link;
  }
};

// One instruction of a stage's program: a compute (one op of the order) or
// a batch of messages posted together and waited for together (never
// empty).
struct StageInstr {
  enum Kind { kCompute, kComm } kind = kCompute;
  Op op;                  // kCompute
  std::vector<P2p> comm;  // kComm
};

// The program of `stage` for its ops `order` (Schedule::order's). Every
// forward of micro-batch j is preceded (not necessarily immediately) by
// the batch receiving its input on stages > 0, every kBackward or
// kInputGrad by the one receiving its output gradient on stages < S − 1,
// and each result is sent in the first batch after it is computed.
// REQUIRES: 0 <= stage < stages.
std::vector<StageInstr> StageProgram(const std::vector<Op>& order, int stage, int stages);
// Every stage's program for `orders` (orders[i] is stage i's). With one
// chunk, StageProgram's. With chunks a stage exchanges with one neighbour
// on several links at once (interleaved: forwards of one chunk and
// backwards of another both ways between stages S − 1 and 0 as between
// any two; a V: activations both ways), and no rule that looks at one
// stage's order alone pairs them safely. So the pipeline is run once at
// unit costs (Simulate), each message stamped with the time its result is
// computed, and both ends post it in their first batch before a compute
// that starts at or after that time: every stage then posts the messages
// it shares with a neighbour in one order of time, messages of one time
// together, and the batch with the earliest latest message always
// completes (its counterparts are in their stages' current batches), so
// no order of chunks can deadlock. A forward of chunk c waits for the
// previous virtual stage's activation, a backward for the next one's
// gradient, unless that one lies on this stage.
std::vector<std::vector<StageInstr>> Programs(const PipelineOrders& orders, const Chain& chain);
std::vector<StageInstr> StageProgram(const std::vector<Op>& order, int stage, const Chain& chain);
// The same for schedule `s`'s order at unit costs, and at the pipeline's
// `costs` (Orders: one per virtual stage).
std::vector<StageInstr> StageProgram(const Schedule& s, int stage, int stages, int microbatches, int chunks = 1);
std::vector<StageInstr> StageProgram(const Schedule& s, const std::vector<StageCosts>& costs, int stage,
                                     int microbatches, int chunks = 1);

// Replays one program per stage (programs[s] is stage s's) against
// rendezvous-only channels: a rank blocks on its current batch until every
// message in it has met its counterpart (a send of stage a to b with the
// same kind and micro-batch meets a receive of b from a) in the peer's
// current batch; computes never block. Returns "" when every program runs
// to its end, else a description of the stuck state (each stage's pending
// batch), which is a deadlock.
std::string CheckRendezvous(const std::vector<std::vector<StageInstr>>& programs);

// "{send a3→1, recv g2@1←2}" (@ the link where it is not 0), for
// diagnostics.
std::string Describe(const std::vector<P2p>& batch);

}  // namespace ob::schedule
