// ob-watch's detectors, outputs and actions, on synthetic streams with
// known faults (lib/ob/watch/synthetic.h) and on hand-made records.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <thread>

#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>

#include "ob/watch/actions.h"
#include "ob/watch/events.h"
#include "ob/watch/plot.h"
#include "ob/watch/prometheus.h"
#include "ob/watch/stats.h"
#include "ob/watch/synthetic.h"
#include "ob/watch/watcher.h"

using namespace ob::watch;
using ob::pb::Event;
using ob::pb::Metrics;

namespace {

std::vector<Event> Watch(const std::vector<Metrics>& records, const DetectorOptions& o = {},
                         Watcher* keep = nullptr) {
  Watcher local(o, Clock::kStream);
  Watcher& w = keep ? *keep : local;
  std::vector<Event> out;
  for (const auto& m : records) w.Feed(m, 0, &out);
  w.Finish(&out);
  return out;
}

std::vector<Event> OfKind(const std::vector<Event>& events, ob::pb::EventKind kind) {
  std::vector<Event> out;
  for (const auto& e : events)
    if (e.kind() == kind) out.push_back(e);
  return out;
}

SyntheticRun Run(uint64_t seed, uint64_t steps = 200) {
  SyntheticRun r;
  r.seed = seed;
  r.steps = steps;
  return r;
}

SyntheticFault Fault(SyntheticFault::Kind kind, int rank, uint64_t step, double value = 1) {
  SyntheticFault f;
  f.kind = kind;
  f.rank = rank;
  f.step = step;
  f.value = value;
  return f;
}

}  // namespace

TEST_CASE("robust statistics: median and MAD and windows and k-of-n votes") {
  CHECK(Median({}) == 0);
  CHECK(Median({3, 1, 2}) == 2);
  CHECK(Median({4, 1, 3, 2}) == 2.5);
  CHECK(Mad({1, 2, 3, 4, 100}, 3) == 1);
  Window w(3);
  for (double v : {1, 2, 3, 4}) w.Push(v);
  CHECK(w.values() == std::vector<double>{2, 3, 4});
  CHECK(w.full());
  KOfN vote(2, 3);
  vote.Push(true);
  CHECK_FALSE(vote.Confirmed());
  vote.Push(false);
  vote.Push(true);
  CHECK(vote.Confirmed());
  vote.Push(false);  // the first true falls out
  CHECK_FALSE(vote.Confirmed());
}

TEST_CASE("straggler: a 1.5x slower rank among 2x2 pipelines is flagged within 20 steps on its host") {
  // 24 runs: every rank of the four, six seeds each, ±10% noise and hiccups.
  for (int rank = 0; rank < 4; ++rank) {
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      SyntheticRun run = Run(seed * 7 + static_cast<uint64_t>(rank), 120);
      const uint64_t onset = 40;
      run.faults.push_back(Fault(SyntheticFault::kSlow, rank, onset, 1.5));
      const auto events = OfKind(Watch(Synthesize(run)), ob::pb::EVENT_STRAGGLER);
      INFO("rank " << rank << " seed " << run.seed);
      REQUIRE_FALSE(events.empty());
      CHECK(events[0].rank() == rank);
      CHECK(events[0].host() == SyntheticHost(rank));
      CHECK(events[0].step() >= onset);
      CHECK(events[0].step() < onset + 20);
      CHECK(events[0].evidence().at("basis") == 0);  // against its replica
      CHECK(events[0].evidence().at("ratio") > 1.2);
      for (const auto& e : events) CHECK(e.rank() == rank);  // nobody else
    }
  }
}

TEST_CASE("straggler: 500 clean steps with seeded noise raise no event") {
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    INFO("seed " << seed);
    const auto events = Watch(Synthesize(Run(seed, 500)));
    CHECK(OfKind(events, ob::pb::EVENT_STRAGGLER).empty());
    CHECK(events.empty());  // nor anything else
  }
}

// More workers than cores (issue 10: the quick-start's 4 workers on 2
// cores raised 32 straggler events): at every step two of the four replicas
// are descheduled, 1.4x slower, and which two changes every 15-60 steps.
SyntheticRun Contended(uint64_t seed, uint64_t steps) {
  SyntheticRun run = Run(seed, steps);
  run.pipelines = 4;
  run.stages = 1;
  std::mt19937_64 rng(seed);
  const int pairs[6][2] = {{0, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3}, {2, 3}};
  for (uint64_t at = 0; at < steps;) {
    const uint64_t until = at + 15 + rng() % 46;
    for (int r : pairs[rng() % 6]) {
      SyntheticFault f = Fault(SyntheticFault::kSlow, r, at, 1.4);
      f.until = until;
      run.faults.push_back(f);
    }
    at = until;
  }
  return run;
}

