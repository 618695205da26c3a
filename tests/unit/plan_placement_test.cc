// Placement on a measured bandwidth matrix, the 1F1B simulation and its SVG
// (design/plan.md). Templates and instantiations are built by hand here, so these
// tests exercise placement and scheduling alone.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "ob/plan/instantiation.h"
#include "ob/plan/placement.h"
#include "ob/plan/plan_io.h"
#include "ob/plan/schedule.h"
#include "ob/plan/templates.h"
#include "plan_testing.h"

namespace ob::plan {
namespace {

// A template of n nodes, k stages per node, layers split as evenly as
// possible (earlier stages get the extra layers); costs as templates.h says.
Template HandTemplate(const Problem& p, int n, int k = 1) {
  Template t;
  t.nodes = n;
  t.stages_per_node = k;
  t.tp = p.cluster.gpus_per_node / k;
  const int S = n * k, L = p.num_layers();
  REQUIRE(S <= L);
  int first = 0;
  for (int i = 0; i < S; ++i) {
    const int count = L / S + (i < L % S ? 1 : 0);
    StageShape st{first, first + count - 1, t.tp};
    first += count;
    t.stages.push_back(st);
    const double w = StageComputeSeconds(p, st.first, st.last, st.tp) + StageBoundarySeconds(p, st.last, (i + 1) % k == 0);
    t.stage_seconds.push_back(w);
    t.stage_memory.push_back(StageMemoryBytes(p, st.first, st.last, st.tp, S - i));
    t.bottleneck = std::max(t.bottleneck, w);
    t.total += w;
  }
  return t;
}

TemplateSet HandSet(const Problem& p, int min_nodes, int max_nodes, int k = 1) {
  TemplateSet ts;
  ts.min_nodes = min_nodes;
  for (int n = min_nodes; n <= max_nodes; ++n) ts.templates.push_back(HandTemplate(p, n, k));
  return ts;
}

// Pipelines of the given sizes over nodes 0.. in order, micro-batches spread
// evenly.
Instantiation HandInstantiation(const Problem& p, const std::vector<int>& sizes) {
  Instantiation inst;
  int node = 0;
  for (size_t j = 0; j < sizes.size(); ++j) {
    PipelineInstance pi;
    pi.template_nodes = sizes[j];
    for (int q = 0; q < sizes[j]; ++q) pi.nodes.push_back(node++);
    pi.microbatches = p.microbatches / static_cast<int>(sizes.size()) +
                      (static_cast<int>(j) < p.microbatches % static_cast<int>(sizes.size()) ? 1 : 0);
    inst.pipelines.push_back(pi);
  }
  return inst;
}

BandwidthMatrix UniformMatrix(int n, double bytes_per_s, double latency) {
  BandwidthMatrix bw;
  bw.nodes = n;
  bw.bytes_per_s.assign(n * n, bytes_per_s);
  bw.latency.assign(n * n, latency);
  return bw;
}

void SetLink(BandwidthMatrix* bw, int a, int b, double bytes_per_s) {
  bw->bytes_per_s[a * bw->nodes + b] = bytes_per_s;
  bw->bytes_per_s[b * bw->nodes + a] = bytes_per_s;
}

std::vector<int> AllNodes(const Instantiation& inst) {
  std::vector<int> v;
  for (const auto& pi : inst.pipelines) v.insert(v.end(), pi.nodes.begin(), pi.nodes.end());
  return v;
}

pb::NetworkMatrix ProfileMatrix(int n) {
  pb::NetworkMatrix m;
  for (int i = 0; i < n; ++i) m.add_hosts("h" + std::to_string(i));
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d) {
      if (s == d) continue;
      auto* l = m.add_links();
      l->set_src(s);
      l->set_dst(d);
      l->set_bandwidth_bytes_per_s(1e9 * (1 + s + d));
      l->set_latency_seconds(1e-6 * (1 + s));
    }
  return m;
}

}  // namespace

