// Schedules with chunks (schedule.h, Chain): interleaved 1F1B and ZB-V.
// Each chunk's ops run once and in order within the schedule's memory, the
// stage programs exchange exactly the messages of the chain's boundaries
// that cross stages and cannot deadlock on rendezvous channels (S <= 8,
// v <= 4, m <= 16), and the times at equal op costs are the published
// ones: interleaved 1F1B's fill (S − 1)(F + B + W)/v (Narayanan et al.),
// ZB-V's below a single-chunk zero-bubble schedule's.
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

bool IsBackward(const Op& op) { return op.type == Op::kBackward || op.type == Op::kInputGrad; }

std::vector<const Schedule*> Chunked() {
  std::vector<const Schedule*> out;
  for (const Schedule* s : All())
    if (s->chunked()) out.push_back(s);
  return out;
}

std::vector<int> ChunkCounts(const Schedule& s) {
  std::vector<int> out;
  for (int v = s.min_chunks; v <= std::min(s.max_chunks, 4); ++v) out.push_back(v);
  return out;
}

TEST_CASE("a chain's virtual stages: interleaved loops through the stages, a V goes down and back", "[schedule]") {
  const Chain loop{3, 2, Placement::kLoop}, vee{3, 2, Placement::kVee};
  CHECK(loop.size() == 6);
  for (int k = 0; k < 6; ++k) {
    CHECK(loop.StageOf(k) == k % 3);
    CHECK(loop.At(loop.StageOf(k), loop.ChunkOf(k)) == k);
    CHECK(vee.At(vee.StageOf(k), vee.ChunkOf(k)) == k);
    if (k + 1 < 6) CHECK_FALSE(loop.Local(k));
  }
  // V: 0 1 2 down, 3 4 5 back up on stages 2 1 0.
  CHECK(vee.StageOf(3) == 2);
  CHECK(vee.StageOf(5) == 0);
  CHECK(vee.Local(2));  // the turn
  for (int k : {0, 1, 3, 4}) CHECK_FALSE(vee.Local(k));
  CHECK(Chain{1, 3, Placement::kLoop}.Local(0));  // one stage: everything local
}