TEST_CASE("straggler: contention that moves from rank to rank is not a straggler, a real one in it is") {
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    INFO("seed " << seed);
    const auto events = OfKind(Watch(Synthesize(Contended(seed, 500))), ob::pb::EVENT_STRAGGLER);
    CHECK(events.empty());
    // The same contention and rank 2 1.6x slower from step 200 on.
    SyntheticRun run = Contended(seed, 300);
    run.faults.push_back(Fault(SyntheticFault::kSlow, 2, 200, 1.6));
    const auto found = OfKind(Watch(Synthesize(run)), ob::pb::EVENT_STRAGGLER);
    std::string seen;
    for (const auto& e : found) seen += " rank " + std::to_string(e.rank()) + "@" + std::to_string(e.step());
    INFO("events:" << seen);
    // Found in time, and only it often enough for ob-watch --act (three
    // events of a host, --confirm) to exclude a host: a contended rank may
    // be named once alongside it while the job is held up.
    std::map<int, int> per_rank;
    uint64_t first = 0;
    for (const auto& e : found) {
      if (e.rank() == 2 && per_rank[2] == 0) first = e.step();
      per_rank[static_cast<int>(e.rank())]++;
    }
    CHECK(per_rank[2] >= 3);
    CHECK(first >= 200);
    CHECK(first < 260);  // in contention it shows only while it is also descheduled
    for (const auto& [rank, n] : per_rank) {
      if (rank != 2) CHECK(n < 3);
    }
  }
}

TEST_CASE("straggler: a persisting straggler is re-reported with growing spacing") {
  SyntheticRun run = Run(3, 400);
  run.faults.push_back(Fault(SyntheticFault::kSlow, 2, 20, 2.0));
  const auto events = OfKind(Watch(Synthesize(run)), ob::pb::EVENT_STRAGGLER);
  REQUIRE(events.size() >= 4);
  CHECK(events.size() <= 12);
  for (size_t i = 2; i + 1 < events.size(); ++i)
    CHECK(events[i + 1].step() - events[i].step() >= events[i].step() - events[i - 1].step());
}

TEST_CASE("straggler: without replicas, per-layer compute against all ranks") {
  SyntheticRun run = Run(5, 100);
  run.pipelines = 1;
  run.stages = 4;  // 8 layers, 2 per stage: no replicas
  run.faults.push_back(Fault(SyntheticFault::kSlow, 1, 30, 1.6));
  auto events = OfKind(Watch(Synthesize(run)), ob::pb::EVENT_STRAGGLER);
  REQUIRE_FALSE(events.empty());
  CHECK(events[0].rank() == 1);
  CHECK(events[0].evidence().at("basis") == 1);
  CHECK(events[0].step() < 50);

  // A stream without layer ranges: raw compute against all ranks.
  auto records = Synthesize(run);
  for (auto& m : records) {
    m.clear_first_layer();
    m.clear_last_layer();
  }
  events = OfKind(Watch(records), ob::pb::EVENT_STRAGGLER);
  REQUIRE_FALSE(events.empty());
  CHECK(events[0].rank() == 1);
  CHECK(events[0].evidence().at("basis") == 2);
}

TEST_CASE("straggler: compute is compared per micro-batch") {
  // Pipeline 1 runs 1.5x the micro-batches and takes 1.5x the time: fair.
  auto records = Synthesize(Run(11, 200));
  for (auto& m : records) {
    if (m.heartbeat() || m.pipeline() != 1) continue;
    m.set_num_microbatches(6);
    m.set_forward_seconds(m.forward_seconds() * 1.5);
    m.set_backward_seconds(m.backward_seconds() * 1.5);
  }
  CHECK(OfKind(Watch(records), ob::pb::EVENT_STRAGGLER).empty());
}

TEST_CASE("loss: NaN at step k is an EVENT_LOSS_NAN at step k once per episode") {
  SyntheticRun run = Run(2, 120);
  SyntheticFault f = Fault(SyntheticFault::kNan, 0, 57);
  f.until = 70;
  run.faults.push_back(f);
  SyntheticFault g = Fault(SyntheticFault::kNan, 0, 90);
  g.until = 91;
  run.faults.push_back(g);
  const auto events = OfKind(Watch(Synthesize(run)), ob::pb::EVENT_LOSS_NAN);
  REQUIRE(events.size() == 2);
  CHECK(events[0].step() == 57);
  CHECK(events[0].severity() == ob::pb::SEVERITY_CRITICAL);
  CHECK(std::isnan(events[0].evidence().at("loss")));
  CHECK(events[1].step() == 90);

  SyntheticRun first = Run(2, 20);
  first.faults.push_back(Fault(SyntheticFault::kNan, 0, 0));
  const auto at0 = OfKind(Watch(Synthesize(first)), ob::pb::EVENT_LOSS_NAN);
  REQUIRE(at0.size() == 1);
  CHECK(at0[0].step() == 0);
}

