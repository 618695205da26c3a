// The stage programs (runtime/schedule.h) against a rendezvous-only channel:
// no pipeline of up to 8 stages and 16 micro-batches can deadlock, every
// message has its counterpart, and each compute has its inputs.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "ob/runtime/schedule.h"

namespace ob::runtime {
namespace {

using Programs = std::vector<std::vector<StageInstr>>;

Programs Pipeline(int stages, int m) {
  Programs p;
  for (int s = 0; s < stages; ++s) p.push_back(StageProgram(s, stages, m));
  return p;
}

// Issue 13's "old order": each message posted and waited for on its own, in
// compute order (receive the input, compute, send the result).
Programs OneByOne(int stages, int m) {
  Programs programs;
  for (int s = 0; s < stages; ++s) {
    std::vector<StageInstr> prog;
    auto comm = [&](P2p p) {
      StageInstr c;
      c.kind = StageInstr::kComm;
      c.comm = {p};
      prog.push_back(c);
    };
    for (const PipelineOp& op : OneFOneB(s, stages, m)) {
      const int j = op.microbatch;
      if (op.forward) {
        if (s > 0) comm({false, true, s - 1, j});
        prog.push_back({StageInstr::kForward, j, {}});
        if (s + 1 < stages) comm({true, true, s + 1, j});
      } else {
        if (s + 1 < stages) comm({false, false, s + 1, j});
        prog.push_back({StageInstr::kBackward, j, {}});
        if (s > 0) comm({true, false, s - 1, j});
      }
    }
    programs.push_back(prog);
  }
  return programs;
}

TEST_CASE("the rendezvous model finds the deadlock of one-by-one 1F1B messages",
          "[runtime][schedule]") {
  const std::string stuck = CheckRendezvous(OneByOne(2, 2));
  INFO(stuck);
  CHECK(stuck.find("deadlock") == 0);
  CHECK(stuck.find("stage 0 waits in {send a1→1}") != std::string::npos);
  CHECK(stuck.find("stage 1 waits in {send g0→0}") != std::string::npos);
  CHECK(CheckRendezvous(OneByOne(1, 4)).empty());  // nothing to exchange
}

TEST_CASE("stage programs never deadlock on rendezvous channels, S <= 8, m <= 16",
          "[runtime][schedule]") {
  for (int stages = 1; stages <= 8; ++stages) {
    for (int m = 1; m <= 16; ++m) {
      INFO("S = " << stages << ", m = " << m);
      const Programs programs = Pipeline(stages, m);
      CHECK(CheckRendezvous(programs).empty());
    }
  }
}

TEST_CASE("stage programs run 1F1B's computes, inputs first, results sent once",
          "[runtime][schedule]") {
  for (int stages = 1; stages <= 8; ++stages) {
    for (int m = 1; m <= 16; ++m) {
      for (int s = 0; s < stages; ++s) {
        INFO("S = " << stages << ", m = " << m << ", stage " << s);
        const auto prog = StageProgram(s, stages, m);
        const auto ops = OneFOneB(s, stages, m);
        std::vector<int> got_input(m, 0), got_grad(m, 0), sent_act(m, 0), sent_grad(m, 0);
        std::vector<bool> forward_done(m, false), backward_done(m, false);
        size_t next_op = 0;
        for (const StageInstr& in : prog) {
          if (in.kind == StageInstr::kComm) {
            REQUIRE(!in.comm.empty());
            for (const P2p& p : in.comm) {
              REQUIRE(p.microbatch >= 0);
              REQUIRE(p.microbatch < m);
              if (p.activation) {
                REQUIRE(p.peer == (p.send ? s + 1 : s - 1));
                if (p.send) {
                  CHECK(forward_done[p.microbatch]);
                  ++sent_act[p.microbatch];
                } else {
                  ++got_input[p.microbatch];
                }
              } else {
                REQUIRE(p.peer == (p.send ? s - 1 : s + 1));
                if (p.send) {
                  CHECK(backward_done[p.microbatch]);
                  ++sent_grad[p.microbatch];
                } else {
                  ++got_grad[p.microbatch];
                }
              }
            }
            continue;
          }
          REQUIRE(next_op < ops.size());
          CHECK(ops[next_op].forward == (in.kind == StageInstr::kForward));
          CHECK(ops[next_op].microbatch == in.microbatch);
          ++next_op;
          const int j = in.microbatch;
          if (in.kind == StageInstr::kForward) {
            if (s > 0) CHECK(got_input[j] == 1);
            forward_done[j] = true;
          } else {
            CHECK(forward_done[j]);
            if (s + 1 < stages) CHECK(got_grad[j] == 1);
            backward_done[j] = true;
          }
        }
        CHECK(next_op == ops.size());
        for (int j = 0; j < m; ++j) {
          CHECK(got_input[j] == (s > 0 ? 1 : 0));
          CHECK(sent_act[j] == (s + 1 < stages ? 1 : 0));
          CHECK(got_grad[j] == (s + 1 < stages ? 1 : 0));
          CHECK(sent_grad[j] == (s > 0 ? 1 : 0));
        }
      }
    }
  }
}

TEST_CASE("the steady state posts the next forward's input before computing it",
          "[runtime][schedule]") {
  // Stage 1 of 3, 4 micro-batches: after backward 0 its gradient goes out
  // with the receive of forward 2's input, as Megatron's
  // send_backward_recv_forward.
  const auto prog = StageProgram(1, 3, 4);
  bool found = false;
  for (size_t i = 0; i + 1 < prog.size(); ++i) {
    if (prog[i].kind == StageInstr::kBackward && prog[i].microbatch == 0) {
      REQUIRE(prog[i + 1].kind == StageInstr::kComm);
      CHECK(Describe(prog[i + 1].comm) == "{send g0→0, recv a2←0}");
      found = true;
    }
  }
  CHECK(found);
}

}  // namespace
}  // namespace ob::runtime
