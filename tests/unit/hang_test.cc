// Hangs with nobody dead (hang_watch.h) and the fault that makes one
// (inject.h): who is named, when, and what --inject accepts; and a judge's
// own stalls, which are not its peers' silence (stall_grace.h).
#include <catch2/catch.hpp>

#include "ob/launch/master/hang_watch.h"
#include "ob/launch/worker/inject.h"
#include "ob/launch/wire/stall_grace.h"
#include "ob/metrics.pb.h"

using namespace ob::launch;
namespace pb = ob::pb;

namespace {

constexpr int kTraining = pb::PHASE_TRAINING;

// Four ranks that each completed steps 0..9, progress 10 per step.
HangWatch Trained(int64_t* now) {
  HangWatch h;
  h.Reset(4);
  for (int64_t s = 0; s < 10; ++s) {
    for (uint32_t r = 0; r < 4; ++r) h.Record(r, kTraining, static_cast<uint64_t>(10 * (s + 1)), false, s, *now);
    *now += 50;
  }
  return h;
}

std::vector<uint32_t> Ranks(const HangWatch::Verdict& v) {
  std::vector<uint32_t> out;
  for (const auto& n : v.ranks) out.push_back(n.rank);
  return out;
}

}  // namespace

TEST_CASE("a stalled rank that is not waiting is named, the ranks waiting for it are not") {
  int64_t now = 0;
  HangWatch h = Trained(&now);
  const int64_t stall = now - 50;  // rank 1's counter last moved then
  // Rank 1 stops in compute; the others go on a little, then wait for it.
  for (uint32_t r : {0u, 2u, 3u}) h.Record(r, kTraining, 103, true, -1, now + 20);
  for (int64_t t = now; t < stall + 2900; t += 500) {
    for (uint32_t r = 0; r < 4; ++r) h.Record(r, kTraining, r == 1 ? 100 : 103, r != 1, -1, t + 20);
    REQUIRE_FALSE(h.Check(t + 20));
  }
  // The others' counters last moved 70 ms after rank 1's: the generation
  // hangs when every rank has stopped for the 3 s deadline.
  REQUIRE_FALSE(h.Check(stall + 3069));
  REQUIRE(h.Check(stall + 3070, /*peek=*/true));  // a peek is not the verdict
  auto v = h.Check(stall + 3070);
  REQUIRE(v);
  CHECK(Ranks(*v) == std::vector<uint32_t>{1});
  CHECK(v->stalled_ms == 3070);
  CHECK(v->still_ms == 3000);  // since the others' last move: the real stall
  CHECK(v->ranks[0].deadline_ms == 3000);
  CHECK(v->ranks[0].why == "no progress for 3.1 s in step 10 (its counter at 100; deadline 3.0 s: --hang-timeout), "
                           "not waiting for a peer; ranks 0, 2, 3 wait");
  CHECK(v->ranks[0].step == 10);
  CHECK_FALSE(v->ranks[0].waiting);
  CHECK_FALSE(h.Check(stall + 4000));  // once per generation
  h.Reset(4);                          // a new generation is judged afresh
  CHECK_FALSE(h.Check(stall + 4000));
}

TEST_CASE("when every stopped rank waits, the one furthest behind is named") {
  int64_t now = 0;
  HangWatch h = Trained(&now);
  // Rank 2 completed one step less than the others; all wait.
  for (uint32_t r = 0; r < 4; ++r) h.Record(r, kTraining, r == 2 ? 95 : 105, true, r == 2 ? -1 : 10, now);
  auto v = h.Check(now + 3000);  // (the steps' 50 ms intervals: 4 x is under the floor)
  REQUIRE(v);
  CHECK(Ranks(*v) == std::vector<uint32_t>{2});
  CHECK(v->ranks[0].why.find("waiting for a peer like every stopped rank") != std::string::npos);
}

TEST_CASE("no hang while counters move, outside training, after an exit, or before the first step's bound") {
  int64_t now = 0;
  HangWatch h = Trained(&now);
  // Heartbeats only, but the counter moves (fine-grained progress in a long step).
  for (int i = 0; i < 20; ++i) {
    for (uint32_t r = 0; r < 4; ++r) h.Record(r, kTraining, static_cast<uint64_t>(200 + i), false, -1, now);
    now += 500;
    REQUIRE_FALSE(h.Check(now));
  }
  // Ranks that finished and exited, and ranks joining a group, are not judged.
  HangWatch g;
  g.Reset(2);
  g.Record(0, kTraining, 5, false, 0, 0);
  g.Exited(0);
  g.Record(1, pb::PHASE_JOINING, 0, false, -1, 0);
  CHECK_FALSE(g.Check(60000));
  // Before its first completed step a rank gets first_step_timeout_ms.
  HangWatch f(HangOptions{3000, 20000});
  f.Reset(1);
  f.Record(0, kTraining, 0, true, -1, 0);  // (waiting: computing alone would be a slowdown)
  CHECK_FALSE(f.Check(19999));
  auto v = f.Check(20000);
  REQUIRE(v);
  CHECK(Ranks(*v) == std::vector<uint32_t>{0});
}