TEST_CASE("loss: a stream with the loss on the last stage only (NaN elsewhere) is not a NaN") {
  SyntheticRun run = Run(4, 80);
  run.faults.push_back(Fault(SyntheticFault::kNan, 0, 50));  // a real one from step 50
  auto records = Synthesize(run);
  for (auto& m : records)
    if (!m.heartbeat() && m.stage() == 0) m.set_loss(std::nan(""));
  const auto events = OfKind(Watch(records), ob::pb::EVENT_LOSS_NAN);
  REQUIRE(events.size() == 1);
  CHECK(events[0].step() == 50);
}

// ob-launch --steps 0 --resume evaluates a checkpoint and trains nothing:
// each rank sends one record, its loss NaN, its eval_loss set. Before
// 2026-12-02 ob-watch read it as a diverged run (a critical loss_nan, "loss
// is NaN at step 9", and an --act would have asked for a rollback).
TEST_CASE("loss: the records of a run that only evaluates are no NaN loss") {
  std::vector<Metrics> records;
  for (uint32_t rank = 0; rank < 4; ++rank) {
    Metrics m;
    m.set_host("h" + std::to_string(rank + 1));
    m.set_rank(rank);
    m.set_generation(1);
    m.set_step(9);
    m.set_unix_ms(1000 + rank);
    m.set_loss(std::nan(""));
    m.set_eval_loss(4.422);
    m.set_evaluation_only(true);
    records.push_back(m);
  }
  for (uint32_t rank = 0; rank < 4; ++rank) {  // then each worker exits 0
    Metrics x = records[rank];
    x.clear_loss();
    x.clear_eval_loss();
    x.clear_evaluation_only();
    x.set_unix_ms(1010 + rank);
    x.mutable_exit()->set_exit_status(0);
    x.mutable_exit()->set_description("exit status 0");
    records.push_back(x);
  }
  const auto events = Watch(records);
  INFO((events.empty() ? std::string() : events[0].message()));
  CHECK(events.empty());
  // The same records of a trained step are a NaN loss.
  for (auto& m : records) m.clear_evaluation_only();
  CHECK(OfKind(Watch(records), ob::pb::EVENT_LOSS_NAN).size() == 1);
}

TEST_CASE("loss: a spike is flagged at its step and a falling loss never is") {
  SyntheticRun run = Run(6, 150);
  run.faults.push_back(Fault(SyntheticFault::kSpike, 0, 100, 1.5));
  const auto events = Watch(Synthesize(run));
  const auto spikes = OfKind(events, ob::pb::EVENT_LOSS_SPIKE);
  REQUIRE(spikes.size() == 1);
  CHECK(spikes[0].step() == 100);
  CHECK(spikes[0].evidence().at("z") >= 6);
  CHECK(events.size() == 1);
}

TEST_CASE("hang: a rank whose records stop is named with its host within the timeout") {
  SyntheticRun run = Run(8, 200);
  run.faults.push_back(Fault(SyntheticFault::kStop, 2, 60));
  const auto records = Synthesize(run);
  int64_t last_ms = 0;
  for (const auto& m : records)
    if (m.rank() == 2) last_ms = m.unix_ms();
  const auto events = Watch(records);
  const auto hangs = OfKind(events, ob::pb::EVENT_HANG);
  REQUIRE(hangs.size() >= 1);
  CHECK(hangs[0].rank() == 2);
  CHECK(hangs[0].host() == SyntheticHost(2));
  CHECK(hangs[0].step() == 59);
  CHECK(hangs[0].unix_ms() - last_ms >= 3000);
  CHECK(hangs[0].unix_ms() - last_ms <= 5000);
  CHECK(hangs[0].message().find("node3 rank 2") != std::string::npos);
  // The blocked peers keep beating: the only rank named is the stopped one.
  for (const auto& e : hangs) CHECK((e.rank() == 2 || e.rank() == -1));
}