TEST_CASE("matrix from a network profile", "[plan][placement]") {
  auto m = ProfileMatrix(3);
  auto bw = MatrixFromProfile(m, 3);
  REQUIRE(bw.ok());
  CHECK(bw->nodes == 3);
  CHECK(bw->Bandwidth(2, 1) == 4e9);
  CHECK(bw->Latency(2, 1) == Approx(3e-6));
  // Off-diagonal bandwidths {2,3,2,4,3,4}e9 and latencies {1,1,2,2,3,3}e-6.
  CHECK(bw->MedianBandwidth() == Approx(3e9));
  CHECK(bw->MedianLatency() == Approx(2e-6));

  auto wrong = MatrixFromProfile(m, 16);
  REQUIRE(!wrong.ok());
  CHECK(wrong.status().code() == Code::kDataErr);
  CHECK(wrong.status().message() == "bandwidth matrix has 3 hosts, the cluster 16");

  auto missing = m;
  missing.mutable_links()->DeleteSubrange(2, 1);  // h1 -> h0
  auto r = MatrixFromProfile(missing, 3);
  REQUIRE(!r.ok());
  CHECK(r.status().code() == Code::kDataErr);
  CHECK_THAT(r.status().message(), Catch::Contains("h1 -> h0"));

  auto zero = m;
  zero.mutable_links(3)->set_bandwidth_bytes_per_s(0);  // h1 -> h2
  r = MatrixFromProfile(zero, 3);
  REQUIRE(!r.ok());
  CHECK(r.status().code() == Code::kDataErr);
  CHECK_THAT(r.status().message(), Catch::Contains("h1 -> h2"));

  auto out_of_range = m;
  out_of_range.mutable_links(0)->set_dst(7);
  CHECK(MatrixFromProfile(out_of_range, 3).status().code() == Code::kDataErr);
  auto twice = m;
  *twice.add_links() = m.links(0);
  CHECK(MatrixFromProfile(twice, 3).status().code() == Code::kDataErr);
}

TEST_CASE("placed cost on nominal links is the template's", "[plan][placement]") {
  auto p = testing::UniformProblem(6, 4, 0, 12, 2);
  for (int k : {1, 2}) {
    const TemplateSet ts = HandSet(p, 4, 4, k);
    const Instantiation inst = HandInstantiation(p, {4});
    const auto bw = UniformMatrix(4, p.cluster.link_bytes_per_s, p.cluster.link_latency);
    CHECK(PlacedIterationSeconds(p, ts, inst, bw) == Approx(ts.templates[0].Seconds(12)));
    // A 5× slower link between the pipeline's nodes 1 and 2 costs the stage
    // before it 2·bytes·(5 − 1)/B, once per micro-batch at least.
    auto slow = bw;
    SetLink(&slow, 1, 2, p.cluster.link_bytes_per_s / 5);
    const double bytes = static_cast<double>(p.layers[ts.templates[0].stages[2 * k - 1].last].output_bytes);
    const double extra = 8 * bytes / p.cluster.link_bytes_per_s;
    CHECK(PlacedIterationSeconds(p, ts, inst, slow) >= ts.templates[0].Seconds(12) + extra * 0.999);
    // One not used as a pipeline boundary (only one pipeline: no ring) costs nothing.
    auto unused = bw;
    SetLink(&unused, 0, 3, p.cluster.link_bytes_per_s / 5);
    CHECK(PlacedIterationSeconds(p, ts, inst, unused) == Approx(ts.templates[0].Seconds(12)));
  }
}

TEST_CASE("the data-parallel ring runs at its slowest link", "[plan][placement]") {
  auto p = testing::UniformProblem(2, 4, 1, 8);  // 4 layers
  const TemplateSet ts = HandSet(p, 2, 2);
  const Instantiation inst = HandInstantiation(p, {2, 2});
  auto bw = UniformMatrix(4, p.cluster.link_bytes_per_s, 0);
  p.cluster.link_latency = 0;
  const double base = PlacedIterationSeconds(p, ts, inst, bw);
  // Nodes 0 and 2 hold layers 0-1 in the two pipelines; slowing their link
  // slows those rings by 2·(P−1)/P·bytes·(1/B' − 1/B).
  SetLink(&bw, 0, 2, p.cluster.link_bytes_per_s / 4);
  const double grad = static_cast<double>(p.layers[0].gradient_bytes + p.layers[1].gradient_bytes);
  const double extra = grad * (4 - 1) / p.cluster.link_bytes_per_s;
  CHECK(PlacedIterationSeconds(p, ts, inst, bw) == Approx(base + extra));
}

