// Stage programs and the rendezvous check (program.h).
#include "ob/schedule/program.h"

#include <algorithm>
#include <cassert>
#include <cstddef>

namespace ob::schedule {
namespace {

bool IsBackward(const Op& op) { return op.type == Op::kBackward || op.type == Op::kInputGrad; }

// Whether `op` on `stage` needs an input from a neighbour.
bool NeedsInput(const Op& op, int stage, int stages) {
  if (op.type == Op::kForward) return stage > 0;
  return IsBackward(op) && stage < stages - 1;
}

}  // namespace

std::vector<StageInstr> StageProgram(const std::vector<Op>& ops, int stage, int stages) {
  assert(0 <= stage && stage < stages);
  const bool first = stage == 0, last = stage == stages - 1;
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
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const int j = op.microbatch;
    if (op.type == Op::kForward && !first) pending.push_back({false, true, stage - 1, j});
    if (IsBackward(op) && !last) pending.push_back({false, false, stage + 1, j});
    flush();  // the input's receive, with whatever was held for it
    StageInstr c;
    c.kind = StageInstr::kCompute;
    c.op = op;
    program.push_back(c);
    if (op.type == Op::kForward && !last) pending.push_back({true, true, stage + 1, j});
    if (IsBackward(op) && !first) pending.push_back({true, false, stage - 1, j});
    // Hold the result for the next compute's receive when that compute
    // comes next and goes the other way (a forward's output with the next
    // backward's gradient, a backward's with the next forward's input),
    // the pairing that keeps neighbours from both sending first; else post
    // it alone now.
    const bool pair = i + 1 < ops.size() && NeedsInput(ops[i + 1], stage, stages) &&
                      (ops[i + 1].type == Op::kForward) != (op.type == Op::kForward);
    if (!pair) flush();
  }
  flush();
  return program;
}

std::vector<StageInstr> StageProgram(const Schedule& s, int stage, int stages, int microbatches) {
  return StageProgram(s.order(stage, stages, microbatches), stage, stages);
}

std::vector<StageInstr> StageProgram(const Schedule& s, const std::vector<StageCosts>& costs, int stage,
                                     int microbatches) {
  const int stages = static_cast<int>(costs.size());
  return StageProgram((*Orders(s, costs, microbatches))[static_cast<size_t>(stage)], stage, stages);
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
        if (mine.peer < 0 || mine.peer >= n)
          return "stage " + std::to_string(s) + " talks to stage " + std::to_string(mine.peer) +
                 ", outside the pipeline";
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

}  // namespace ob::schedule