TEST_CASE("hang: with the wall clock, silence between records is found by Tick") {
  Watcher w({}, Clock::kWall);
  std::vector<Event> out;
  Metrics m;
  m.set_host("a");
  m.set_rank(0);
  m.set_generation(1);
  m.set_heartbeat(true);
  w.Feed(m, 1000, &out);
  m.set_host("b");
  m.set_rank(1);
  w.Feed(m, 1000, &out);
  w.Tick(3900, &out);
  CHECK(out.empty());
  m.set_rank(1);
  w.Feed(m, 4000, &out);  // b beats, a does not
  w.Tick(4100, &out);
  REQUIRE(out.size() == 1);
  CHECK(out[0].kind() == ob::pb::EVENT_HANG);
  CHECK(out[0].host() == "a");
  CHECK(out[0].rank() == 0);
  w.Tick(9000, &out);
  CHECK(OfKind(out, ob::pb::EVENT_HANG).size() == 2);  // b now too; a not twice
}

TEST_CASE("crash and recovery: an error exit then a new generation without its pipeline") {
  SyntheticRun run = Run(9, 120);
  run.faults.push_back(Fault(SyntheticFault::kCrash, 3, 50));
  const auto events = Watch(Synthesize(run));
  REQUIRE(events.size() == 2);  // no hang, no straggler, no drop from the gap
  CHECK(events[0].kind() == ob::pb::EVENT_CRASH);
  CHECK(events[0].host() == "node4");
  CHECK(events[0].rank() == 3);
  CHECK(events[0].evidence().at("signal") == 9);
  CHECK(events[1].kind() == ob::pb::EVENT_RECOVERY);
  CHECK(events[1].generation() == 2);
  CHECK(events[1].evidence().at("ranks") == 2);
  CHECK(events[1].evidence().at("previous_ranks") == 4);
  CHECK(events[1].evidence().at("gap_seconds") == Approx(1.5).margin(0.5));
  CHECK(events[1].message().find("gone: node3,node4") != std::string::npos);
}

TEST_CASE("crash: a clean exit is not a crash and a slow recovery is not a hang") {
  Watcher w({}, Clock::kStream);
  std::vector<Event> out;
  auto beat = [&](uint32_t rank, int64_t ms, uint64_t gen) {
    Metrics m;
    m.set_host("h" + std::to_string(rank));
    m.set_rank(rank);
    m.set_generation(gen);
    m.set_unix_ms(ms);
    m.set_heartbeat(true);
    w.Feed(m, 0, &out);
  };
  beat(0, 1000, 1);
  beat(1, 1000, 1);
  Metrics x;
  x.set_host("h0");
  x.set_rank(0);
  x.set_generation(1);
  x.set_unix_ms(1100);
  x.mutable_exit()->set_exit_status(0);
  w.Feed(x, 0, &out);
  CHECK(out.empty());
  x.set_rank(1);
  x.set_host("h1");
  x.mutable_exit()->set_exit_status(3);
  x.mutable_exit()->set_description("exit status 3");
  w.Feed(x, 0, &out);
  REQUIRE(out.size() == 1);
  CHECK(out[0].kind() == ob::pb::EVENT_CRASH);
  CHECK(out[0].message().find("exit status 3") != std::string::npos);
  beat(5, 8000, 2);  // a new generation 7 s later: a slow recovery, no hang
  beat(5, 9000, 2);
  CHECK(out.size() == 1);
}

TEST_CASE("crash: a peer failing after the first failure is secondary") {
  Watcher w({}, Clock::kStream);
  std::vector<Event> out;
  Metrics m;
  m.set_generation(1);
  for (uint32_t rank = 0; rank < 3; ++rank) {
    m.set_host("h" + std::to_string(rank));
    m.set_rank(rank);
    m.set_unix_ms(1000);
    m.set_heartbeat(true);
    w.Feed(m, 0, &out);
  }
  m.set_rank(0);
  m.set_host("h0");
  m.set_unix_ms(2000);
  m.mutable_exit()->set_signal(9);
  m.set_heartbeat(false);
  w.Feed(m, 0, &out);
  m.set_rank(1);
  m.set_host("h1");
  m.set_unix_ms(2300);
  m.mutable_exit()->set_signal(0);
  m.mutable_exit()->set_exit_status(69);
  w.Feed(m, 0, &out);
  REQUIRE(out.size() == 2);
  CHECK(out[0].severity() == ob::pb::SEVERITY_CRITICAL);
  CHECK(out[0].evidence().at("secondary") == 0);
  CHECK(out[1].severity() == ob::pb::SEVERITY_WARNING);
  CHECK(out[1].evidence().at("secondary") == 1);
  CHECK(out[1].evidence().at("host_crash_generations") == 0);
  CHECK(out[1].message().find("after h0 rank 0 crashed: a consequence") != std::string::npos);
}