TEST_CASE("placement avoids slow links at pipeline boundaries", "[plan][placement]") {
  // 16 nodes, 4 pipelines of 4; 64 MiB boundary activations make every
  // boundary worth about as much as a stage's compute.
  auto p = testing::UniformProblem(8, 16, 3, 32);
  for (int l = 0; l + 1 < p.num_layers(); ++l) p.layers[l].output_bytes = 64ull << 20;
  const TemplateSet ts = HandSet(p, 4, 4);
  const Instantiation identity = HandInstantiation(p, {4, 4, 4, 4});
  auto bw = UniformMatrix(16, p.cluster.link_bytes_per_s, p.cluster.link_latency);
  const std::vector<std::pair<int, int>> slow = {{1, 2}, {9, 10}};  // boundaries of pipelines 0, 2
  for (auto [a, b] : slow) SetLink(&bw, a, b, p.cluster.link_bytes_per_s / 5);

  PlacementOptions opts;
  opts.seed = 7;
  const auto start = std::chrono::steady_clock::now();
  const Instantiation placed = Place(p, ts, identity, bw, opts);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 1.0);

  const double before = PlacedIterationSeconds(p, ts, identity, bw);
  const double after = PlacedIterationSeconds(p, ts, placed, bw);
  CHECK(after <= 0.9 * before);
  WARN("identity " << before << " s, placed " << after << " s, " << seconds << " s to place");
  // The same nodes, each once, in the same pipelines shapes.
  auto nodes = AllNodes(placed);
  std::sort(nodes.begin(), nodes.end());
  CHECK(nodes == AllNodes(identity));
  REQUIRE(placed.pipelines.size() == identity.pipelines.size());
  for (size_t j = 0; j < placed.pipelines.size(); ++j) {
    CHECK(placed.pipelines[j].template_nodes == identity.pipelines[j].template_nodes);
    CHECK(placed.pipelines[j].microbatches == identity.pipelines[j].microbatches);
  }
  for (const auto& pi : placed.pipelines)
    for (size_t q = 0; q + 1 < pi.nodes.size(); ++q)
      for (auto [a, b] : slow) {
        const std::set<int> link{pi.nodes[q], pi.nodes[q + 1]};
        CHECK(link != std::set<int>{a, b});
      }
  // Reproducible from the seed.
  const Instantiation again = Place(p, ts, identity, bw, opts);
  for (size_t j = 0; j < placed.pipelines.size(); ++j)
    CHECK(again.pipelines[j].nodes == placed.pipelines[j].nodes);
}

TEST_CASE("placement is never worse than the given order", "[plan][placement]") {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    testing::RandomProblemOptions o;
    o.max_nodes = 12;
    auto p = testing::RandomProblem(seed, o);
    std::mt19937_64 rng(seed);
    // Pipelines of 1..layers nodes covering every node.
    std::vector<int> sizes;
    for (int left = p.cluster.nodes; left > 0;) {
      const int n = std::uniform_int_distribution<int>(1, std::min(left, p.num_layers()))(rng);
      sizes.push_back(n);
      left -= n;
    }
    p.microbatches = std::max<int>(p.microbatches, static_cast<int>(sizes.size()));
    const int hi = *std::max_element(sizes.begin(), sizes.end());
    const TemplateSet ts = HandSet(p, 1, hi);
    const Instantiation inst = HandInstantiation(p, sizes);
    BandwidthMatrix bw = UniformMatrix(p.cluster.nodes, 0, 0);
    for (auto& b : bw.bytes_per_s) b = std::uniform_real_distribution<double>(0.5e9, 25e9)(rng);
    for (auto& l : bw.latency) l = std::uniform_real_distribution<double>(1e-6, 1e-4)(rng);
    PlacementOptions opts;
    opts.seed = seed;
    opts.moves = 2000;
    const Instantiation placed = Place(p, ts, inst, bw, opts);
    INFO("seed " << seed);
    CHECK(PlacedIterationSeconds(p, ts, placed, bw) <= PlacedIterationSeconds(p, ts, inst, bw));
    auto nodes = AllNodes(placed);
    std::sort(nodes.begin(), nodes.end());
    CHECK(nodes == AllNodes(inst));
  }
}

