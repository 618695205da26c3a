// The recovery decision (launch/master/decision.h): every scenario of issue 10 that
// is a decision, as a unit test of DecideRecovery.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "ob/launch/master/decision.h"
#include "ob/plan/templates.h"
#include "plan_testing.h"

namespace ob::launch {
namespace {

using Kind = Decision::Kind;

// gpt-like, `nodes` nodes, memory for half the model per GPU: n0 = 2, so
// the plan is nodes/2 pipelines of two stages (as tests/lib/launch.sh's
// make_pipelines), and a lone survivor of a pipeline cannot train alone.
plan::LoadedPlan TwoStagePlan(int nodes, int faults) {
  plan::LoadedPlan lp = plan::testing::TwoNodeStagesPlan(nodes, faults);
  REQUIRE(lp.templates.min_nodes == 2);
  for (const auto& p : lp.instantiation.pipelines) REQUIRE(p.template_nodes == 2);
  REQUIRE(static_cast<int>(lp.instantiation.pipelines.size()) == nodes / 2);
  return lp;
}

std::vector<int> Without(std::vector<int> all, const std::set<int>& gone) {
  all.erase(std::remove_if(all.begin(), all.end(), [&](int n) { return gone.count(n) > 0; }), all.end());
  return all;
}

std::vector<int> Range(int n) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i) v.push_back(i);
  return v;
}

// Facts of a run in steady state: every node live, the lineage has steps.
RecoveryFacts Steady(const plan::LoadedPlan& lp) {
  RecoveryFacts f;
  f.plan = &lp;
  f.current = f.holding = lp.instantiation;
  f.live = Range(lp.problem.cluster.nodes);
  f.fruitless = 1;
  f.what = "a failure";
  return f;
}

// Loses `gone` (their names "hN"), as the master gathers it.
void Lose(RecoveryFacts* f, const std::set<int>& gone) {
  f->live = Without(f->live, gone);
  for (int n : gone) {
    f->lost.push_back(n);
    f->lost_names += (f->lost_names.empty() ? "h" : ", h") + std::to_string(n);
  }
}

std::set<int> Used(const plan::Instantiation& inst) {
  std::set<int> s;
  for (const auto& p : inst.pipelines) s.insert(p.nodes.begin(), p.nodes.end());
  return s;
}

std::function<Result<CheckpointRef>()> Checkpoint(const std::string& path, int64_t step) {
  return [=]() -> Result<CheckpointRef> { return CheckpointRef{path, step}; };
}

TEST_CASE("a worker that failed on a live host: restart in place, same instantiation") {
  const auto lp = TwoStagePlan(4, 1);
  const Decision d = DecideRecovery(Steady(lp));
  CHECK(d.kind == Kind::kInPlace);
  CHECK(d.next.pipelines.size() == 2);
  CHECK(d.fetches.empty());
  CHECK(d.text == "restarting every worker in place on the same instantiation");
}

TEST_CASE("one host lost within f: re-instantiated without it, its partner idle") {
  const auto lp = TwoStagePlan(4, 1);
  const int b0 = lp.instantiation.pipelines[1].nodes[0], b1 = lp.instantiation.pipelines[1].nodes[1];
  RecoveryFacts f = Steady(lp);
  Lose(&f, {b0});
  const Decision d = DecideRecovery(f);
  REQUIRE(d.kind == Kind::kReinstantiate);
  CHECK(d.next.pipelines.size() == 1);
  CHECK(d.idle == std::vector<int>{b1});
  CHECK(d.text.rfind("lost hosts h" + std::to_string(b0) + "; re-instantiated as pipelines of 2 nodes", 0) == 0);
}