TEST_CASE("throughput and memory: a job-wide slowdown is a drop and a leak is growth") {
  SyntheticRun run = Run(12, 200);
  SyntheticFault slow = Fault(SyntheticFault::kSlowJob, 0, 100, 1.6);
  run.faults.push_back(slow);
  auto events = Watch(Synthesize(run));
  auto drops = OfKind(events, ob::pb::EVENT_THROUGHPUT_DROP);
  REQUIRE(drops.size() == 1);
  CHECK(drops[0].step() >= 100);
  CHECK(drops[0].step() < 110);
  CHECK(drops[0].rank() == -1);
  CHECK(OfKind(events, ob::pb::EVENT_STRAGGLER).empty());  // everyone is slower

  SyntheticRun leak = Run(13, 250);
  leak.faults.push_back(Fault(SyntheticFault::kLeak, 1, 20, 5e6));
  events = Watch(Synthesize(leak));
  auto growth = OfKind(events, ob::pb::EVENT_MEMORY_GROWTH);
  REQUIRE_FALSE(growth.empty());
  CHECK(growth[0].rank() == 1);
  CHECK(growth[0].host() == "node2");
  CHECK(growth[0].evidence().at("growth") >= 0.1);
  CHECK(events.size() == growth.size());
}

TEST_CASE("the same stream always gives the same event bytes") {
  SyntheticRun run = Run(14, 150);
  run.faults.push_back(Fault(SyntheticFault::kSlow, 1, 20, 1.7));
  run.faults.push_back(Fault(SyntheticFault::kSpike, 0, 90, 1.6));
  run.faults.push_back(Fault(SyntheticFault::kCrash, 3, 120));
  const auto records = Synthesize(run);
  std::string a, b, ja, jb;
  for (const auto& e : Watch(records)) {
    AppendEventRecord(e, &a);
    ja += EventJson(e) + "\n";
  }
  for (const auto& e : Watch(Synthesize(run))) {
    AppendEventRecord(e, &b);
    jb += EventJson(e) + "\n";
  }
  CHECK(!a.empty());
  CHECK(a == b);
  CHECK(ja == jb);
}

TEST_CASE("EventJson is protobuf's JSON mapping and reads back equal") {
  Event e = MakeEvent(ob::pb::EVENT_LOSS_NAN, ob::pb::SEVERITY_CRITICAL, "h\"1", 3, 1234567890123ull,
                      2, 1700000000123, "loss is NaN\tat step 5");
  (*e.mutable_evidence())["loss"] = std::nan("");
  (*e.mutable_evidence())["inf"] = -INFINITY;
  (*e.mutable_evidence())["z"] = 0.1;
  (*e.mutable_evidence())["a"] = 1e-300;
  e.set_request("rollback x");
  const std::string json = EventJson(e);
  CHECK(json.find('\n') == std::string::npos);
  CHECK(json.find("\"kind\":\"EVENT_LOSS_NAN\"") != std::string::npos);
  CHECK(json.find("\"a\":1e-300,\"inf\":\"-Infinity\",\"loss\":\"NaN\",\"z\":0.1") != std::string::npos);
  Event back;
  REQUIRE(google::protobuf::util::JsonStringToMessage(json, &back).ok());
  CHECK(back.host() == e.host());
  CHECK(back.step() == e.step());
  CHECK(back.message() == e.message());
  CHECK(std::isnan(back.evidence().at("loss")));
  back.mutable_evidence()->erase("loss");
  e.mutable_evidence()->erase("loss");
  CHECK(google::protobuf::util::MessageDifferencer::Equals(back, e));
  CHECK(EventLine(e) == "2023-11-14T22:13:20.123Z critical loss_nan: loss is NaN\tat step 5");
}