TEST_CASE("1F1B makespan of a uniform pipeline without transfers", "[plan][schedule]") {
  for (int S : {1, 2, 4, 7})
    for (int m : {1, 3, 4, 16}) {
      Problem p;
      for (int l = 0; l < S; ++l) {
        LayerCost c;
        c.forward = 1e-3;
        c.backward = 2.5e-3;
        p.layers.push_back(c);  // output_bytes 0
      }
      p.cluster.nodes = S;
      p.cluster.link_latency = 0;
      p.microbatches = m;
      const TemplateSet ts = HandSet(p, S, S);
      std::vector<int> nodes(S);
      for (int i = 0; i < S; ++i) nodes[i] = i;
      const auto ops = SimulatePipeline(p, ts.templates[0], m, nodes, nullptr);
      REQUIRE(ops.size() == static_cast<size_t>(2 * S * m));
      double makespan = 0;
      for (const auto& op : ops) makespan = std::max(makespan, op.end);
      INFO("S " << S << " m " << m);
      CHECK(makespan == Approx((m + S - 1) * 3.5e-3));
    }
}

// S uniform stages (forward 1 ms, backward 2.5 ms at the profile's
// concurrency), no transfers, a local cluster with `curve`.
Problem SharedProblem(int layers, int nodes, int gpus_per_node, int microbatches, std::vector<double> curve) {
  Problem p;
  for (int l = 0; l < layers; ++l) {
    LayerCost c;
    c.forward = 1e-3;
    c.backward = 2.5e-3;
    p.layers.push_back(c);
  }
  p.cluster.nodes = nodes;
  p.cluster.gpus_per_node = gpus_per_node;
  p.cluster.link_latency = 0;
  p.cluster.local = true;
  p.cluster.contention = std::move(curve);
  p.microbatches = microbatches;
  return p;
}

TEST_CASE("contention slowdown: the curve, then k / n beyond it", "[plan][schedule]") {
  CHECK(ContentionSlowdown({}, 5) == 1.0);
  const std::vector<double> curve{1.0, 1.2, 1.8};
  CHECK(ContentionSlowdown(curve, 0) == 1.0);
  CHECK(ContentionSlowdown(curve, 1) == 1.0);
  CHECK(ContentionSlowdown(curve, 2) == 1.2);
  CHECK(ContentionSlowdown(curve, 3) == 1.8);
  CHECK(ContentionSlowdown(curve, 6) == Approx(3.6));
}

