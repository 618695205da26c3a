// The schedules (lib/ob/schedule/): each order is a valid pipeline order
// within its memory limits, its stage programs cannot deadlock on
// rendezvous channels (S <= 8, m <= 16), every message has its
// counterpart and each compute its inputs, and the times at equal op costs
// are the published ones (1F1B's (m + S − 1)(F + B + W); a zero-bubble
// schedule's fill of (S − 1)·F alone once m is large enough for ZB-H2).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ob/schedule/program.h"
#include "ob/schedule/schedule.h"
#include "ob/schedule/timing.h"

namespace ob::schedule {
namespace {

using Programs = std::vector<std::vector<StageInstr>>;

Programs Pipeline(const Schedule& s, int stages, int m) {
  Programs p;
  for (int i = 0; i < stages; ++i) p.push_back(StageProgram(s, i, stages, m));
  return p;
}

bool IsBackward(const Op& op) { return op.type == Op::kBackward || op.type == Op::kInputGrad; }

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
    for (const Op& op : Order(OneFOneB(), s, stages, m)) {
      const int j = op.microbatch;
      StageInstr c;
      c.op = op;
      if (op.type == Op::kForward) {
        if (s > 0) comm({false, true, s - 1, j});
        prog.push_back(c);
        if (s + 1 < stages) comm({true, true, s + 1, j});
      } else {
        if (s + 1 < stages) comm({false, false, s + 1, j});
        prog.push_back(c);
        if (s > 0) comm({true, false, s - 1, j});
      }
    }
    programs.push_back(prog);
  }
  return programs;
}

TEST_CASE("the rendezvous model finds the deadlock of one-by-one 1F1B messages", "[schedule]") {
  const std::string stuck = CheckRendezvous(OneByOne(2, 2));
  INFO(stuck);
  CHECK(stuck.find("deadlock") == 0);
  CHECK(stuck.find("stage 0 waits in {send a1→1}") != std::string::npos);
  CHECK(stuck.find("stage 1 waits in {send g0→0}") != std::string::npos);
  CHECK(CheckRendezvous(OneByOne(1, 4)).empty());  // nothing to exchange
}

TEST_CASE("the registry: names, 1F1B first and for an empty name", "[schedule]") {
  REQUIRE(All().size() >= 3);
  CHECK(All().front() == &OneFOneB());
  CHECK(Find("") == &OneFOneB());
  CHECK(Find("1f1b") == &OneFOneB());
  REQUIRE(Find("zb-h1") != nullptr);
  CHECK(Find("zb-h1")->splits_backward);
  CHECK(Find("zb-h3") == nullptr);
  CHECK(Names() == "1f1b, zb-h1, zb-h2, interleaved, zb-v");
  CHECK_FALSE(Find("zb-h2")->chunked());
  CHECK((Find("interleaved")->chunked() && !Find("interleaved")->splits_backward));
  CHECK((Find("zb-v")->min_chunks == 2 && Find("zb-v")->max_chunks == 2 && Find("zb-v")->splits_backward));
}

TEST_CASE("1F1B's order: warm-up forwards, then one forward one backward", "[schedule]") {
  CHECK(Describe(Order(OneFOneB(), 0, 3, 4)) == "F0 F1 F2 BW0 F3 BW1 BW2 BW3");
  CHECK(Describe(Order(OneFOneB(), 2, 3, 4)) == "F0 BW0 F1 BW1 F2 BW2 F3 BW3");
  CHECK(Describe(Order(OneFOneB(), 0, 4, 2)) == "F0 F1 BW0 BW1");
  CHECK(Order(OneFOneB(), 0, 2, 0).empty());
}