TEST_CASE("slow is not dead: a rank whose counter moves keeps its waiting peers from a verdict") {
  int64_t now = 0;
  HangWatch h = Trained(&now);
  // Rank 3 is on a starved host: its counter moves once every 2.5 s; the
  // others wait for it, for 20 s. No verdict: they wait for a live peer.
  uint64_t slow = 100;
  h.Record(3, kTraining, ++slow, false, -1, now);
  for (int i = 0; i < 8; ++i) {
    for (int t = 0; t < 5; ++t) {
      for (uint32_t r = 0; r < 3; ++r) h.Record(r, kTraining, 105, true, -1, now);
      h.Record(3, kTraining, slow, false, -1, now);
      now += 500;
      REQUIRE_FALSE(h.Check(now));
    }
    h.Record(3, kTraining, ++slow, false, -1, now);
  }
  // Its intervals, 2.5 s, raised the deadline: 4 x that, 10 s, not 3.
  CHECK(h.Limit() == 10000);
  // Then it stops for good: found once every rank has stopped for 10 s.
  const int64_t stopped = now;
  for (; now < stopped + 9999; now += 500) {
    for (uint32_t r = 0; r < 4; ++r) h.Record(r, kTraining, r == 3 ? slow : 105, r != 3, -1, now);
    REQUIRE_FALSE(h.Check(now));
  }
  auto v = h.Check(stopped + 10000);
  REQUIRE(v);
  CHECK(Ranks(*v) == std::vector<uint32_t>{3});
  CHECK(v->ranks[0].deadline_ms == 10000);
  CHECK(v->ranks[0].why.find("deadline 10.0 s: 4 x the longest interval between counter moves seen in a step, 2.5 s")
        != std::string::npos);
}

TEST_CASE("a job-wide slowdown is no hang: every rank computing gets the deadline four times over") {
  int64_t now = 0;
  HangWatch h = Trained(&now);
  const int64_t moved = now - 50;  // every counter's last move (Trained)
  // Every rank in a long compute at once, none waiting for a peer.
  for (; now < moved + 11999; now += 500) {
    for (uint32_t r = 0; r < 4; ++r) h.Record(r, kTraining, 100, false, -1, now);
    REQUIRE_FALSE(h.Check(now));
  }
  REQUIRE_FALSE(h.Check(moved + 11999));
  // A single rank's stall with nobody to wait (one rank a generation) is
  // still found, at 4 x 3 s.
  auto v = h.Check(moved + 12000);
  REQUIRE(v);
  CHECK(v->ranks.size() == 4);
  CHECK(v->ranks[0].deadline_ms == 12000);
  CHECK(v->ranks[0].why.find("x4 with every rank computing") != std::string::npos);
}

TEST_CASE("the first step after a recovery has a deadline of its own, learnt from earlier recoveries") {
  HangWatch h(HangOptions{3000, 30000});
  h.Reset(1);
  h.Record(0, kTraining, 0, false, -1, 0);
  h.Record(0, kTraining, 1, false, 0, 12000, 12.0);  // a 12 s first step: the run's first
  CHECK(h.Deadline(false) == 48000);
  h.Reset(1, /*recovery=*/true);
  CHECK(h.Deadline(false) == 36000);  // 3 x the median step, 12 s; no recovery seen yet
  h.Record(0, kTraining, 1, false, -1, 100000);
  h.Record(0, kTraining, 2, false, 0, 120000, 0.5);  // 20 s to the first step after it
  h.Reset(1, /*recovery=*/true);
  CHECK(h.Deadline(false) == 80000);
  CHECK(h.Deadline(true) == 36000);
}

TEST_CASE("inject: stall parses, a malformed one is refused") {
  auto i = ParseInjection("1:stall=30;2:slow=1.5", 1);
  REQUIRE(i.ok());
  CHECK(i->stall_at == 30);
  CHECK(i->slow == 1);
  CHECK(i->any());
  auto other = ParseInjection("1:stall=30", 0);
  REQUIRE(other.ok());
  CHECK(other->stall_at == -1);
  CHECK_FALSE(other->any());
  auto held = ParseInjection("3:check=20;1:stall=30", 3);
  REQUIRE(held.ok());
  CHECK(held->check_at == 20);
  CHECK(held->stall_at == -1);
  CHECK(held->any());
  auto spun = ParseInjection("2:spin=10;2:park=5", 2);
  REQUIRE(spun.ok());
  CHECK(spun->slow == 10);
  CHECK(spun->spin);
  CHECK(spun->park_at == 5);
  auto slept = ParseInjection("2:slow=3", 2);
  REQUIRE(slept.ok());
  CHECK_FALSE(slept->spin);
  for (const char* bad : {"1:stall=-1", "1:stall=2.5", "1:stall=", "x:stall=3", "1:stal=3", "1:check=1.5",
                          "1:spin=0.5", "1:park=-2", "1:park=3@0", "1:park=3@", "1:park=3@2x", "1:park=@2"}) {
    INFO(bad);
    auto r = ParseInjection(bad, 1);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == ob::Code::kUsage);
  }
}