TEST_CASE("shared cores: an op computing alone runs at its speed alone", "[plan][schedule]") {
  // One pipeline of 2 stages on 2 processes, profiled with both computing
  // (slowdown 2). m = 1: the four ops run one at a time, each in half its
  // profiled time.
  Problem p = SharedProblem(2, 2, 1, 1, {1.0, 2.0});
  const TemplateSet ts = HandSet(p, 2, 2);
  Instantiation inst = HandInstantiation(p, {2});
  PipelineTimes one = TimePipelines(p, ts, inst);
  REQUIRE(one.seconds.size() == 1);
  CHECK(one.seconds[0] == Approx(3.5e-3));
  CHECK(PipelineSeconds(p, ts.templates[0], 1) == Approx(7e-3));  // the closed form: profiled speed
  CHECK(one.busy == Approx(3.5e-3));
  // m = 2, by hand (ms; alone: forward 0.5, backward 1.25): s0 F0 alone
  // 0-0.5; s0 F1 and s1 F0 together 0.5-1.5; s1 B0 alone 1.5-2.75; s0 B0
  // and s1 F1 from 2.75, F1 ends 3.75; s1 B1 joins B0, which ends 5.25;
  // B1 alone to 5.75; s0 B1 alone to 7.0. The closed form: 10.5.
  p.microbatches = 2;
  inst = HandInstantiation(p, {2});
  const PipelineTimes two = TimePipelines(p, ts, inst);
  CHECK(two.seconds[0] == Approx(7.0e-3));
  CHECK(SlowestPipelineSeconds(p, ts, inst) == Approx(7.0e-3));
  // Each stage computes 5.25 ms of the 7 (stage 0: 0.5 + 1.0 + 2.5 + 1.25;
  // stage 1: 1.0 + 1.25 + 1.0 + 2.0), which the plan keeps per stage.
  REQUIRE(two.stage_busy.size() == 1);
  REQUIRE(two.stage_busy[0].size() == 2);
  CHECK(two.stage_busy[0][0] == Approx(5.25e-3));
  CHECK(two.stage_busy[0][1] == Approx(5.25e-3));
  CHECK(two.busy == Approx(10.5e-3));
  inst.iteration_seconds = SlowestPipelineSeconds(p, ts, inst);
  pb::Plan plan;
  SetInstantiation(p, ts, inst, &plan);
  REQUIRE(plan.instantiation().pipelines(0).stage_compute_seconds_size() == 2);
  CHECK(plan.instantiation().pipelines(0).stage_compute_seconds(1) == Approx(5.25e-3));
  CHECK(plan.instantiation().bubble_fraction() == Approx(1 - 10.5 / 14.0));
  CHECK(PipelineSeconds(p, ts.templates[0], 2) == Approx(10.5e-3));
  // Without a curve, the closed form, and no per-stage figures in the plan.
  p.cluster.contention.clear();
  CHECK(SlowestPipelineSeconds(p, ts, inst) == Approx(10.5e-3));
  SetInstantiation(p, ts, inst, &plan);
  CHECK(plan.instantiation().pipelines(0).stage_compute_seconds_size() == 0);
}

TEST_CASE("shared cores: processes that always compute keep the profile's times", "[plan][schedule]") {
  // 4 one-stage pipelines, 4 processes, profiled with 4 computing.
  Problem p = SharedProblem(3, 4, 1, 8, {1.0, 1.3, 2.0, 2.6});
  TemplateSet ts = HandSet(p, 1, 1);
  Instantiation inst = HandInstantiation(p, {1, 1, 1, 1});
  PipelineTimes t = TimePipelines(p, ts, inst);
  REQUIRE(t.seconds.size() == 4);
  for (double s : t.seconds) CHECK(s == Approx(PipelineSeconds(p, ts.templates[0], 2)));
  // 2 one-stage pipelines of 2 processes each (tensor parallel): a stage
  // counts both of its processes, so 4 compute at all times.
  p = SharedProblem(3, 2, 2, 8, {1.0, 1.3, 2.0, 2.6});
  ts = HandSet(p, 1, 1);
  REQUIRE(ts.templates[0].stages[0].tp == 2);
  inst = HandInstantiation(p, {1, 1});
  t = TimePipelines(p, ts, inst);
  for (double s : t.seconds) CHECK(s == Approx(PipelineSeconds(p, ts.templates[0], 4)));
  // The step's tail is added after the ops.
  p.cluster.local_step = {1e-3, 0};
  inst = HandInstantiation(p, {1, 1});
  CHECK(SlowestPipelineSeconds(p, ts, inst) == Approx(PipelineSeconds(p, ts.templates[0], 4)));
  CHECK(StepTailSeconds(p, ts.templates[0]) > 0);
}

