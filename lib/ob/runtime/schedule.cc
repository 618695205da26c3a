// 1F1B op order and communication program for one stage (see schedule.h).
#include "ob/runtime/schedule.h"

#include <algorithm>
#include <cassert>
#include <cstddef>

namespace ob::runtime {

std::vector<PipelineOp> OneFOneB(int stage, int num_stages, int microbatches) {
  assert(0 <= stage && stage < num_stages);
  std::vector<PipelineOp> ops;
  if (microbatches <= 0) return ops;
  ops.reserve(2 * static_cast<size_t>(microbatches));
  const int warmup = std::min(num_stages - stage - 1, microbatches);
  int next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward) ops.push_back({true, next_forward});
  while (next_forward < microbatches) {
    ops.push_back({true, next_forward++});
    ops.push_back({false, next_backward++});
  }
  while (next_backward < microbatches) ops.push_back({false, next_backward++});
  return ops;
}

std::vector<StageInstr> StageProgram(int stage, int num_stages, int microbatches) {
  assert(0 <= stage && stage < num_stages);
  const bool first = stage == 0, last = stage == num_stages - 1;
  std::vector<StageInstr> program;
  std::vector<P2p> pending;  // messages to post in the next batch
  auto flush = [&] {
    if (pending.empty()) return;
    StageInstr c;
    c.kind = StageInstr::kComm;
    c.comm = std::move(pending);
    pending.clear();
    program.push_back(std::move(c));
  };
  auto compute = [&](StageInstr::Kind kind, int j) {
    StageInstr c;
    c.kind = kind;
    c.microbatch = j;
    program.push_back(c);
  };
  const auto ops = OneFOneB(stage, num_stages, microbatches);
  // An input is received in the batch that precedes the compute needing it;
  // a result is sent with the next batch there is, or alone before the next
  // compute that would otherwise hold it back, or at the end. The steady
  // state pairs each send with the next receive, which is the batching that
  // keeps neighbours from both sending first.
  for (size_t i = 0; i < ops.size(); ++i) {
    const PipelineOp& op = ops[i];
    const int j = op.microbatch;
    if (op.forward) {
      if (!first) pending.push_back({false, true, stage - 1, j});
      // In the warm-up (the next op is a forward too, or this is the last
      // stage's alternation) there is nothing to pair the input's receive
      // with but what is already pending.
      flush();
      compute(StageInstr::kForward, j);
      if (!last) pending.push_back({true, true, stage + 1, j});
      // Pair the activation's send with the receive of the next backward's
      // gradient when that backward comes next; else post it alone now, so
      // the next stage is not kept waiting through our next compute.
      const bool backward_next = i + 1 < ops.size() && !ops[i + 1].forward;
      if (!backward_next) flush();
    } else {
      if (!last) pending.push_back({false, false, stage + 1, j});
      flush();
      compute(StageInstr::kBackward, j);
      if (!first) pending.push_back({true, false, stage - 1, j});
      // Pair the gradient's send with the receive of the next forward's
      // input when a forward comes next (posted ahead of it); else alone.
      const bool forward_next = i + 1 < ops.size() && ops[i + 1].forward;
      if (!forward_next || first) flush();
    }
  }
  flush();
  return program;
}

std::string Describe(const std::vector<P2p>& batch) {
  std::string s;
  for (const P2p& p : batch) {
    if (!s.empty()) s += ", ";
    s += p.send ? "send " : "recv ";
    s += p.activation ? "a" : "g";
    s += std::to_string(p.microbatch);
    s += p.send ? "→" : "←";
    s += std::to_string(p.peer);
  }
  return "{" + s + "}";
}

std::string CheckRendezvous(const std::vector<std::vector<StageInstr>>& programs) {
  const int n = static_cast<int>(programs.size());
  // Per stage: the index of its current instruction and, for its current
  // batch, which messages have met their counterpart.
  std::vector<size_t> pc(static_cast<size_t>(n), 0);
  std::vector<std::vector<bool>> met(static_cast<size_t>(n));
  auto skip_computes = [&](int s) {
    const auto& prog = programs[static_cast<size_t>(s)];
    while (pc[s] < prog.size() && prog[pc[s]].kind != StageInstr::kComm) ++pc[s];
    met[s].assign(pc[s] < prog.size() ? prog[pc[s]].comm.size() : 0, false);
  };
  for (int s = 0; s < n; ++s) skip_computes(s);
  for (;;) {
    bool progress = false;
    // Match messages of current batches pairwise.
    for (int s = 0; s < n; ++s) {
      const auto& prog = programs[static_cast<size_t>(s)];
      if (pc[s] >= prog.size()) continue;
      const auto& batch = prog[pc[s]].comm;
      for (size_t k = 0; k < batch.size(); ++k) {
        if (met[s][k]) continue;
        const P2p& mine = batch[k];
        if (mine.peer < 0 || mine.peer >= n) return "stage " + std::to_string(s) + " talks to stage " + std::to_string(mine.peer) + ", outside the pipeline";
        const int q = mine.peer;
        const auto& qprog = programs[static_cast<size_t>(q)];
        if (pc[q] >= qprog.size()) continue;
        const auto& qbatch = qprog[pc[q]].comm;
        const P2p want{!mine.send, mine.activation, s, mine.microbatch};
        for (size_t l = 0; l < qbatch.size(); ++l) {
          if (!met[q][l] && qbatch[l] == want) {
            met[s][k] = met[q][l] = true;
            progress = true;
            break;
          }
        }
      }
    }
    // Complete every batch whose messages all met.
    for (int s = 0; s < n; ++s) {
      const auto& prog = programs[static_cast<size_t>(s)];
      if (pc[s] >= prog.size()) continue;
      if (std::all_of(met[s].begin(), met[s].end(), [](bool b) { return b; })) {
        ++pc[s];
        skip_computes(s);
        progress = true;
      }
    }
    bool done = true;
    for (int s = 0; s < n; ++s) done = done && pc[s] >= programs[static_cast<size_t>(s)].size();
    if (done) return "";
    if (!progress) break;
  }
  std::string stuck = "deadlock:";
  for (int s = 0; s < n; ++s) {
    const auto& prog = programs[static_cast<size_t>(s)];
    stuck += " stage " + std::to_string(s) + " ";
    stuck += pc[s] < prog.size() ? "waits in " + Describe(prog[pc[s]].comm) : "done";
    if (s + 1 < n) stuck += ";";
  }
  return stuck;
}

}  // namespace ob::runtime