TEST_CASE("actions: hangs act at once and stragglers after --confirm events with a cool-down") {
  ActionPolicy p({3, 30});
  Event hang = MakeEvent(ob::pb::EVENT_HANG, ob::pb::SEVERITY_CRITICAL, "h2", 1, 10, 1, 0, "silent");
  auto r = p.Consider(hang, 1000);
  REQUIRE(r);
  CHECK(r->line == "exclude h2 hang: silent");
  CHECK_FALSE(p.Consider(hang, 20000));  // cooling down
  CHECK(p.why_not().find("cooling down") != std::string::npos);
  CHECK(p.Consider(hang, 31000));

  Event stall = MakeEvent(ob::pb::EVENT_HANG, ob::pb::SEVERITY_WARNING, "", -1, 10, 1, 0, "stall");
  CHECK_FALSE(p.Consider(stall, 0));

  Event slow = MakeEvent(ob::pb::EVENT_STRAGGLER, ob::pb::SEVERITY_WARNING, "h3", 2, 10, 1, 0,
                         "h3 rank 2 straggles\nat step 10");
  CHECK_FALSE(p.Consider(slow, 0));
  CHECK_FALSE(p.Consider(slow, 100));
  r = p.Consider(slow, 200);
  REQUIRE(r);
  CHECK(r->line == "exclude h3 straggler: h3 rank 2 straggles at step 10");
  CHECK(r->confirmations == 3);
  // With its measured slowdown, which the master weighs before excluding.
  (*slow.mutable_evidence())["ratio"] = 1.4871;
  for (int64_t t : {40000, 40100}) CHECK_FALSE(p.Consider(slow, t));
  r = p.Consider(slow, 40200);
  REQUIRE(r);
  CHECK(r->line == "exclude h3 slow=1.49 straggler: h3 rank 2 straggles at step 10");
  (*slow.mutable_evidence())["ratio"] = 1;
  // A new generation starts the count afresh.
  slow.set_generation(2);
  CHECK_FALSE(p.Consider(slow, 100000));

  Event crash = MakeEvent(ob::pb::EVENT_CRASH, ob::pb::SEVERITY_CRITICAL, "h4", 0, 10, 1, 0, "died");
  (*crash.mutable_evidence())["host_crash_generations"] = 2;
  CHECK_FALSE(p.Consider(crash, 0));
  (*crash.mutable_evidence())["host_crash_generations"] = 3;
  r = p.Consider(crash, 0);
  REQUIRE(r);
  CHECK(r->verb == "exclude");

  Event nan = MakeEvent(ob::pb::EVENT_LOSS_NAN, ob::pb::SEVERITY_CRITICAL, "h1", 0, 7, 1, 0, "nan");
  r = p.Consider(nan, 0);
  REQUIRE(r);
  CHECK(r->line == "rollback loss_nan: nan");
  Event mem = MakeEvent(ob::pb::EVENT_MEMORY_GROWTH, ob::pb::SEVERITY_WARNING, "h1", 0, 7, 1, 0, "grew");
  CHECK_FALSE(p.Consider(mem, 1000));  // the job cools down after the rollback
  r = p.Consider(mem, 40000);
  REQUIRE(r);
  CHECK(r->verb == "checkpoint");
  Event drop = MakeEvent(ob::pb::EVENT_THROUGHPUT_DROP, ob::pb::SEVERITY_WARNING, "", -1, 7, 1, 0, "x");
  CHECK_FALSE(p.Consider(drop, 100000));
}

TEST_CASE("actions: a request names the run of its evidence, and a new run in a stream starts afresh") {
  // Every event carries the run of the records that raised it.
  SyntheticRun a = Run(2, 40);
  a.faults.push_back(Fault(SyntheticFault::kNan, 0, 30));
  std::vector<Metrics> records = Synthesize(a);
  for (auto& m : records) m.set_run("0123456789abcdef");
  const auto nans = OfKind(Watch(records), ob::pb::EVENT_LOSS_NAN);
  REQUIRE(nans.size() == 1);
  CHECK(nans[0].run() == "0123456789abcdef");
  ActionPolicy p({3, 30});
  auto r = p.Consider(nans[0], 0);
  REQUIRE(r);
  CHECK(r->line.rfind("run=0123456789abcdef rollback loss_nan: ", 0) == 0);
  CHECK(ActionEvent(*r, nullptr, 0).run() == "0123456789abcdef");
  // A forged run with spaces stays one word (the master refuses it).
  Event forged = nans[0];
  forged.set_run("a b\nc");
  ActionPolicy q({3, 30});
  r = q.Consider(forged, 0);
  REQUIRE(r);
  CHECK(r->line.rfind("run=a_b_c rollback ", 0) == 0);

  // Two runs in one stream: the second's generation 1 and step 0 are not
  // a retired generation's late records, and its NaN is its own.
  SyntheticRun b = Run(3, 40);
  b.faults.push_back(Fault(SyntheticFault::kNan, 0, 20));
  // The first run's NaN at its last step waits for later steps to be
  // decided: the second run's first record decides it, as the first run's.
  SyntheticRun a2 = Run(4, 40);
  a2.faults.push_back(Fault(SyntheticFault::kNan, 0, 39));
  std::vector<Metrics> first = Synthesize(a2);
  for (auto& m : first) {
    m.set_run("1111");
    m.set_generation(m.generation() + 4);
  }
  std::vector<Metrics> second = Synthesize(b);
  for (auto& m : second) m.set_run("2222");
  first.insert(first.end(), second.begin(), second.end());
  Watcher w({}, Clock::kStream);
  const auto both = OfKind(Watch(first, {}, &w), ob::pb::EVENT_LOSS_NAN);
  REQUIRE(both.size() == 2);
  CHECK(both[0].step() == 39);
  CHECK(both[0].run() == "1111");
  CHECK(both[1].step() == 20);
  CHECK(both[1].run() == "2222");
  CHECK(w.state().run == "2222");
  CHECK(w.state().records == first.size());
}