TEST_CASE("shared cores: the workers' programs, whose messages meet as a rendezvous", "[plan][schedule]") {
  // Without contention (a flat curve) the replay is never faster than
  // 1F1B started as soon as inputs arrive (the rendezvous only adds waits)
  // and never slower than everything one after another.
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    Problem p = testing::RandomProblem(seed);
    const int n = std::min(p.cluster.nodes, p.num_layers() / p.cluster.gpus_per_node);
    if (n < 1) continue;
    p.cluster.local = true;
    p.cluster.contention = {1.0, 1.0};
    p.cluster.gpus_per_node = 1;
    const TemplateSet ts = HandSet(p, n, n);
    const Template& t = ts.templates[0];
    const int m = std::max(1, std::min(p.microbatches, 12));
    Instantiation inst;
    PipelineInstance pi;
    pi.template_nodes = n;
    for (int q = 0; q < n; ++q) pi.nodes.push_back(q);
    pi.microbatches = m;
    inst.pipelines.push_back(pi);
    const double replay = TimePipelines(p, ts, inst).seconds.at(0) - StepTailSeconds(p, t);
    double async = 0, serial = 0;
    for (const auto& op : SimulatePipeline(p, t, m, pi.nodes, nullptr)) {
      async = std::max(async, op.end);
      serial += op.end - op.start;
    }
    for (size_t i = 0; i + 1 < t.stages.size(); ++i) serial += m * StageBoundarySeconds(p, t.stages[i].last, true);
    INFO("seed " << seed << " stages " << t.stages.size() << " m " << m);
    CHECK(replay >= async * (1 - 1e-9));
    CHECK(replay <= serial * (1 + 1e-9));
  }
  // Two stages, one micro-batch, transfers of 1 ms each way: stage 0's
  // F0 (1 ms), a0 meets stage 1's posted receive at 1 and arrives at 2;
  // F0 and B0 of stage 1 (3.5 ms) to 5.5; g0 meets stage 0's posted
  // receive and arrives at 6.5; stage 0's B0 (2.5 ms) to 9.0.
  Problem p = SharedProblem(2, 2, 1, 1, {1.0, 1.0});
  p.cluster.link_latency = 1e-3;
  const TemplateSet ts = HandSet(p, 2, 2);
  REQUIRE(StageBoundarySeconds(p, 0, true) == Approx(2e-3));
  CHECK(TimePipelines(p, ts, HandInstantiation(p, {2})).seconds[0] == Approx(9.0e-3));
}

TEST_CASE("1F1B ops respect dependencies and memory", "[plan][schedule]") {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    auto p = testing::RandomProblem(seed);
    const int n = std::min(p.cluster.nodes, p.num_layers() / p.cluster.gpus_per_node);
    if (n < 1) continue;
    const int k = p.cluster.gpus_per_node;
    const Template t = HandTemplate(p, n, k);
    std::vector<int> nodes(n);
    for (int q = 0; q < n; ++q) nodes[q] = n - 1 - q;
    BandwidthMatrix bw = UniformMatrix(p.cluster.nodes, 3e9, 2e-5);
    const int m = p.microbatches, S = static_cast<int>(t.stages.size());
    const auto ops = SimulatePipeline(p, t, m, nodes, &bw);
    REQUIRE(ops.size() == static_cast<size_t>(2 * S * m));
    std::map<std::tuple<int, int, bool>, ScheduledOp> by;
    for (const auto& op : ops) by[{op.stage, op.microbatch, op.forward}] = op;
    REQUIRE(by.size() == ops.size());
    for (const auto& op : ops) {
      CHECK(op.end > op.start);
      if (op.forward && op.stage > 0)
        CHECK(op.start >= by[{op.stage - 1, op.microbatch, true}].end);
      if (!op.forward) {
        CHECK(op.start >= by[{op.stage, op.microbatch, true}].end);
        if (op.stage + 1 < S) CHECK(op.start >= by[{op.stage + 1, op.microbatch, false}].end);
      }
    }
    // One op at a time per stage, and at most S − i micro-batches in flight.
    for (int i = 0; i < S; ++i) {
      std::vector<ScheduledOp> lane;
      for (const auto& op : ops)
        if (op.stage == i) lane.push_back(op);
      std::sort(lane.begin(), lane.end(),
                [](const ScheduledOp& a, const ScheduledOp& b) { return a.start < b.start; });
      int in_flight = 0;
      for (size_t j = 0; j < lane.size(); ++j) {
        if (j > 0) CHECK(lane[j].start >= lane[j - 1].end - 1e-12);
        in_flight += lane[j].forward ? 1 : -1;
        CHECK(in_flight <= S - i);
        CHECK(in_flight >= 0);
      }
    }
  }
}

