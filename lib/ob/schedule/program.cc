// Stage programs and the rendezvous check (program.h).
#include "ob/schedule/program.h"

#include <algorithm>
#include <cassert>
#include <cstddef>

#include "ob/schedule/timing.h"

namespace ob::schedule {
namespace {

bool IsBackward(const Op& op) { return op.type == Op::kBackward || op.type == Op::kInputGrad; }

// The neighbour `op` on `stage` of a one-chunk pipeline needs an input
// from (a forward from the previous stage, a backward from the next), or
// -1 when it needs none.
int InputPeer(const Op& op, int stage, int stages) {
  if (op.type == Op::kForward) return stage > 0 ? stage - 1 : -1;
  return IsBackward(op) && stage + 1 < stages ? stage + 1 : -1;
}

// One chunk a stage (program.h): each input's receive in a batch just
// before its compute, a result's send held for it when the next compute's
// input comes from the stage the result goes to. The link of a message is
// the lower of the two stages.
std::vector<StageInstr> PairedProgram(const std::vector<Op>& ops, int stage, int stages) {
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
    if (op.type == Op::kForward && !first) pending.push_back({false, true, stage - 1, j, stage - 1});
    if (IsBackward(op) && !last) pending.push_back({false, false, stage + 1, j, stage});
    flush();  // the input's receive, with whatever was held for it
    StageInstr c;
    c.kind = StageInstr::kCompute;
    c.op = op;
    program.push_back(c);
    if (op.type == Op::kForward && !last) pending.push_back({true, true, stage + 1, j, stage});
    if (IsBackward(op) && !first) pending.push_back({true, false, stage - 1, j, stage - 1});
    // Hold the result for the next compute's receive when that compute
    // comes next and its input comes from the stage the result goes to (a
    // forward's output with the next backward's gradient, a backward's
    // with the next forward's input), the pairing that keeps neighbours
    // from both sending first; else post it alone now.
    const bool pair = i + 1 < ops.size() && !pending.empty() &&
                      InputPeer(ops[i + 1], stage, stages) == pending.back().peer;
    if (!pair) flush();
  }
  flush();
  return program;
}

// Chunks (program.h): every message at the time its result is computed in
// a run of the orders at unit costs, posted by both ends in the first
// batch before a compute that starts at or after that time.
std::vector<std::vector<StageInstr>> TimedPrograms(const PipelineOrders& orders, const Chain& chain) {
  const int S = chain.stages, V = chain.size();
  int m = 0;
  for (const auto& ops : orders)
    for (const Op& op : ops) m = std::max(m, op.microbatch + 1);
  // Per stage: its computes' start times (unit costs: whole numbers, exact).
  std::vector<std::vector<double>> starts(static_cast<size_t>(S));
  struct Message {
    double at;
    P2p send, receive;  // on the sender (receive.peer) and the receiver (send.peer)
  };
  std::vector<Message> messages;
  for (const TimedOp& t : Simulate(orders, UnitCosts(V), m, chain.placement)) {
    starts[t.stage].push_back(t.start);
    const int k = chain.At(t.stage, t.op.chunk), j = t.op.microbatch;
    const bool backward = t.op.type == Op::kBackward || t.op.type == Op::kInputGrad;
    if (t.op.type == Op::kForward && k + 1 < V && !chain.Local(k)) {
      const int to = chain.StageOf(k + 1);
      messages.push_back({t.end, {true, true, to, j, k}, {false, true, t.stage, j, k}});
    }
    if (backward && k > 0 && !chain.Local(k - 1)) {
      const int to = chain.StageOf(k - 1);
      messages.push_back({t.end, {true, false, to, j, k - 1}, {false, false, t.stage, j, k - 1}});
    }
  }
  // Batches: [stage][gap], gap g before compute g, the last after all.
  std::vector<std::vector<std::vector<P2p>>> batches(static_cast<size_t>(S));
  for (int i = 0; i < S; ++i) batches[i].resize(starts[i].size() + 1);
  std::stable_sort(messages.begin(), messages.end(),
                   [](const Message& a, const Message& b) { return a.at < b.at; });
  auto gap = [&](int i, double at) {
    const auto& st = starts[i];
    return static_cast<size_t>(std::lower_bound(st.begin(), st.end(), at) - st.begin());
  };
  for (const Message& msg : messages) {
    const int from = msg.receive.peer, to = msg.send.peer;
    batches[from][gap(from, msg.at)].push_back(msg.send);
    batches[to][gap(to, msg.at)].push_back(msg.receive);
  }
  std::vector<std::vector<StageInstr>> programs(static_cast<size_t>(S));
  for (int i = 0; i < S; ++i) {
    auto& prog = programs[i];
    const auto& ops = orders[i];
    for (size_t g = 0; g <= ops.size(); ++g) {
      if (!batches[i][g].empty()) {
        StageInstr c;
        c.kind = StageInstr::kComm;
        c.comm = std::move(batches[i][g]);
        prog.push_back(std::move(c));
      }
      if (g == ops.size()) break;
      StageInstr c;
      c.kind = StageInstr::kCompute;
      c.op = ops[g];
      prog.push_back(c);
    }
  }
  return programs;
}

}  // namespace

std::vector<StageInstr> StageProgram(const std::vector<Op>& ops, int stage, int stages) {
  return PairedProgram(ops, stage, stages);
}

std::vector<std::vector<StageInstr>> Programs(const PipelineOrders& orders, const Chain& chain) {
  if (chain.chunks > 1) return TimedPrograms(orders, chain);
  std::vector<std::vector<StageInstr>> out;
  for (int i = 0; i < chain.stages; ++i) out.push_back(PairedProgram(orders[i], i, chain.stages));
  return out;
}

std::vector<StageInstr> StageProgram(const Schedule& s, int stage, int stages, int microbatches, int chunks) {
  if (chunks == 1) return StageProgram(Order(s, stage, stages, microbatches), stage, stages);
  return Programs(*Orders(s, stages, microbatches, chunks), s.ChainOf(stages, chunks))[stage];
}

std::vector<StageInstr> StageProgram(const Schedule& s, const std::vector<StageCosts>& costs, int stage,
                                     int microbatches, int chunks) {
  const int stages = static_cast<int>(costs.size()) / chunks;
  const auto orders = Orders(s, costs, microbatches, chunks);
  if (chunks == 1) return StageProgram((*orders)[static_cast<size_t>(stage)], stage, stages);
  return Programs(*orders, s.ChainOf(stages, chunks))[stage];
}

std::string Describe(const std::vector<P2p>& batch) {
  std::string s;
  for (const P2p& p : batch) {
    if (!s.empty()) s += ", ";
    s += p.send ? "send " : "recv ";
    s += p.activation ? "a" : "g";
    s += std::to_string(p.microbatch);
    if (p.link != 0) s += "@" + std::to_string(p.link);
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
        const P2p want{!mine.send, mine.activation, s, mine.microbatch, mine.link};
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