// Issue 10: "losing h4 and then h1 90 ms after the decision ends the run
// (exit 75) while losing both at once is survived; an idle host still held
// the needed layers".
TEST_CASE("a second failure during a recovery is decided against where the layers are") {
  const auto lp = TwoStagePlan(4, 1);
  const auto& P = lp.instantiation.pipelines;
  const int a0 = P[0].nodes[0], a1 = P[0].nodes[1], b0 = P[1].nodes[0], b1 = P[1].nodes[1];
  RecoveryFacts f = Steady(lp);
  Lose(&f, {b0});
  const Decision first = DecideRecovery(f);
  REQUIRE(first.kind == Kind::kReinstantiate);
  REQUIRE(first.idle == std::vector<int>{b1});

  // 90 ms later, before any rank of the new generation completed a step:
  // the master's facts are the new instantiation, the old holding, and
  // every loss since it.
  RecoveryFacts second = f;
  second.current = first.next;
  second.lost_names.clear();
  second.fruitless = 2;
  Lose(&second, {a1});
  const Decision d = DecideRecovery(second);
  INFO(d.text);
  REQUIRE(d.kind == Kind::kReinstantiate);
  CHECK(Used(d.next) == std::set<int>{a0, b1});
  CHECK(d.fetches.empty());  // a0 holds stage 0, the idle b1 stage 1

  // The same as losing both at once.
  RecoveryFacts both = Steady(lp);
  Lose(&both, {b0, a1});
  const Decision at_once = DecideRecovery(both);
  REQUIRE(at_once.kind == Kind::kReinstantiate);
  CHECK(Used(at_once.next) == Used(d.next));

  // What deciding against the half-reached instantiation concluded (the
  // old seam): the idle holder is not a replica, the run ends.
  RecoveryFacts seam = second;
  seam.holding = first.next;
  seam.lost = {a1};
  const Decision wrong = DecideRecovery(seam);
  CHECK(wrong.kind == Kind::kStop);
  CHECK(wrong.text.find("no surviving replica") != std::string::npos);
}

TEST_CASE("any two failures in sequence decide as they would at once (6 hosts, f = 2)") {
  const auto lp = TwoStagePlan(6, 2);
  for (int x = 0; x < 6; ++x) {
    for (int y = 0; y < 6; ++y) {
      if (x == y) continue;
      RecoveryFacts f = Steady(lp);
      Lose(&f, {x});
      const Decision first = DecideRecovery(f);
      REQUIRE(first.kind == Kind::kReinstantiate);
      RecoveryFacts second = f;
      second.current = first.next;
      second.lost_names.clear();
      Lose(&second, {y});
      RecoveryFacts both = Steady(lp);
      Lose(&both, {x, y});
      const Decision a = DecideRecovery(second), b = DecideRecovery(both);
      INFO("lost " << x << " then " << y << ": " << a.text << " | at once: " << b.text);
      CHECK(a.kind == b.kind);
      CHECK(Used(a.next) == Used(b.next));
      CHECK(a.fetches.size() == b.fetches.size());
    }
  }
}

TEST_CASE("a host that came back before the survivors stepped holds nothing") {
  const auto lp = TwoStagePlan(4, 1);
  const int b0 = lp.instantiation.pipelines[1].nodes[0], b1 = lp.instantiation.pipelines[1].nodes[1];
  RecoveryFacts f = Steady(lp);
  f.lost = {b0};  // lost, and its agent is back (a new one: no snapshots)
  const Decision d = DecideRecovery(f);
  REQUIRE(d.kind == Kind::kReinstantiate);
  CHECK(Used(d.next).count(b0) == 1);
  REQUIRE_FALSE(d.fetches.empty());
  for (const auto& x : d.fetches) {
    CHECK((x.node == b0 || x.node == b1));  // its pipeline, re-laid out
    CHECK(x.from_node != b0);
  }
}

TEST_CASE("beyond f: the newest usable checkpoint on the live nodes, else a stop naming the layers") {
  const auto lp = TwoStagePlan(4, 1);
  const auto& P = lp.instantiation.pipelines;
  const std::set<int> gone = {P[0].nodes[1], P[1].nodes[1]};  // every holder of stage 1
  RecoveryFacts f = Steady(lp);
  Lose(&f, gone);

  SECTION("no --ckpt-dir") {
    const Decision d = DecideRecovery(f);
    CHECK(d.kind == Kind::kStop);
    CHECK(d.stop.code() == Code::kTempFail);
    CHECK(d.text.find("no surviving replica; restart from a checkpoint") != std::string::npos);
  }
  SECTION("a checkpoint that verifies") {
    f.newest_checkpoint = Checkpoint("ck/step-000000000019", 19);
    const Decision d = DecideRecovery(f);
    REQUIRE(d.kind == Kind::kCheckpoint);
    CHECK(d.checkpoint.step == 19);
    CHECK(Used(d.next) == std::set<int>{P[0].nodes[0], P[1].nodes[0]});
    CHECK(d.text.find("no surviving replica; restarting from checkpoint ck/step-000000000019") !=
          std::string::npos);
  }
  SECTION("none verifies") {
    f.newest_checkpoint = []() -> Result<CheckpointRef> {
      return Status::DataErr("none of 3 checkpoints in ck verifies");
    };
    const Decision d = DecideRecovery(f);
    CHECK(d.kind == Kind::kStop);
    CHECK(d.stop.code() == Code::kTempFail);
    CHECK(d.text.find("(none of 3 checkpoints in ck verifies)") != std::string::npos);
  }
}

