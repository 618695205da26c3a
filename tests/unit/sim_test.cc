// ob-sim's simulator (sim/sim.h): closed-form runs, the master's decision
// function in the loop, traces read and drawn.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "ob/plan/instantiation.h"
#include "ob/plan/templates.h"
#include "ob/sim/sim.h"
#include "plan_testing.h"

namespace ob::sim {
namespace {

// Two-stage pipelines over `nodes` nodes (as decision_test's), f faults.
plan::LoadedPlan TwoStagePlan(int nodes, int faults) {
  plan::LoadedPlan lp = plan::testing::TwoNodeStagesPlan(nodes, faults);
  REQUIRE(lp.templates.min_nodes == 2);
  REQUIRE(lp.instantiation.iteration_seconds > 0);
  return lp;
}

SimOptions Options(double iter, double horizon_iters, double checkpoint_every_iters) {
  SimOptions o;
  o.horizon_s = iter * horizon_iters;
  o.recovery_s = 2 * iter;
  o.restart_s = 10 * iter;
  o.checkpoint_s = iter / 2;
  o.checkpoint_interval_s = iter * checkpoint_every_iters;
  o.master_node = -1;  // the master's host has a case of its own
  return o;
}

}  // namespace

TEST_CASE("without failures the run is its steps and checkpoints", "[sim]") {
  const auto plan = TwoStagePlan(8, 1);
  const double iter = plan.instantiation.iteration_seconds;
  REQUIRE(iter > 0);
  // 1,000 iterations of time, a checkpoint (half an iteration) every 10
  // steps: periods of 10.5 iterations, 95 of them and 2.5 iterations more.
  auto r = Simulate(plan, {}, Options(iter, 1000, 10));
  REQUIRE(r.ok());
  CHECK(r->steps == 95 * 10 + 2);
  CHECK(r->steps_redone == 0);
  CHECK(r->ettr == Approx(952.0 / 1000));
  CHECK(r->checkpointing_s == Approx(95 * iter / 2));
  CHECK(r->lost_work_s == Approx(0.5 * iter).margin(1e-9));  // the step in flight at the end
  CHECK(r->training_s + r->checkpointing_s + r->recovering_s + r->restarting_s + r->down_s ==
        Approx(r->horizon_s));
  CHECK(r->goodput == Approx(952 * r->tokens_per_step / r->horizon_s));
  // A measured step time twice the prediction: every iteration scaled.
  SimOptions slow = Options(iter, 1000, 10);
  slow.checkpoint_interval_s = 20 * iter;  // still every 10 steps
  slow.iteration_scale = 2;
  auto s = Simulate(plan, {}, slow);
  REQUIRE(s.ok());
  CHECK(s->nominal_iteration_s == Approx(2 * iter));
  // Periods of 20.5 iterations: 48 of them (984) and 16 more, 8 steps.
  CHECK(s->steps == 48 * 10 + 8);
  slow.iteration_scale = 0;
  CHECK(Simulate(plan, {}, slow).status().code() == Code::kUsage);
}

TEST_CASE("a failure within f costs a recovery and the step in flight, one beyond a checkpoint's steps", "[sim]") {
  const auto plan = TwoStagePlan(8, 1);  // 4 pipelines of 2
  const double iter = plan.instantiation.iteration_seconds;
  const SimOptions o = Options(iter, 1000, 10);
  // h0 fails 100.25 iterations in (step 100 is under way, after 9
  // checkpoints: 94.5 iterations of periods, then steps 91..96... ).
  std::vector<TraceEvent> trace{{100.25 * iter, true, 0}};
  auto ob = Simulate(plan, trace, o);
  REQUIRE(ob.ok());
  CHECK(ob->failures == 1);
  CHECK(ob->reinstantiations == 1);
  CHECK(ob->checkpoint_restarts == 0);
  CHECK(ob->steps_redone == 0);
  CHECK(ob->recovering_s == Approx(2 * iter));
  // The same failure under checkpoint-restart: back to the last checkpoint.
  SimOptions restart = o;
  restart.policy = Policy::kCheckpointRestart;
  auto cr = Simulate(plan, trace, restart);
  REQUIRE(cr.ok());
  CHECK(cr->checkpoint_restarts == 1);
  // 100.25 iterations = 9 periods (94.5) + 5.75: 95 steps, the 96th under
  // way; the last checkpoint is after step 90: 5 steps redone.
  CHECK(cr->steps_redone == 5);
  CHECK(cr->restarting_s == Approx(10 * iter));
  // ob trains on the 7 nodes left (the node is not back within the
  // horizon); checkpoint-restart on a spare at the planned speed.
  CHECK(ob->worst_iteration_s > iter);
  CHECK(cr->worst_iteration_s == Approx(iter));
}

TEST_CASE("the master's host: with a standby a takeover longer, without one a restart from the checkpoint", "[sim]") {
  const auto plan = TwoStagePlan(8, 1);
  const double iter = plan.instantiation.iteration_seconds;
  SimOptions o = Options(iter, 1000, 10);
  o.master_node = 0;
  o.takeover_s = iter;
  // h0, the master's host, fails as in the case above; then h1, where the
  // master moved (the first live node), and h5, which is not the master's.
  const std::vector<TraceEvent> trace{{100.25 * iter, true, 0}, {300.25 * iter, true, 1}, {500.25 * iter, true, 5}};
  auto standby = Simulate(plan, trace, o);
  REQUIRE(standby.ok());
  CHECK(standby->failures == 3);
  CHECK(standby->master_failures == 2);
  CHECK(standby->checkpoint_restarts == 0);
  CHECK(standby->steps_redone == 0);
  CHECK(standby->recovering_s == Approx(3 * 2 * iter + 2 * iter));  // three recoveries, two takeovers
  o.standby_master = false;
  auto alone = Simulate(plan, trace, o);
  REQUIRE(alone.ok());
  CHECK(alone->master_failures == 2);
  CHECK(alone->checkpoint_restarts == 2);  // the job is requeued from its checkpoint each time
  CHECK(alone->restarting_s == Approx(2 * 10 * iter));
  CHECK(alone->steps_redone > 0);
  CHECK(alone->steps < standby->steps);
  // Checkpoint-restart restarts on every failure: the master changes nothing.
  o.policy = Policy::kCheckpointRestart;
  auto cr = Simulate(plan, trace, o);
  REQUIRE(cr.ok());
  CHECK(cr->master_failures == 0);
  CHECK(cr->checkpoint_restarts == 3);
}

TEST_CASE("ob-sim decides through the decision function it is given, the master's by default", "[sim]") {
  const auto plan = TwoStagePlan(8, 1);
  const double iter = plan.instantiation.iteration_seconds;
  const SimOptions o = Options(iter, 1000, 10);
  std::vector<TraceEvent> trace{{100.25 * iter, true, 0}, {300 * iter, false, 0}};
  int calls = 0;
  SimOptions counted = o;
  counted.decide = [&](const launch::RecoveryFacts& f) {
    ++calls;
    return launch::DecideRecovery(f);
  };
  auto master = Simulate(plan, trace, o);
  auto wrapped = Simulate(plan, trace, counted);
  REQUIRE(master.ok());
  REQUIRE(wrapped.ok());
  CHECK(calls == 2);  // the failure, and the node's return
  CHECK(wrapped->steps == master->steps);
  // A different decision (always back to the last checkpoint) changes the
  // result: the simulator does not decide on its own.
  SimOptions other = o;
  other.decide = [](const launch::RecoveryFacts& f) {
    launch::Decision d;
    d.kind = launch::Decision::Kind::kCheckpoint;
    d.next = f.current;
    d.checkpoint = *f.newest_checkpoint();
    return d;
  };
  auto changed = Simulate(plan, trace, other);
  REQUIRE(changed.ok());
  CHECK(changed->checkpoint_restarts == 2);
  CHECK(changed->reinstantiations == 0);
  CHECK(changed->steps != master->steps);
}

TEST_CASE("oobleck-style: the same reconfiguration on failures, no node taken in again", "[sim]") {
  const auto plan = TwoStagePlan(8, 1);
  const double iter = plan.instantiation.iteration_seconds;
  SimOptions o = Options(iter, 1000, 10);
  std::vector<TraceEvent> trace{{100.25 * iter, true, 0}, {300 * iter, false, 0}, {600.5 * iter, true, 3},
                                {700 * iter, false, 3}};
  auto ob = Simulate(plan, trace, o);
  o.policy = Policy::kOobleck;
  int decisions = 0;
  std::vector<int> live_at_second;
  o.decide = [&](const launch::RecoveryFacts& f) {
    if (++decisions == 2) live_at_second = f.live;
    return launch::DecideRecovery(f);
  };
  auto oo = Simulate(plan, trace, o);
  REQUIRE(ob.ok());
  REQUIRE(oo.ok());
  CHECK(oo->policy == "oobleck-style");
  CHECK(ob->reinstantiations == 4);  // two failures, two returns
  CHECK(decisions == 2);             // the failures only
  CHECK(oo->reinstantiations == 2);
  // h0, back at 300, is not offered to the second decision.
  CHECK(std::find(live_at_second.begin(), live_at_second.end(), 0) == live_at_second.end());
  CHECK(live_at_second.size() == 6);
  CHECK(oo->steps < ob->steps);
}

TEST_CASE("losing every replica of a layer restarts from the checkpoint, as the master would", "[sim]") {
  const auto plan = TwoStagePlan(4, 1);  // 2 pipelines of 2 nodes
  const double iter = plan.instantiation.iteration_seconds;
  std::set<int> stage0;
  for (const auto& p : plan.instantiation.pipelines) stage0.insert(p.nodes[0]);
  REQUIRE(stage0.size() == 2);
  std::vector<TraceEvent> trace;
  for (int n : stage0) trace.push_back({200.25 * iter + n, true, n});
  auto r = Simulate(plan, trace, Options(iter, 1000, 10));
  REQUIRE(r.ok());
  CHECK(r->failures == 2);
  CHECK(r->reinstantiations + r->checkpoint_restarts + r->stops >= 1);
  CHECK(r->steps_redone > 0);
}

TEST_CASE("failure traces: read with their line numbers, drawn from a seed", "[sim]") {
  const std::vector<std::string> hosts{"a", "b", "c"};
  auto t = ParseTrace("# a trace\n2h fail b\n\n30m fail 0 # by index\n3h repair b\n", "f.txt", hosts);
  REQUIRE(t.ok());
  REQUIRE(t->size() == 3);
  CHECK((*t)[0].t == 1800);
  CHECK((*t)[0].node == 0);
  CHECK((*t)[1].node == 1);
  CHECK_FALSE((*t)[2].fail);
  auto bad = ParseTrace("1h fail a\n2h explode a\n", "f.txt", hosts);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() == "f.txt:2: 'explode' is neither fail nor repair");
  CHECK(ParseTrace("1h fail zz\n", "f.txt", hosts).status().message() ==
        "f.txt:1: no host 'zz' in the plan (3 hosts)");
  CHECK_FALSE(ParseTrace("soon fail a\n", "f.txt", hosts).ok());
  CHECK_FALSE(ParseTrace("1h fail a b\n", "f.txt", hosts).ok());
  // In time order, failures and repairs alternate per node (both were
  // replayed as nothing before).
  CHECK(ParseTrace("10s fail a\n5s repair a\n", "f.txt", hosts).status().message() ==
        "f.txt:2: a is repaired but is not down then (events are replayed in time order)");
  CHECK(ParseTrace("10s fail a\n15s fail b\n20s fail a\n", "f.txt", hosts).status().message() ==
        "f.txt:3: a fails again, down since line 1 with no repair between");
  CHECK(ParseTrace("20s repair a\n10s fail a\n30s fail a\n", "f.txt", hosts).ok());