TEST_CASE("every order runs each micro-batch's ops once, in order, within its schedule's memory",
          "[schedule]") {
  for (const Schedule* s : All()) {
    if (s->chunked()) continue;  // schedule_chunks_test.cc
    for (int stages = 1; stages <= 8; ++stages) {
      for (int m = 1; m <= 16; ++m) {
        for (int i = 0; i < stages; ++i) {
          INFO(s->name << ": S = " << stages << ", m = " << m << ", stage " << i);
          const auto ops = Order(*s, i, stages, m);
          INFO(Describe(ops));
          int f = 0, b = 0, w = 0;
          for (const Op& op : ops) {
            switch (op.type) {
              case Op::kForward: CHECK(op.microbatch == f++); break;
              case Op::kBackward: CHECK_FALSE(s->splits_backward); CHECK(op.microbatch == b++); ++w; break;
              case Op::kInputGrad: CHECK(s->splits_backward); CHECK(op.microbatch == b++); break;
              case Op::kWeightGrad: CHECK(op.microbatch == w++); break;
            }
            CHECK(b <= f);
            CHECK(w <= b);
          }
          CHECK(f == m);
          CHECK(b == m);
          CHECK(w == m);
          // Memory: 1F1B's stage i holds S − i; the zero-bubble ones at most
          // S − i before B, and at most S (zb-h1) or 2S − 1 (zb-h2) before W.
          const auto peaks = Peaks(ops);
          REQUIRE_FALSE(peaks.empty());
          const int held_limit = s->name == "zb-h2" ? 2 * stages - 1 : stages;
          for (const Held& h : peaks) {
            CHECK(h.activations <= std::min(stages - i, m));
            CHECK(h.activations + h.weight_inputs <= std::min(held_limit, m));
            if (!s->splits_backward) CHECK(h.weight_inputs == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("Peaks keeps the points no other dominates", "[schedule]") {
  const std::vector<Op> ops{{Op::kForward, 0},   {Op::kForward, 1},    {Op::kInputGrad, 0}, {Op::kInputGrad, 1},
                            {Op::kForward, 2},   {Op::kWeightGrad, 0}, {Op::kWeightGrad, 1}, {Op::kInputGrad, 2},
                            {Op::kWeightGrad, 2}};
  const auto peaks = Peaks(ops);
  // Held after each F and B: (1,0) (2,0) (1,1) (0,2) (1,2) (0,1); (1,2)
  // covers all but (2,0).
  REQUIRE(peaks.size() == 2);
  CHECK((peaks[0].activations == 1 && peaks[0].weight_inputs == 2));
  CHECK((peaks[1].activations == 2 && peaks[1].weight_inputs == 0));
  CHECK(PeakBytes(peaks, 10, 3) == 20);
  CHECK(PeakBytes(peaks, 10, 6) == 22);
}

TEST_CASE("stage programs never deadlock on rendezvous channels, S <= 8, m <= 16", "[schedule]") {
  for (const Schedule* s : All()) {
    if (s->chunked()) continue;  // schedule_chunks_test.cc
    for (int stages = 1; stages <= 8; ++stages) {
      for (int m = 1; m <= 16; ++m) {
        INFO(s->name << ": S = " << stages << ", m = " << m);
        CHECK(CheckRendezvous(Pipeline(*s, stages, m)).empty());
      }
    }
  }
}

TEST_CASE("stage programs run their schedule's computes, inputs first, results sent once", "[schedule]") {
  for (const Schedule* sch : All()) {
    if (sch->chunked()) continue;  // schedule_chunks_test.cc
    for (int stages = 1; stages <= 8; ++stages) {
      for (int m = 1; m <= 16; ++m) {
        for (int s = 0; s < stages; ++s) {
          INFO(sch->name << ": S = " << stages << ", m = " << m << ", stage " << s);
          const auto prog = StageProgram(*sch, s, stages, m);
          const auto ops = Order(*sch, s, stages, m);
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
            CHECK(ops[next_op] == in.op);
            ++next_op;
            const int j = in.op.microbatch;
            if (in.op.type == Op::kForward) {
              if (s > 0) CHECK(got_input[j] == 1);
              forward_done[j] = true;
            } else if (IsBackward(in.op)) {
              CHECK(forward_done[j]);
              if (s + 1 < stages) CHECK(got_grad[j] == 1);
              backward_done[j] = true;
            } else {
              CHECK(backward_done[j]);
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
}

TEST_CASE("the steady state posts the next forward's input before computing it", "[schedule]") {
  // Stage 1 of 3, 4 micro-batches: after backward 0 its gradient goes out
  // with the receive of forward 2's input, as Megatron's
  // send_backward_recv_forward.
  const auto prog = StageProgram(OneFOneB(), 1, 3, 4);
  bool found = false;
  for (size_t i = 0; i + 1 < prog.size(); ++i) {
    if (prog[i].kind == StageInstr::kCompute && prog[i].op == Op{Op::kBackward, 0}) {
      REQUIRE(prog[i + 1].kind == StageInstr::kComm);
      CHECK(Describe(prog[i + 1].comm) == "{send g0→0, recv a2←0}");
      found = true;
    }
  }
  CHECK(found);
}

std::vector<StageCosts> Equal(int stages, double f, double b, double w) {
  return std::vector<StageCosts>(static_cast<size_t>(stages), StageCosts{f, b, w, 0, 0});
}

TEST_CASE("at equal op costs, 1F1B idles (S - 1)(F + B + W) and the zero-bubble schedules less", "[schedule]") {
  for (int stages = 1; stages <= 8; ++stages) {
    for (int m = 1; m <= 24; ++m) {
      INFO("S = " << stages << ", m = " << m);
      const auto costs = Equal(stages, 1, 1, 1);
      const double one = Makespan(Simulate(OneFOneB(), costs, m));
      CHECK(one == Approx(3.0 * (m + stages - 1)));
      const double h1 = Makespan(Simulate(*Find("zb-h1"), costs, m));
      const double h2 = Makespan(Simulate(*Find("zb-h2"), costs, m));
      // No schedule beats the last stage's wait for the first forward.
      CHECK(h1 >= 3.0 * m + stages - 1);
      CHECK(h2 >= 3.0 * m + stages - 1);
      CHECK(h2 <= h1);
      if (stages > 1 && m > 1) CHECK(h1 < one);
      if (m >= 2 * stages) CHECK(h2 == Approx(3.0 * m + stages - 1));
    }
  }
  // ZB-H1 at S = 8, m = 16: 1F1B idles 21 of 69, ZB-H1 9 of 57.
  CHECK(Makespan(Simulate(*Find("zb-h1"), Equal(8, 1, 1, 1), 16)) == Approx(57));
}

TEST_CASE("the time of an order holds for any costs: transfers and uneven stages", "[schedule]") {
  std::vector<StageCosts> c{{1.0, 1.5, 0.7, 0.2, 0.3}, {2.0, 2.5, 1.1, 0.1, 0.1}, {0.5, 0.9, 0.4, 0, 0}};
  for (const Schedule* s : All()) {
    if (s->chunked()) continue;  // schedule_chunks_test.cc
    INFO(s->name);
    const auto ops = Simulate(*s, c, 6);
    REQUIRE(ops.size() == static_cast<size_t>(3 * 6 * (s->splits_backward ? 3 : 2)));
    // Each stage's ops in order, none overlapping; each op after its input.
    for (size_t k = 1; k < ops.size(); ++k)
      if (ops[k].stage == ops[k - 1].stage) CHECK(ops[k].start >= ops[k - 1].end - 1e-12);
    for (const TimedOp& t : ops) {
      if (t.op.type != Op::kForward || t.stage == 0) continue;
      for (const TimedOp& u : ops)
        if (u.stage == t.stage - 1 && u.op == t.op) CHECK(t.start >= u.end + c[u.stage].send - 1e-12);
    }
  }
}

}  // namespace
}  // namespace ob::schedule

namespace ob::schedule {
namespace {

// A stage's costs as the 2-core bench measured them (bench/schedules.sh:
// per micro-batch F 0.32 s, B 0.30 s, W 0.20 s): W cheaper than F.
std::vector<StageCosts> CheapW(int stages) {
  return std::vector<StageCosts>(static_cast<size_t>(stages), StageCosts{0.32, 0.30, 0.20, 0, 0});
}

TEST_CASE("zero-bubble orders are made for the pipeline's own costs, never slower than at unit costs",
          "[schedule]") {
  // S = 2, m = 4, W cheaper than F: the unit-cost ZB-H1 order has stage 0
  // run W0 while stage 1 waits for F2; ordered by these costs stage 0
  // runs F2 first (W0 still fits before B1's gradient arrives).
  const auto c = CheapW(2);
  const Schedule& h1 = *Find("zb-h1");
  const double own = Makespan(h1, c, 4);
  const double unit = Makespan(*Orders(h1, 2, 4), c, 4);
  INFO("own " << Describe((*Orders(h1, c, 4))[0]) << " | unit " << Describe((*Orders(h1, 2, 4))[0]));
  CHECK(own < unit - 0.05);
  // 1F1B's backward sends its input gradient after its weight gradients:
  // the zero-bubble order at these costs saves a tenth of its step.
  CHECK(own < 0.91 * Makespan(OneFOneB(), c, 4));

  // Any costs: valid orders within the memory limits, programs that cannot
  // deadlock, never slower than the unit-cost order, and the same order
  // for costs in another unit (seconds or milliseconds).
  uint64_t seed = 12345;
  auto next = [&] {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return 0.05 + static_cast<double>(seed >> 40) / static_cast<double>(1ULL << 24);
  };
  for (int trial = 0; trial < 60; ++trial) {
    const int stages = 1 + trial % 6, m = 1 + (trial * 7) % 12;
    std::vector<StageCosts> costs;
    for (int i = 0; i < stages; ++i)
      costs.push_back({next(), next(), next() * 0.5, i + 1 < stages ? next() * 0.2 : 0, i + 1 < stages ? next() * 0.2 : 0});
    std::vector<StageCosts> in_ms = costs;
    for (StageCosts& x : in_ms) x = {x.forward * 1e3, x.input_grad * 1e3, x.weight_grad * 1e3, x.send * 1e3, x.send_back * 1e3};
    for (const Schedule* s : All()) {
      if (s->chunked()) continue;  // schedule_chunks_test.cc
      INFO(s->name << ": S = " << stages << ", m = " << m << ", trial " << trial);
      const auto orders = Orders(*s, costs, m);
      REQUIRE(orders->size() == static_cast<size_t>(stages));
      CHECK(*orders == *Orders(*s, in_ms, m));
      CHECK(Makespan(*orders, costs, m) <= Makespan(*Orders(*s, stages, m), costs, m) + 1e-9);
      Programs p;
      for (int i = 0; i < stages; ++i) {
        const auto& ops = (*orders)[i];
        int f = 0, b = 0, w = 0;
        for (const Op& op : ops) {
          if (op.type == Op::kForward) CHECK(op.microbatch == f++);
          if (op.type == Op::kBackward || op.type == Op::kInputGrad) CHECK(op.microbatch == b++);
          if (op.type == Op::kBackward || op.type == Op::kWeightGrad) ++w;
        }
        CHECK((f == m && b == m && w == m));
        const int held_limit = s->name == "zb-h2" ? 2 * stages - 1 : stages;
        for (const Held& h : Peaks(ops)) {
          CHECK(h.activations <= std::min(stages - i, m));
          CHECK(h.activations + h.weight_inputs <= std::min(held_limit, m));
        }
        p.push_back(StageProgram(*s, costs, i, m));
        CHECK(p.back().size() == StageProgram(ops, i, stages).size());
      }
      CHECK(CheckRendezvous(p) == "");
    }
  }
}

}  // namespace
}  // namespace ob::schedule