TEST_CASE("hang: a host whose clock is ahead does not make the others look silent") {
  // Rank 3's host is two minutes ahead; the master stamps when it got each
  // record by its own clock. Read by the writers' clocks, rank 3's first
  // record moved "now" two minutes on and the other three were "silent"
  // (and ob-watch --act would have excluded their healthy hosts).
  std::vector<Metrics> records = Synthesize(Run(5, 60));
  for (auto& m : records) {
    m.set_received_unix_ms(m.unix_ms());
    if (m.rank() == 3) m.set_unix_ms(m.unix_ms() + 120000);
  }
  CHECK(OfKind(Watch(records), ob::pb::EVENT_HANG).empty());
  for (auto& m : records) m.clear_received_unix_ms();  // as streams before the stamp
  CHECK(!OfKind(Watch(records), ob::pb::EVENT_HANG).empty());
}

TEST_CASE("actions: a request line goes to the control socket and its answer comes back") {
  char dir[] = "/tmp/ob-watch-test.XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/control.sock";
  const int server = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, path.c_str());
  REQUIRE(bind(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(listen(server, 4) == 0);
  std::vector<std::string> got;
  std::thread t([&] {
    for (int i = 0; i < 2; ++i) {
      const int c = accept(server, nullptr, nullptr);
      std::string line;
      char ch;
      while (read(c, &ch, 1) == 1 && ch != '\n') line.push_back(ch);
      got.push_back(line);
      const std::string answer = i == 0 ? "{\"ok\":true,\"state\":\"running\"}\n"
                                        : "{\"ok\":false,\"error\":\"no checkpoint to roll back to\"}\n";
      (void)!write(c, answer.data(), answer.size());
      close(c);
    }
  });
  auto a = SendControlRequest(path, "exclude h2 hang: silent", 2);
  REQUIRE(a.ok());
  CHECK(a->ok);
  auto b = SendControlRequest(path, "rollback loss_nan: nan", 2);
  REQUIRE(b.ok());
  CHECK_FALSE(b->ok);
  CHECK(b->error == "no checkpoint to roll back to");
  t.join();
  CHECK(got == std::vector<std::string>{"exclude h2 hang: silent", "rollback loss_nan: nan"});

  ActionRequest req;
  req.verb = "rollback";
  req.line = "rollback loss_nan: nan";
  req.cause = MakeEvent(ob::pb::EVENT_LOSS_NAN, ob::pb::SEVERITY_CRITICAL, "h1", 0, 7, 1, 0, "nan");
  (*req.cause.mutable_evidence())["loss"] = 1;
  Event e = ActionEvent(req, &*b, 5);
  CHECK(e.kind() == ob::pb::EVENT_ACTION);
  CHECK(e.evidence().at("ok") == 0);
  CHECK(e.evidence().at("loss") == 1);
  CHECK(e.request() == req.line);
  CHECK(e.message().find("refused: no checkpoint to roll back to") != std::string::npos);

  close(server);
  unlink(path.c_str());
  auto none = SendControlRequest(path, "checkpoint", 1);
  CHECK(none.status().code() == ob::Code::kUnavailable);
  CHECK(none.status().message().find("control.sock: cannot connect") != std::string::npos);
  rmdir(dir);
}

namespace {

std::string HttpGet(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return "";
  (void)!write(fd, request.data(), request.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

}  // namespace

TEST_CASE("Prometheus: the page per rank and per kind served over HTTP GET only") {
  Watcher w({}, Clock::kStream);
  SyntheticRun run = Run(1, 30);
  run.faults.push_back(Fault(SyntheticFault::kSpike, 0, 25, 2));
  std::vector<Event> out;
  for (const auto& m : Synthesize(run)) w.Feed(m, 0, &out);
  const std::string text = PrometheusText(w.state());
  CHECK(text.find("# TYPE ob_step_seconds gauge") != std::string::npos);
  CHECK(text.find("ob_last_step{host=\"node3\",rank=\"2\",pipeline=\"1\",stage=\"0\"} 29") != std::string::npos);
  CHECK(text.find("ob_watch_events_total{kind=\"loss_spike\"} 1") != std::string::npos);
  CHECK(text.find("ob_watch_events_total{kind=\"crash\"} 0") != std::string::npos);

  auto bad = MetricsServer::Start("9100", [] { return std::string(); });
  CHECK(bad.status().code() == ob::Code::kUsage);
  auto s = MetricsServer::Start("127.0.0.1:0", [&] { return text; });
  REQUIRE(s.ok());
  const std::string addr = (*s)->address();
  REQUIRE(addr.rfind("127.0.0.1:", 0) == 0);
  const int port = std::stoi(addr.substr(addr.find(':') + 1));
  const std::string ok = HttpGet(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(ok.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(ok.find("Content-Type: text/plain; version=0.0.4") != std::string::npos);
  CHECK(ok.substr(ok.find("\r\n\r\n") + 4) == text);
  CHECK(HttpGet(port, "GET / HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 404", 0) == 0);
  CHECK(HttpGet(port, "POST /metrics HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 405", 0) == 0);
}

TEST_CASE("Prometheus: a client that sends its request a byte at a time holds neither the scrapes nor the stop") {
  auto s = MetricsServer::Start("127.0.0.1:0", [] { return std::string("ob_ranks 4\n"); });
  REQUIRE(s.ok());
  const std::string addr = (*s)->address();
  const int port = std::stoi(addr.substr(addr.find(':') + 1));
  const int slow = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(slow, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  // A byte every 0.4 s, never the blank line that ends a request: each
  // arrives well inside a per-read timeout of 2 s, for 6 s in all.
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    for (int i = 0; i < 15 && !stop; ++i) {
      (void)!send(slow, "G", 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(400));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the server is reading it
  auto t0 = std::chrono::steady_clock::now();
  const std::string ok = HttpGet(port, "GET /metrics HTTP/1.0\r\n\r\n");
  const double scrape = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(ok.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(scrape < 3.5);  // at most the slow client's 2 s of patience, not its 6 s of bytes
  // Stopping while a slow client is being read takes no longer than a moment.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const int again = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(connect(again, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  (void)!send(again, "G", 1, MSG_NOSIGNAL);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  t0 = std::chrono::steady_clock::now();
  s->reset();
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 0.5);
  stop = true;
  trickle.join();
  close(slow);
  close(again);
}

TEST_CASE("plot: one polyline per rank series in each panel and a line per event") {
  Timeline t;
  SyntheticRun run = Run(3, 80);
  run.faults.push_back(Fault(SyntheticFault::kCrash, 3, 50));
  const auto records = Synthesize(run);
  for (const auto& m : records) t.Add(m);
  for (const auto& e : Watch(records)) t.AddEvent(e);
  const std::string svg = t.Svg("test <run>");
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = svg.find(what); at != std::string::npos; at = svg.find(what, at + 1)) ++n;
    return n;
  };
  CHECK(svg.rfind("<?xml", 0) == 0);
  CHECK(count("<polyline class=\"rank\"") == 2 * 6);  // 4 ranks of gen 1, 2 of gen 2
  CHECK(count("<line class=\"event\"") == 2 * 2);     // crash and recovery
  CHECK(count("class=\"event-label\"") == 2);
  CHECK(svg.find("test &lt;run&gt;") != std::string::npos);
  CHECK(svg.find("node4 · rank 3 · gen 1") != std::string::npos);
  CHECK(svg.find("</svg>") != std::string::npos);
}

TEST_CASE("hang judged by the master: its record names rank and host, and --act waits for a hang loop") {
  Watcher w({}, Clock::kStream);
  std::vector<Event> out;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    Metrics m;
    m.set_host("h" + std::to_string(rank));
    m.set_rank(rank);
    m.set_generation(1);
    m.set_unix_ms(1000);
    m.set_heartbeat(true);
    m.set_progress(40);
    w.Feed(m, 0, &out);
  }
  Metrics h;
  h.set_host("h1");
  h.set_rank(1);
  h.set_generation(1);
  h.set_step(20);
  h.set_unix_ms(4100);
  h.set_heartbeat(true);
  h.mutable_hang()->set_stalled_seconds(3.1);
  h.mutable_hang()->set_progress(40);
  h.mutable_hang()->set_description("worker rank 1 on host h1 hung: no progress for 3.1 s in step 20");
  w.Feed(h, 0, &out);
  REQUIRE(out.size() == 1);
  CHECK(out[0].kind() == ob::pb::EVENT_HANG);
  CHECK(out[0].severity() == ob::pb::SEVERITY_CRITICAL);
  CHECK(out[0].host() == "h1");
  CHECK(out[0].rank() == 1);
  CHECK(out[0].step() == 20);
  CHECK(out[0].message().find("h1 rank 1 hangs in step 20") != std::string::npos);
  CHECK(out[0].evidence().at("stalled_seconds") == Approx(3.1));
  CHECK(out[0].evidence().at("host_hang_generations") == 1);
  ActionPolicy p({3, 30});
  CHECK_FALSE(p.Consider(out[0], 5000));
  CHECK(p.why_not().find("recovers from a single hang itself") != std::string::npos);
}