TEST_CASE("inject: an item applies in the first generation, or in the one its @GEN names") {
  // Before, every item applied in generation 1 only, so a test could not
  // hold a run after a recovery (a Slurm node failure, then Slurm's verdict).
  auto first = ParseInjection("0:park=30@2;0:nan=5", 0, 1);
  REQUIRE(first.ok());
  CHECK(first->park_at == -1);
  CHECK(first->nan_at == 5);
  auto second = ParseInjection("0:park=30@2;0:nan=5", 0, 2);
  REQUIRE(second.ok());
  CHECK(second->park_at == 30);
  CHECK(second->nan_at == -1);
  auto third = ParseInjection("0:park=30@2", 0, 3);
  REQUIRE(third.ok());
  CHECK_FALSE(third->any());
  auto slow = ParseInjection("1:slow=2@3", 1, 3);
  REQUIRE(slow.ok());
  CHECK(slow->slow == 2);
}

TEST_CASE("slow steps raise the bound to three median step times") {
  HangWatch h;
  h.Reset(1);
  // 2 s steps, the counter moving every 0.5 s (4 x that is under 3 s).
  for (int64_t s = 0; s < 10; ++s) {
    for (int64_t q = 1; q <= 4; ++q) {
      h.Record(0, kTraining, static_cast<uint64_t>(4 * s + q), true, q == 4 ? s : -1, s * 2000 + q * 500,
               q == 4 ? 2.0 : 0);
    }
  }
  CHECK(h.Limit() == 6000);
  CHECK_FALSE(h.Check(20000 + 5999));  // the last step's record came at 20 s
  CHECK(h.Check(20000 + 6000));
  HangWatch fast;
  fast.Reset(1);
  fast.Record(0, kTraining, 1, false, 0, 0, 0.05);
  CHECK(fast.Limit() == 3000);
}

TEST_CASE("after a stall of its own, a judge hears its peers out before it judges their silence") {
  constexpr int64_t kTick = 50;
  StallGrace g;
  int64_t now = 1000;
  for (int i = 0; i < 40; ++i, now += kTick) {  // 2 s of steady running
    CHECK(g.Tick(now) == 0);
    CHECK(g.MayJudge(now));
  }
  // Ticks a little late are no stall.
  now += StallGrace::kStallMs - kTick - 1;
  CHECK(g.Tick(now) == 0);
  CHECK(g.MayJudge(now));
  // Stopped for 4 s: the stall is its length, and judging waits kGraceMs.
  const int64_t before = now;
  now += 4000;
  CHECK(g.Tick(now) == 4000);
  const int64_t woke = now;
  for (; now < woke + StallGrace::kGraceMs; now += kTick) {
    CHECK_FALSE(g.MayJudge(now));
    CHECK(g.Tick(now + kTick) == 0);
  }
  CHECK(g.MayJudge(now));
  CHECK(now - before > 4000);
}

TEST_CASE("a judge starved for good gets no grace: a dead peer is still found") {
  StallGrace g;
  int64_t now = 0;
  for (int i = 0; i < 40; ++i) g.Tick(now += 50);  // steady
  // The first stall after steady running is heard out ...
  CHECK(g.Tick(now += 700) == 700);
  CHECK_FALSE(g.MayJudge(now));
  CHECK(g.Tick(now += 700) == 700);
  CHECK_FALSE(g.MayJudge(now));  // (700 ms into its kGraceMs)
  // ... but a judge that runs only every 700 ms from then on judges at each
  // tick past that grace: its stalls follow each other, none comes after
  // steady running.
  for (int i = 0; i < 10; ++i) {
    CHECK(g.Tick(now += 700) == 700);
    CHECK(g.MayJudge(now));
  }
  // Steady again for kSteadyMs: the next stall is heard out again.
  for (int64_t t = 0; t <= StallGrace::kSteadyMs; t += 50) g.Tick(now += 50);
  CHECK(g.Tick(now += 2000) == 2000);
  CHECK_FALSE(g.MayJudge(now));
}

TEST_CASE("the first tick is no stall, however late it comes") {
  StallGrace g;
  CHECK(g.Tick(1000000) == 0);
  CHECK(g.MayJudge(1000000));
}