TEST_CASE("no step since the lineage's start: any layout of the live nodes, from that start") {
  const auto lp = TwoStagePlan(4, 1);
  const auto& P = lp.instantiation.pipelines;
  RecoveryFacts f = Steady(lp);
  f.snapshots = false;  // e.g. a resume, then a host lost before the first step
  Lose(&f, {P[0].nodes[1], P[1].nodes[1]});
  const Decision d = DecideRecovery(f);
  REQUIRE(d.kind == Kind::kReinstantiate);
  CHECK(d.fetches.empty());
  CHECK(Used(d.next) == std::set<int>{P[0].nodes[0], P[1].nodes[0]});
}

TEST_CASE("recoveries that complete no step, and losses after the master's own stall, stop the run") {
  const auto lp = TwoStagePlan(4, 1);
  RecoveryFacts f = Steady(lp);
  f.fruitless = kMaxFruitless + 1;
  Decision d = DecideRecovery(f);
  CHECK(d.kind == Kind::kStop);
  CHECK(d.stop.code() == Code::kTempFail);
  CHECK(d.text.find("recoveries in a row completed no step") != std::string::npos);

  f = Steady(lp);
  Lose(&f, {0});
  f.stalled_ms = 4200;
  f.master_timeout_s = 1;
  d = DecideRecovery(f);
  CHECK(d.kind == Kind::kStop);
  CHECK(d.text.find("the master did not run for 4200 ms") != std::string::npos);
  CHECK(d.text.find("no surviving replica") == std::string::npos);
}

TEST_CASE("a rollback: the newest usable checkpoint on the same instantiation, else exit 65") {
  const auto lp = TwoStagePlan(4, 1);
  RecoveryFacts f = Steady(lp);
  f.rollback = "loss diverged";
  f.fruitless = kMaxFruitless + 5;  // not a recovery: never counted
  Decision d = DecideRecovery(f);
  CHECK(d.kind == Kind::kStop);
  CHECK(d.stop.code() == Code::kDataErr);
  CHECK(d.text.find("no checkpoint to roll back to") != std::string::npos);

  f.newest_checkpoint = Checkpoint("ck/step-000000000019", 19);
  d = DecideRecovery(f);
  REQUIRE(d.kind == Kind::kCheckpoint);
  CHECK(d.checkpoint.path == "ck/step-000000000019");
  CHECK(Used(d.next) == Used(lp.instantiation));
}

TEST_CASE("the weight lineage: the start until every rank stepped, then snapshots, and a checkpoint starts a new one") {
  WeightLineage l;
  pb::WeightSource s = l.Next(1);
  CHECK(s.kind() == pb::WeightSource::INITIAL);
  CHECK(s.lineage() == 1);
  s = l.Next(2);  // a failure before every rank stepped: the initial weights again
  CHECK(s.kind() == pb::WeightSource::INITIAL);
  CHECK(s.lineage() == 1);
  l.Stepped();
  s = l.Next(3);
  CHECK(s.kind() == pb::WeightSource::SNAPSHOTS);
  CHECK(s.lineage() == 1);
  l.RestoreNext({"ck/step-000000000030", 30});
  s = l.Next(4);
  CHECK(s.kind() == pb::WeightSource::CHECKPOINT);
  CHECK(s.lineage() == 4);
  CHECK(s.step() == 30);
  CHECK_FALSE(l.has_steps());
  s = l.Next(5);  // rollback, then a failure within the step: the checkpoint, not step 30's snapshots
  CHECK(s.kind() == pb::WeightSource::CHECKPOINT);
  CHECK(s.checkpoint() == "ck/step-000000000030");
  CHECK(DescribeSource(s) == "checkpoint:ck/step-000000000030 step=30 lineage=4");
}

}  // namespace
}  // namespace ob::launch