  TraceModel m;
  m.node_mtbf_s = 10 * 86400;
  m.repair_s = 3600;
  m.horizon_s = 365 * 86400.0;
  m.seed = 7;
  const auto a = *GenerateTrace(100, m);
  const auto b = *GenerateTrace(100, m);
  REQUIRE(a.size() == b.size());
  CHECK(a.front().t == b.front().t);
  int failures = 0;
  for (const auto& e : a) failures += e.fail;
  // About 100 nodes × 365 days / 10 days = 3,650 (up time only: a bit less).
  CHECK(failures > 3300);
  CHECK(failures < 3800);
  m.seed = 8;
  CHECK(GenerateTrace(100, m)->front().t != a.front().t);

  // A shape whose scale is not finite (Γ(1 + 1/k) overflows) drew NaN times
  // and looped forever; one that draws mostly tiny times with no repair
  // time filled the memory. Both are refused.
  m.weibull_shape = 0.001;
  auto nan = GenerateTrace(100, m);
  REQUIRE_FALSE(nan.ok());
  CHECK(nan.status().message().find("has no finite scale") != std::string::npos);
  m.weibull_shape = 0.02;
  m.repair_s = 0;
  auto many = GenerateTrace(100, m, 100000);
  REQUIRE_FALSE(many.ok());
  CHECK(many.status().message().find("more than 100000 events") != std::string::npos);
  m.weibull_shape = 1;
  CHECK(GenerateTrace(100, m, 100000).ok());
}

TEST_CASE("recorded recoveries come from events.log's recovered lines", "[sim]") {
  auto r = RecoveriesFromEvents(
      "2026-11-26T16:25:35Z +23.9s decide generation=2 restarting\n"
      "2026-11-26T16:25:43Z +31.8s recovered generation=2 from_step=49 detect_ms=0 total_ms=8058\n"
      "2026-11-26T17:25:43Z +91.8s recovered generation=3 from_step=99 detect_ms=90 decide_ms=110 "
      "teardown_ms=4 regroup_ms=9 copy_ms=8 first_step_ms=143 total_ms=278\n",
      "events.log");
  REQUIRE(r.ok());
  CHECK(r->count == 2);
  // From the detection to the first step's start: 8.058 s, and 0.278 −
  // 0.143 = 0.135 s (the first step is training).
  CHECK(r->mean_s == Approx((8.058 + 0.135) / 2));
  CHECK(RecoveriesFromEvents("nothing\n", "events.log").status().message() ==
        "events.log: no 'recovered' lines (an ob-launch events.log?)");
}

}  // namespace ob::sim