TEST_CASE("schedule SVG has a lane per stage", "[plan][schedule]") {
  auto p = testing::UniformProblem(6, 5, 1, 10);
  const TemplateSet ts = HandSet(p, 2, 3);
  const Instantiation inst = HandInstantiation(p, {3, 2});
  const auto bw = UniformMatrix(5, p.cluster.link_bytes_per_s, p.cluster.link_latency);
  for (const BandwidthMatrix* m : {static_cast<const BandwidthMatrix*>(nullptr), &bw}) {
    const std::string svg = ScheduleSvg(p, ts, inst, m);
    CHECK(svg.rfind("<svg", 0) == 0);
    CHECK(svg.find("</svg>") == svg.size() - std::string("</svg>\n").size());
    size_t lanes = 0;
    for (size_t at = 0; (at = svg.find("class=\"lane\"", at)) != std::string::npos; ++at) ++lanes;
    CHECK(lanes == 5);
    CHECK_THAT(svg, Catch::Contains("pipeline 1 stage 1"));
    CHECK_THAT(svg, Catch::Contains("time (ms)"));
    // Well-formed enough: tags balance.
    size_t open = 0, close = 0;
    for (char c : svg) open += c == '<', close += c == '>';
    CHECK(open == close);
  }
}

}  // namespace ob::plan

namespace ob::plan {

TEST_CASE("placement of a planned instantiation avoids slow links", "[plan][placement]") {
  // The same scenario through BuildTemplates and Instantiate: slow down one
  // boundary link in each of two pipelines of the plan as instantiated.
  auto p = testing::UniformProblem(8, 16, 3, 32);
  for (int l = 0; l + 1 < p.num_layers(); ++l) p.layers[l].output_bytes = 64ull << 20;
  p.cluster.gpu_memory = 500ull << 20;  // pipelines of at least 3 nodes
  auto ts = BuildTemplates(p);
  REQUIRE(ts.ok());
  auto inst = Instantiate(p, *ts);
  REQUIRE(inst.ok());
  std::vector<std::pair<int, int>> slow;
  for (const auto& pi : inst->pipelines)
    if (pi.nodes.size() >= 2 && slow.size() < 2) slow.emplace_back(pi.nodes[0], pi.nodes[1]);
  REQUIRE(ts->min_nodes >= 2);
  REQUIRE(slow.size() == 2);
  auto bw = UniformMatrix(16, p.cluster.link_bytes_per_s, p.cluster.link_latency);
  for (auto [a, b] : slow) SetLink(&bw, a, b, p.cluster.link_bytes_per_s / 5);

  PlacementOptions opts;
  const Instantiation placed = Place(p, *ts, *inst, bw, opts);
  CHECK(PlacedIterationSeconds(p, *ts, placed, bw) <= 0.9 * PlacedIterationSeconds(p, *ts, *inst, bw));
  for (const auto& pi : placed.pipelines)
    for (size_t q = 0; q + 1 < pi.nodes.size(); ++q)
      for (auto [a, b] : slow) CHECK(std::set<int>{pi.nodes[q], pi.nodes[q + 1]} != std::set<int>{a, b});
  // On the nominal links, placement changes nothing that matters.
  const auto nominal = UniformMatrix(16, p.cluster.link_bytes_per_s, p.cluster.link_latency);
  CHECK(PlacedIterationSeconds(p, *ts, Place(p, *ts, *inst, nominal, opts), nominal) ==
        Approx(PlacedIterationSeconds(p, *ts, *inst, nominal)));
}

}  // namespace ob::plan