TEST_CASE("every chunked order runs each chunk's ops once, in order, within its schedule's memory",
          "[schedule]") {
  for (const Schedule* s : Chunked()) {
    for (int v : ChunkCounts(*s)) {
      for (int stages = 1; stages <= 8; ++stages) {
        const Chain chain = s->ChainOf(stages, v);
        for (int m = 1; m <= 16; ++m) {
          for (int i = 0; i < stages; ++i) {
            INFO(s->name << ": S = " << stages << ", v = " << v << ", m = " << m << ", stage " << i);
            const auto ops = Order(*s, i, stages, m, v);
            INFO(Describe(ops));
            std::vector<int> f(v), b(v), w(v);
            std::vector<int> held(v);  // after F, before B: per chunk
            int most_held = 0, most_total = 0;
            for (const Op& op : ops) {
              REQUIRE(op.chunk >= 0);
              REQUIRE(op.chunk < v);
              const int c = op.chunk;
              switch (op.type) {
                case Op::kForward: CHECK(op.microbatch == f[c]++); ++held[c]; break;
                case Op::kBackward: CHECK_FALSE(s->splits_backward); CHECK(op.microbatch == b[c]++); ++w[c], --held[c]; break;
                case Op::kInputGrad: CHECK(s->splits_backward); CHECK(op.microbatch == b[c]++); --held[c]; break;
                case Op::kWeightGrad: CHECK(op.microbatch == w[c]++); break;
              }
              CHECK(b[c] <= f[c]);
              CHECK(w[c] <= b[c]);
              const int k = chain.At(i, c);
              if (s->splits_backward) {
                // ZB-V: virtual stage k holds at most 2S − k before B and W.
                CHECK(f[c] - w[c] <= chain.size() - k);
              }
              most_held = std::max(most_held, held[c]);
              int total = 0;
              for (int x = 0; x < v; ++x) total += f[x] - w[x];
              most_total = std::max(most_total, total);
            }
            for (int c = 0; c < v; ++c) CHECK((f[c] == m && b[c] == m && w[c] == m));
            if (!s->splits_backward) {
              // Interleaved: Megatron's order holds at most its warm-up + 1
              // chunk-micro-batches; the list-scheduled one (m > S, not a
              // multiple) V − k on each virtual stage k.
              int limit = (stages - i - 1) * 2 + (v - 1) * stages + 1;
              if (m > stages && m % stages != 0) {
                limit = 0;
                for (int c = 0; c < v; ++c) limit += chain.size() - chain.At(i, c);
              }
              CHECK(most_total <= std::min(limit, m * v));
            } else {
              // ZB-V: 2S + 1 halves at most, about 1F1B's first stage.
              CHECK(most_total <= std::min(2 * stages + 1, m * v));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("chunked stage programs exchange the chain's messages and never deadlock, S <= 8, m <= 16",
          "[schedule]") {
  for (const Schedule* sch : Chunked()) {
    for (int v : ChunkCounts(*sch)) {
      for (int stages = 1; stages <= 8; ++stages) {
        const Chain chain = sch->ChainOf(stages, v);
        const int V = chain.size();
        for (int m = 1; m <= 16; ++m) {
          INFO(sch->name << ": S = " << stages << ", v = " << v << ", m = " << m);
          std::vector<std::vector<StageInstr>> programs;
          for (int s = 0; s < stages; ++s) {
            INFO("stage " << s);
            programs.push_back(StageProgram(*sch, s, stages, m, v));
            const auto ops = Order(*sch, s, stages, m, v);
            // Per (virtual stage, micro-batch): messages and computes seen.
            std::vector<int> got_input(V * m), got_grad(V * m), sent_act(V * m), sent_grad(V * m);
            std::vector<bool> forward_done(V * m), backward_done(V * m);
            size_t next_op = 0;
            for (const StageInstr& in : programs.back()) {
              if (in.kind == StageInstr::kComm) {
                REQUIRE(!in.comm.empty());
                for (const P2p& p : in.comm) {
                  REQUIRE((p.microbatch >= 0 && p.microbatch < m && p.link >= 0 && p.link + 1 < V));
                  CHECK_FALSE(chain.Local(p.link));
                  // The end of the link on this stage, and the other one.
                  const int mine = p.activation == p.send ? p.link : p.link + 1;
                  const int theirs = mine == p.link ? p.link + 1 : p.link;
                  REQUIRE(chain.StageOf(mine) == s);
                  CHECK(p.peer == chain.StageOf(theirs));
                  const int at = mine * m + p.microbatch;
                  if (p.send) CHECK((p.activation ? forward_done[at] : backward_done[at]));
                  ++(p.activation ? (p.send ? sent_act : got_input) : (p.send ? sent_grad : got_grad))[at];
                }
                continue;
              }
              REQUIRE(next_op < ops.size());
              CHECK(ops[next_op] == in.op);
              ++next_op;
              const int k = chain.At(s, in.op.chunk), at = k * m + in.op.microbatch;
              if (in.op.type == Op::kForward) {
                if (k > 0 && !chain.Local(k - 1)) CHECK(got_input[at] == 1);
                forward_done[at] = true;
              } else if (IsBackward(in.op)) {
                CHECK(forward_done[at]);
                if (k + 1 < V && !chain.Local(k)) CHECK(got_grad[at] == 1);
                backward_done[at] = true;
              } else {
                CHECK(backward_done[at]);
              }
            }
            CHECK(next_op == ops.size());
            for (int c = 0; c < v; ++c) {
              const int k = chain.At(s, c);
              const bool from = k > 0 && !chain.Local(k - 1), to = k + 1 < V && !chain.Local(k);
              for (int j = 0; j < m; ++j) {
                const int at = k * m + j;
                CHECK(got_input[at] == (from ? 1 : 0));
                CHECK(sent_grad[at] == (from ? 1 : 0));
                CHECK(sent_act[at] == (to ? 1 : 0));
                CHECK(got_grad[at] == (to ? 1 : 0));
              }
            }
          }
          CHECK(CheckRendezvous(programs) == "");
        }
      }
    }
  }
}

std::vector<StageCosts> Equal(int n, double f, double b, double w) {
  return std::vector<StageCosts>(static_cast<size_t>(n), StageCosts{f, b, w, 0, 0});
}

TEST_CASE("at equal op costs, interleaved 1F1B idles (S - 1)(F + B + W)/v, ZB-V less than ZB-H2",
          "[schedule]") {
  const Schedule& il = *Find("interleaved");
  const Schedule& zbv = *Find("zb-v");
  for (int stages = 2; stages <= 8; ++stages) {
    for (int m = stages; m <= 24; m += stages) {
      for (int v = 2; v <= 4; ++v) {
        INFO("S = " << stages << ", m = " << m << ", v = " << v);
        // A chunk costs 1/v of the stage: F = 1, B = W = 1 a stage.
        const double c = 1.0 / v;
        const double t = Makespan(il, Equal(stages * v, c, c, c), m, v);
        CHECK(t == Approx(3.0 * m + 3.0 * (stages - 1) / v));
      }
      INFO("S = " << stages << ", m = " << m);
      const double h2 = Makespan(*Find("zb-h2"), Equal(stages, 1, 1, 1), m);
      const double v2 = Makespan(zbv, Equal(2 * stages, 0.5, 0.5, 0.5), m, 2);
      CHECK(v2 >= 3.0 * m);
      CHECK(v2 <= h2);
      // The fill about halved: (S − 1)·F/2, within two chunk-ops.
      if (m >= 2 * stages) CHECK(v2 <= 3.0 * m + 0.5 * (stages - 1) + 1.0 + 1e-9);
    }
  }
}

TEST_CASE("a transfer between chunks of one stage is free, between stages it is paid", "[schedule]") {
  // ZB-V, S = 2: the turn (virtual 1 → 2, both on stage 1) costs nothing
  // even when its costs say 5.
  std::vector<StageCosts> c = Equal(4, 1, 1, 1);
  const double base = Makespan(*Find("zb-v"), c, 4, 2);
  c[1].send = c[1].send_back = 5;
  CHECK(Makespan(*Orders(*Find("zb-v"), 2, 4, 2), c, 4, Placement::kVee) == Approx(base));
  c[0].send = 0.5;
  CHECK(Makespan(*Orders(*Find("zb-v"), 2, 4, 2), c, 4, Placement::kVee) > base);
}

TEST_CASE("ZB-V orders made for a pipeline's own costs: valid, deadlock-free, never slower than unit",
          "[schedule]") {
  const Schedule& zbv = *Find("zb-v");
  uint64_t seed = 777;
  auto next = [&] {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return 0.05 + static_cast<double>(seed >> 40) / static_cast<double>(1ULL << 24);
  };
  for (int trial = 0; trial < 60; ++trial) {
    const int stages = 1 + trial % 6, m = 1 + (trial * 7) % 12;
    std::vector<StageCosts> costs;
    for (int k = 0; k < 2 * stages; ++k)
      costs.push_back({next(), next(), next() * 0.5, next() * 0.2, next() * 0.2});
    INFO("S = " << stages << ", m = " << m << ", trial " << trial);
    const auto orders = Orders(zbv, costs, m, 2);
    REQUIRE(orders->size() == static_cast<size_t>(stages));
    CHECK(Makespan(*orders, costs, m, Placement::kVee) <=
          Makespan(*Orders(zbv, stages, m, 2), costs, m, Placement::kVee) + 1e-9);
    for (int i = 0; i < stages; ++i) {
      int n = 0;
      for (const Op& op : (*orders)[i]) n += op.type == Op::kForward;
      CHECK(n == 2 * m);
    }
    CHECK(CheckRendezvous(Programs(*orders, zbv.ChainOf(stages, 2))) == "");
  }
}

TEST_CASE("PeakBytes weighs each chunk by its own size", "[schedule]") {
  const std::vector<Op> ops{{Op::kForward, 0, 0}, {Op::kForward, 0, 1}, {Op::kInputGrad, 0, 1},
                            {Op::kInputGrad, 0, 0}, {Op::kWeightGrad, 0, 1}, {Op::kWeightGrad, 0, 0}};
  // F0.0 100, F0.1 +30 = 130, B0.1 -30 +7 = 107, B0.0 -100 +20 = 27 ...
  CHECK(PeakBytes(ops, {100, 30}, {20, 7}) == 130);
  CHECK(PeakBytes(ops, {10, 30}, {200, 7}) == 207);
}

}  // namespace
}  // namespace ob::schedule