namespace ob::launch {
namespace {

TEST_CASE("a host-to-host partition: exclude the side that cannot reach the majority") {
  const std::vector<int> four = {0, 1, 2, 3};
  // One link cut: a tie, broken by the highest node id.
  PartitionVerdict v = PartitionExclusions(four, {{1, 2}});
  CHECK(v.exclude == std::vector<int>{2});
  CHECK(v.why == "node 2 reaches 2 of the other 3");
  // One host cut off from every other.
  v = PartitionExclusions(four, {{0, 3}, {1, 3}, {2, 3}});
  CHECK(v.exclude == std::vector<int>{3});
  // Two against three: the two go.
  v = PartitionExclusions({0, 1, 2, 3, 4}, {{0, 2}, {0, 3}, {0, 4}, {1, 2}, {1, 3}, {1, 4}});
  CHECK(v.exclude == std::vector<int>{1, 0});
  // Nothing cut, or the cut is between nodes no longer live.
  CHECK(PartitionExclusions(four, {}).exclude.empty());
  CHECK(PartitionExclusions({0, 1, 2}, {{2, 7}}).exclude.empty());
  // Every pair cut: the probes cannot tell; nobody is excluded.
  v = PartitionExclusions({0, 1, 2}, {{0, 1}, {0, 2}, {1, 2}});
  CHECK(v.exclude.empty());
  CHECK(v.why.find("cannot tell") != std::string::npos);
}

}  // namespace
}  // namespace ob::launch

TEST_CASE("cut reports: a host that reaches some peers is judged at once, one that reaches none once reports settle") {
  using ob::launch::CutReports;
  using ob::launch::kCutSettleMs;
  using Cuts = std::set<std::pair<int, int>>;
  // Four hosts behind a firewall that drops the probes: host 3 confirms
  // first, the others a round later, each reporting every peer. Judged at
  // once, host 3 alone looked cut off and was excluded, then the next.
  ob::launch::CutSettle s;
  const Cuts first{{0, 3}, {1, 3}, {2, 3}};
  Cuts all;
  for (int a = 0; a < 4; ++a)
    for (int b = a + 1; b < 4; ++b) all.insert({a, b});
  CHECK(!s.Update(CutReports{}, 0));
  CHECK(!s.Update(CutReports{{}, first}, 1000));
  CHECK(!s.Update(CutReports{{}, first}, 1000 + kCutSettleMs - 1));
  CHECK(!s.Update(CutReports{{}, all}, 2500));  // changed: the wait starts again
  CHECK(!s.Update(CutReports{{}, all}, 2500 + kCutSettleMs - 1));
  const auto settled = s.Update(CutReports{{}, all}, 2500 + kCutSettleMs);
  REQUIRE(settled);
  CHECK(*settled == all);
  CHECK(ob::launch::PartitionExclusions({0, 1, 2, 3}, *settled).exclude.empty());
  // A partition (hosts 1 and 2 lose each other, both reach the rest):
  // judged at the first report, as before.
  ob::launch::CutSettle t;
  CHECK(t.Update(CutReports{{{1, 2}}, {}}, 0) == Cuts{{1, 2}});
  CHECK(!t.Update(CutReports{}, 100));  // healed
  // Host 3 cut off from everyone: its own report is whole, the others'
  // partial, and those are judged at once.
  ob::launch::CutSettle u;
  CHECK(!u.Update(CutReports{{}, first}, 0));
  const auto now = u.Update(CutReports{{{0, 3}, {1, 3}}, first}, 300);
  REQUIRE(now);
  CHECK(*now == Cuts{{0, 3}, {1, 3}});
  CHECK(ob::launch::PartitionExclusions({0, 1, 2, 3}, *now).exclude == std::vector<int>{3});
}
