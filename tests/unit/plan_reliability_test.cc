// f from failure rates (ob-plan -f auto, plan/reliability.h): closed-form
// cases of the goodput model, and the choice on real templates.
#include <catch2/catch.hpp>

#include <cmath>

#include "ob/plan/instantiation.h"
#include "ob/plan/reliability.h"
#include "ob/plan/templates.h"
#include "plan_testing.h"

namespace ob::plan {
namespace {

// Iteration time that does not depend on f: n nodes share 1000 node-seconds.
Result<double> Flat(int, int nodes) { return 1000.0 / nodes; }

}  // namespace

TEST_CASE("the Poisson tail matches its closed forms") {
  CHECK(PoissonTail(0.5, 0) == 1.0);
  CHECK(PoissonTail(0.0, 1) == 0.0);
  CHECK(PoissonTail(0.5, 1) == Approx(1 - std::exp(-0.5)).epsilon(1e-12));
  CHECK(PoissonTail(0.5, 2) == Approx(1 - std::exp(-0.5) * 1.5).epsilon(1e-12));
  CHECK(PoissonTail(2.0, 3) == Approx(1 - std::exp(-2.0) * (1 + 2 + 2)).epsilon(1e-12));
  // A tiny tail keeps its precision (1 − Σ would round it to 0).
  const double a = 1e-3;
  CHECK(PoissonTail(a, 3) == Approx(std::exp(-a) * a * a * a / 6 * (1 + a / 4)).epsilon(1e-6));
}

TEST_CASE("choosing f: without failures f is 0, one checkpoint in the horizon") {
  FailureModel m;
  m.node_mtbf_s = 1e30;
  auto c = ChooseFaults(16, 1e6, m, Flat);
  REQUIRE(c.ok());
  CHECK(c->f == 0);
  const auto& o = c->options[0];
  // One checkpoint over the 30-day horizon is all it costs.
  CHECK(o.lost_fraction == Approx(5.0 / (30 * 86400.0)).epsilon(1e-6));
  CHECK(o.goodput == Approx(1e6 / (1000.0 / 16)).epsilon(1e-5));
}

TEST_CASE("choosing f: the loss of f = 0 is the checkpoint-restart formula") {
  // 100 nodes, each failing every 100 days: λ = 1/day. With f = 0 every
  // failure restarts: Young's C = sqrt(2·δ/λ), lost = λ·(restart + C/2) + δ/C.
  FailureModel m;
  m.node_mtbf_s = 100 * 86400.0;
  m.repair_s = 0;  // nobody is ever down when a failure comes: f ≥ 1 survives every one
  m.restart_s = 600;
  m.checkpoint_s = 10;
  m.recovery_s = 2;
  auto c = ChooseFaults(100, 1e5, m, Flat, 3);
  REQUIRE(c.ok());
  const double lambda = 1.0 / 86400;
  const double C = std::sqrt(2 * 10 / lambda);
  const auto& o0 = c->options[0];
  CHECK(o0.p_beyond == 1.0);
  CHECK(o0.checkpoint_interval_s == Approx(C).epsilon(1e-9));
  CHECK(o0.lost_fraction == Approx(lambda * (600 + C / 2) + 10 / C).epsilon(1e-9));
  // f = 1 survives everything (no node is ever down when one fails): only
  // the in-place recoveries and the redone half step cost.
  const auto& o1 = c->options[1];
  CHECK(o1.p_beyond == 0.0);
  // Iteration 10 s; one checkpoint in the 30-day horizon.
  // (The master's host, one node in 100, recovers 3 s later: its standby
  // takes over.)
  CHECK(o1.lost_fraction == Approx(lambda * (2 + 5.0) + lambda / 100 * 3 + 10 / (30 * 86400.0)).epsilon(1e-9));
  CHECK(c->f == 1);
  CHECK(c->options.size() == 2);  // nothing beyond f = 1 can do better
}

TEST_CASE("choosing f: without a standby master its host's failures are restarts whatever f") {
  FailureModel m;
  m.node_mtbf_s = 100 * 86400.0;  // 100 nodes: a failure a day, one in 100 days the master's host
  m.repair_s = 0;
  m.restart_s = 600;
  m.checkpoint_s = 10;
  m.recovery_s = 2;
  m.standby_master = false;
  auto c = ChooseFaults(100, 1e5, m, Flat, 3);
  REQUIRE(c.ok());
  const double lambda = 1.0 / 86400, master = lambda / 100;
  const auto& o1 = c->options[1];
  CHECK(o1.p_beyond == 0.0);
  CHECK(o1.beyond_per_day == Approx(master * 86400).epsilon(1e-12));  // the master's host alone
  const double C = std::sqrt(2 * 10 / master);
  CHECK(o1.checkpoint_interval_s == Approx(C).epsilon(1e-9));
  CHECK(o1.lost_fraction ==
        Approx((lambda - master) * (2 + 5.0) + master * (600 + C / 2) + 10 / C).epsilon(1e-9));
  // With one, the same failures cost a takeover each, and a checkpoint a horizon.
  m.standby_master = true;
  m.takeover_s = 3;
  auto d = ChooseFaults(100, 1e5, m, Flat, 3);
  REQUIRE(d.ok());
  CHECK(d->options[1].beyond_per_day == 0.0);
  CHECK(d->options[1].goodput > o1.goodput);
  m.takeover_s = -1;
  CHECK(ChooseFaults(100, 1e5, m, Flat, 3).status().code() == Code::kUsage);
}

TEST_CASE("choosing f: a larger f is chosen when failures overlap, and only while it pays") {
  FailureModel m;
  m.node_mtbf_s = 20 * 86400.0;  // 1,000 nodes: 50 failures a day
  m.repair_s = 6 * 3600.0;       // 12.5 nodes down on average
  auto c = ChooseFaults(1000, 1e7, m, Flat, 32);
  REQUIRE(c.ok());
  CHECK(c->f >= 13);  // f must cover about the mean number down, and then some
  for (size_t i = 1; i < c->options.size(); ++i) CHECK(c->options[i].p_beyond <= c->options[i - 1].p_beyond);
  // A cost per f (a slower plan for larger f) pulls the choice down.
  auto costly = [](int f, int nodes) -> Result<double> { return 1000.0 / nodes * (1 + 0.05 * f); };
  auto d = ChooseFaults(1000, 1e7, m, costly, 32);
  REQUIRE(d.ok());
  CHECK(d->f < c->f);
}

TEST_CASE("choosing f: failures faster than recoveries are refused with one line") {
  FailureModel m;
  m.node_mtbf_s = 60;  // 1,000 nodes: a failure every 60 ms
  m.restart_s = 600;
  m.recovery_s = 5;
  m.repair_s = 0;  // (with the default hour, every node would be out at once)
  auto c = ChooseFaults(1000, 1e6, m, Flat, 8);
  REQUIRE(!c.ok());
  CHECK(c.status().code() == Code::kConfig);
  CHECK_THAT(c.status().message(), Catch::Contains("fail every") && Catch::Contains("no f up to"));
  CHECK_THAT(c.status().message(), Catch::Contains("recoveries (5.0 s each) take"));
  CHECK(c.status().message().find('\n') == std::string::npos);
  // The cost that ate the time is the one named: not the recoveries when a
  // one-second horizon makes a checkpoint every second (it said "fail every
  // 6.0 h, faster than the recoveries" for both of these), nor when the
  // nodes stay out for years.
  FailureModel short_run;
  short_run.node_mtbf_s = 86400;
  short_run.horizon_s = 1;
  short_run.checkpoint_s = 5;
  auto h = ChooseFaults(4, 1e6, short_run, Flat, 3);
  REQUIRE(!h.ok());
  CHECK_THAT(h.status().message(), Catch::Contains("checkpoints (5.0 s each, every 1.0 s) 500%"));
  FailureModel unrepaired;
  unrepaired.node_mtbf_s = 86400;
  unrepaired.repair_s = 1e6 * 86400;
  auto r = ChooseFaults(4, 1e6, unrepaired, Flat, 3);
  REQUIRE(!r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("stay out 1000000.0 d each (--repair-time): on average all are out"));
}

TEST_CASE("choosing f: f stops where the planner can place no more pipelines") {
  // 6 nodes, 2-node templates at least: f + 1 ≤ 3 pipelines, so f ≤ 2.
  auto iteration = [](int f, int nodes) -> Result<double> {
    if (f + 1 > nodes / 2) return Status::Config("f = " + std::to_string(f) + " needs more nodes");
    return 100.0 / nodes;
  };
  FailureModel m;
  m.node_mtbf_s = 2 * 86400.0;
  m.repair_s = 86400;  // 3 nodes down on average: more than any plan here covers
  auto c = ChooseFaults(6, 1e5, m, iteration, 8);
  REQUIRE(c.ok());
  REQUIRE(c->options.size() == 4);
  CHECK_FALSE(c->options[3].feasible);
  CHECK_THAT(c->options[3].why, Catch::Contains("needs more nodes"));
  CHECK(c->f <= 2);
  CHECK_THAT(ExplainFaultChoice(*c, m, 6), Catch::Contains("<- chosen") && Catch::Contains("not plannable"));
}

TEST_CASE("choosing f on real templates: a uniform GPT problem") {
  auto iteration = [](int f, int nodes) -> Result<double> {
    Problem p = testing::UniformProblem(8, nodes, f, 64);
    OB_ASSIGN_OR_RETURN(auto ts, BuildTemplates(p));
    OB_ASSIGN_OR_RETURN(auto inst, Instantiate(p, ts));
    return inst.iteration_seconds;
  };
  FailureModel m;
  m.node_mtbf_s = 2 * 86400.0;
  m.repair_s = 2 * 3600.0;  // 16 nodes: 8 failures a day, 0.67 down on average
  auto c = ChooseFaults(16, 64 * 1024, m, iteration, 8);
  REQUIRE(c.ok());
  CHECK(c->f >= 1);
  CHECK(c->options[static_cast<size_t>(c->f)].goodput >= c->options[0].goodput);
}

TEST_CASE("durations parse with their units, and nothing else does") {
  CHECK(*ParseDuration("90", "--x") == 90);
  CHECK(*ParseDuration("90s", "--x") == 90);
  CHECK(*ParseDuration("45m", "--x") == 2700);
  CHECK(*ParseDuration("7.9h", "--x") == Approx(7.9 * 3600));
  CHECK(*ParseDuration("30d", "--x") == 30 * 86400);
  CHECK(*ParseDuration(".5h", "--x") == 1800);
  CHECK(*ParseDuration("1e3s", "--x") == 1000);
  // Hex, signs, spaces, nan and inf (strtod takes them all), and a number
  // that only overflows once scaled (it printed as inf in ob-sim's JSON).
  for (const char* bad : {"", "h", "5y", "-3h", "1e999", "3 h", "0x10", " 5", "+5", "nan", "inf", "1e308d"}) {
    INFO(bad);
    auto r = ParseDuration(bad, "--node-mtbf");
    REQUIRE(!r.ok());
    CHECK(r.status().code() == Code::kUsage);
    CHECK_THAT(r.status().message(), Catch::StartsWith("--node-mtbf '"));
  }
}

}  // namespace ob::plan
