#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>
#include <optional>

#include "ob/plan/recovery.h"
#include "ob/plan/templates.h"
#include "ob/schedule/schedule.h"
#include "plan_testing.h"

namespace ob::plan {
namespace {

// A template's score under the header's objective, found by brute force.
struct Score {
  double bottleneck = 0, total = 0;
  double expected = 0;  // total + (m − 1)·bottleneck + StepTailSeconds at m = M·n/N
};

bool Close(double a, double b) { return std::abs(a - b) <= 1e-12 * std::max(std::abs(a), std::abs(b)); }

// For every k whose t = g/k splits the model (t divides the heads and the
// MLP width), every composition of the layers into S = n·k stages under the
// 1F1B memory rule, the best by (max w, Σw); then, across the k, the least
// expected time for the pipeline's share of the batch (ties: (max w, Σw)).
std::optional<Score> ExhaustiveBest(const Problem& p, int nodes) {
  const int L = p.num_layers(), g = p.cluster.gpus_per_node;
  const double m = std::max(1.0, static_cast<double>(p.microbatches) * nodes / p.cluster.nodes);
  std::optional<Score> best;
  for (int k = 1; k <= g; ++k) {
    if (g % k) continue;
    const int S = nodes * k, tp = g / k;
    if (S > L) continue;
    if (tp > 1 && (p.n_head % tp != 0 || (4 * p.n_embd) % tp != 0)) continue;
    std::optional<Template> best_k;
    for (uint32_t cuts = 0; cuts < (1u << (L - 1)); ++cuts) {
      if (__builtin_popcount(cuts) != S - 1) continue;
      Template t;
      t.nodes = nodes;
      t.stages_per_node = k;
      t.tp = tp;
      std::vector<uint64_t> node_grad(nodes, 0);
      bool fits = true;
      for (int i = 0, first = 0; i < S; ++i) {
        int last = first;
        while (last < L - 1 && !(cuts >> last & 1)) ++last;
        fits = fits && StageFits(p, first, last, tp, S - i);
        const double w = StageComputeSeconds(p, first, last, tp) + StageBoundarySeconds(p, last, (i + 1) % k == 0);
        t.stages.push_back({first, last, tp});
        t.bottleneck = std::max(t.bottleneck, w);
        t.total += w;
        double update = 0;
        for (int l = first; l <= last; ++l) {
          node_grad[i / k] += p.layers[l].gradient_bytes;
          update += p.layers[l].update / tp;
        }
        t.update_seconds = std::max(t.update_seconds, update);
        first = last + 1;
      }
      if (!fits) continue;
      t.node_gradient_bytes = *std::max_element(node_grad.begin(), node_grad.end());
      if (!best_k || t.bottleneck < best_k->bottleneck ||
          (t.bottleneck == best_k->bottleneck && t.total < best_k->total))
        best_k = t;
    }
    if (!best_k) continue;
    Score s{best_k->bottleneck, best_k->total,
            best_k->total + (m - 1) * best_k->bottleneck + StepTailSeconds(p, *best_k)};
    if (!best || s.expected < best->expected ||
        (s.expected == best->expected &&
         (s.bottleneck < best->bottleneck || (s.bottleneck == best->bottleneck && s.total < best->total))))
      best = s;
  }
  return best;
}

// The template is a valid partition whose recorded figures match the model.
void CheckConsistent(const Problem& p, const Template& t) {
  const int g = p.cluster.gpus_per_node;
  REQUIRE(t.stages_per_node * t.tp == g);
  REQUIRE(static_cast<int>(t.stages.size()) == t.nodes * t.stages_per_node);
  const int S = static_cast<int>(t.stages.size());
  double max_w = 0, sum_w = 0;
  std::vector<uint64_t> node_grad(t.nodes, 0);
  int next = 0;
  for (int i = 0; i < S; ++i) {
    const StageShape& s = t.stages[i];
    CHECK(s.first == next);
    CHECK(s.last >= s.first);
    CHECK(s.tp == t.tp);
    next = s.last + 1;
    const double w = StageComputeSeconds(p, s.first, s.last, s.tp) +
                     StageBoundarySeconds(p, s.last, (i + 1) % t.stages_per_node == 0);
    CHECK(t.stage_seconds[i] == w);
    CHECK(t.stage_memory[i] == StageMemoryBytes(p, s.first, s.last, s.tp, S - i));
    CHECK(t.stage_memory[i] <= p.cluster.gpu_memory);
    max_w = std::max(max_w, w);
    sum_w += w;
    for (int l = s.first; l <= s.last; ++l) {
      node_grad[i / t.stages_per_node] += p.layers[l].gradient_bytes;
      CHECK(t.StageOf(l) == i);
    }
  }
  CHECK(next == p.num_layers());
  CHECK(t.bottleneck == max_w);
  CHECK(Close(t.total, sum_w));
  CHECK(t.node_gradient_bytes == *std::max_element(node_grad.begin(), node_grad.end()));
  CHECK(t.StageOf(-1) == -1);
  CHECK(t.StageOf(p.num_layers()) == -1);
}

}  // namespace

TEST_CASE("BestTemplate equals exhaustive search over partitions and stages per node") {
  testing::RandomProblemOptions opts;
  opts.max_gpus_per_node = 4;
  int compared = 0, feasible = 0;
  for (uint64_t seed = 1; seed <= 250; ++seed) {
    const Problem p = testing::RandomProblem(seed, opts);
    INFO("seed " << seed);
    for (int n = 1; n <= std::min(p.num_layers(), p.cluster.nodes); ++n) {
      INFO("nodes " << n);
      const std::optional<Template> got = BestTemplate(p, n);
      const std::optional<Score> want = ExhaustiveBest(p, n);
      REQUIRE(got.has_value() == want.has_value());
      ++compared;
      if (!got) continue;
      ++feasible;
      CHECK(got->nodes == n);
      CHECK(Close(got->bottleneck, want->bottleneck));
      CHECK(Close(got->total, want->total));
      CheckConsistent(p, *got);
    }
  }
  CHECK(feasible > compared / 4);  // the generator exercises both outcomes
  CHECK(feasible < compared);
}

// Two GPUs a node, tensor-parallel all-reduces of 0.5 ms: one stage on both
// GPUs (t = 2) takes 24.8 ms a micro-batch; two stages of one GPU (t = 1)
// have a bottleneck of about 18.6 ms but 33.6 ms of fill and drain. A
// pipeline that runs one micro-batch pays only the fill and drain; one that
// runs eight pays the bottleneck seven more times.
TEST_CASE("a pipeline's share of the batch picks its template: fill and drain when it is small") {
  Problem p = testing::UniformProblem(4, 2, 0, 2, 2);
  p.cluster.intra_bytes_per_s = 2.0 * (1 << 20) / 0.5e-3;
  const std::optional<Template> few = BestTemplate(p, 1);  // M·n/N = 1 micro-batch
  REQUIRE(few.has_value());
  p.microbatches = 16;  // 8 each
  const std::optional<Template> many = BestTemplate(p, 1);
  REQUIRE(many.has_value());
  CHECK(few->tp == 2);
  CHECK(many->tp == 1);
  CHECK(few->Seconds(1) < many->Seconds(1));
  CHECK(many->Seconds(8) < few->Seconds(8));
  CHECK(many->bottleneck < few->bottleneck);  // what alone used to decide, at any batch
}

TEST_CASE("BuildTemplates covers n0 to N - f*n0 with the best template for each") {
  int built = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    const Problem p = testing::RandomProblem(seed);
    INFO("seed " << seed);
    const Result<TemplateSet> ts = BuildTemplates(p);
    int n0 = 0;
    for (int n = 1; n <= p.num_layers() && !n0; ++n)
      if (ExhaustiveBest(p, n)) n0 = n;
    if (!n0) {
      REQUIRE_FALSE(ts.ok());
      CHECK(ts.status().code() == Code::kConfig);
      continue;
    }
    if (p.cluster.nodes < n0 * (p.faults + 1)) {
      REQUIRE_FALSE(ts.ok());
      CHECK(ts.status().code() == Code::kConfig);
      CHECK_THAT(ts.status().message(),
                 Catch::Contains("needs at least " + std::to_string(n0 * (p.faults + 1)) + " nodes"));
      continue;
    }
    REQUIRE(ts.ok());
    ++built;
    CHECK(ts->min_nodes == n0);
    REQUIRE(!ts->templates.empty());
    CHECK(ts->max_nodes() <= p.cluster.nodes - p.faults * n0);
    for (int n = ts->min_nodes; n <= ts->max_nodes(); ++n) {
      const Template* t = ts->ForNodes(n);
      REQUIRE(t);
      const std::optional<Score> want = ExhaustiveBest(p, n);
      REQUIRE(want);
      CHECK(t->nodes == n);
      CHECK(Close(t->bottleneck, want->bottleneck));
      CHECK(Close(t->total, want->total));
      CheckConsistent(p, *t);
    }
    // It stops early only where a node count has no template.
    if (ts->max_nodes() < p.cluster.nodes - p.faults * n0) CHECK_FALSE(ExhaustiveBest(p, ts->max_nodes() + 1));
    CHECK(ts->ForNodes(n0 - 1) == nullptr);
    CHECK(ts->ForNodes(ts->max_nodes() + 1) == nullptr);
  }
  CHECK(built > 50);
}

TEST_CASE("every stage of every template fits in GPU memory") {
  testing::RandomProblemOptions opts;
  opts.max_layers = 24;
  opts.max_nodes = 16;
  opts.max_gpus_per_node = 8;
  for (uint64_t seed = 1000; seed < 1100; ++seed) {
    const Problem p = testing::RandomProblem(seed, opts);
    const Result<TemplateSet> ts = BuildTemplates(p);
    if (!ts.ok()) continue;
    for (const Template& t : ts->templates)
      for (size_t i = 0; i < t.stages.size(); ++i) {
        const StageShape& s = t.stages[i];
        const int in_flight = static_cast<int>(t.stages.size() - i);
        CHECK(StageMemoryBytes(p, s.first, s.last, s.tp, in_flight) <= p.cluster.gpu_memory);
        CHECK(t.stage_memory[i] <= p.cluster.gpu_memory);
      }
  }
}

TEST_CASE("the head's extra cost moves blocks to earlier stages") {
  // 16 blocks of 6 ms and a 9 ms head over 4 stages: 4 blocks per stage
  // would put 33 ms on the last stage; the optimum is 5 blocks (30 ms) at most
  // and no more than 3 blocks beside the head.
  const Problem p = testing::UniformProblem(16, 4, 0, 8);
  const std::optional<Template> t = BestTemplate(p, 4);
  REQUIRE(t);
  REQUIRE(t->stages.size() == 4);
  std::vector<int> blocks;
  for (const StageShape& s : t->stages) {
    blocks.push_back(0);
    for (int l = s.first; l <= s.last; ++l) blocks.back() += p.layers[l].is_block;
  }
  CHECK(*std::max_element(blocks.begin(), blocks.end()) == 5);
  CHECK(blocks.back() <= 3);
  CHECK(t->bottleneck == Approx(0.030).epsilon(0.01));
}

TEST_CASE("refuses when the model does not fit anywhere, naming the layer") {
  Problem p = testing::UniformProblem(8, 8, 0, 8);
  p.layers[3].state_bytes = 100ull << 30;  // one block larger than a GPU
  const Result<TemplateSet> ts = BuildTemplates(p);
  REQUIRE_FALSE(ts.ok());
  CHECK(ts.status().code() == Code::kConfig);
  CHECK_THAT(ts.status().message(), Catch::Contains("layer 3 does not fit"));
  CHECK_THAT(ts.status().message(), Catch::Contains("GiB per GPU"));
  CHECK(ts.status().message().find('\n') == std::string::npos);
}

TEST_CASE("refuses when N < n0*(f+1), saying how many nodes are needed") {
  Problem p = testing::UniformProblem(8, 5, 2, 16);
  // Roughly 4 blocks' state per GPU: n0 = 3 with one GPU per node.
  p.cluster.gpu_memory = 420ull << 20;
  const std::optional<Template> one = BestTemplate(p, 1);
  CHECK_FALSE(one);
  int n0 = 1;
  while (!BestTemplate(p, n0)) ++n0;
  REQUIRE(n0 > 1);
  const Result<TemplateSet> ts = BuildTemplates(p);
  REQUIRE_FALSE(ts.ok());
  CHECK(ts.status().code() == Code::kConfig);
  const std::string& msg = ts.status().message();
  CHECK_THAT(msg, Catch::StartsWith("needs at least " + std::to_string(3 * n0) + " nodes for f=2, n0=" +
                                    std::to_string(n0) + " (have 5)"));
  CHECK_THAT(msg, Catch::Contains("GiB per GPU n0 would be at most 1"));
  CHECK(msg.back() != '.');
}

TEST_CASE("a node of more GPUs than stages x tensor parallelism can use is refused, saying how many can") {
  // 4 blocks + embed + head = 6 layers, 4 heads: t <= 4, so at most 24 GPUs
  // a node; 32 said "no stage partition fits ... the model needs at least
  // 0.0 GiB per GPU".
  Problem p = testing::UniformProblem(4, 2, 0, 8, 32);
  p.n_head = 4;
  const Result<TemplateSet> ts = BuildTemplates(p);
  REQUIRE_FALSE(ts.ok());
  CHECK(ts.status().code() == Code::kConfig);
  CHECK(ts.status().message() ==
        "no layout uses a node's 32 GPUs: as stages × tensor parallelism, with a degree the model allows (at most "
        "4: it divides the 4 heads), a node needs at least 8 stages, and the model has 6 layers; plan for at most "
        "24 GPUs a node (--gpus-per-node)");
  p.cluster.gpus_per_node = 24;
  CHECK(BuildTemplates(p).ok());
}

TEST_CASE("templates use only tensor-parallel degrees the model splits by") {
  // gpt2-xl has 25 heads: on 8 GPUs a node only t = 1 (k = 8) can run it;
  // 12 heads take t = 1, 2 and 4 but not 8.
  for (int heads : {25, 12}) {
    Problem p = testing::UniformProblem(16, 4, 1, 8, 8);
    p.n_head = heads;
    p.n_embd = 64 * heads;
    const Result<TemplateSet> ts = BuildTemplates(p);
    REQUIRE(ts.ok());
    for (const Template& t : ts->templates) {
      INFO(heads << " heads, " << t.nodes << " node(s): tp " << t.tp);
      CHECK(heads % t.tp == 0);
      for (const auto& s : t.stages) CHECK(s.tp == t.tp);
    }
  }
}


namespace ob::plan {

// Issue 14's first known error: a boundary between two stages of one node
// was charged at the network's speed.
TEST_CASE("a boundary between two stages of one node costs the node's bandwidth, not the network's") {
  Problem p = testing::UniformProblem(6, 1, 0, 8, 2);
  p.tp = 1;  // two stages on the node, one GPU each
  p.cluster.link_bytes_per_s = 1e9;
  p.cluster.intra_bytes_per_s = 100e9;
  auto ts = BuildTemplates(p);
  REQUIRE(ts.ok());
  REQUIRE(ts->templates.size() == 1);
  const Template& t = ts->templates.front();
  REQUIRE(t.stages_per_node == 2);
  REQUIRE(t.stages.size() == 2);
  const StageShape& s = t.stages[0];
  const double compute = StageComputeSeconds(p, s.first, s.last, 1);
  CHECK(t.stage_seconds[0] == compute + BoundarySeconds(p, s.last, 100e9, p.cluster.link_latency));
  CHECK(t.stage_seconds[0] < compute + BoundarySeconds(p, s.last, 1e9, p.cluster.link_latency));
  // The last stage sends nothing on.
  CHECK(t.stage_seconds[1] == StageComputeSeconds(p, t.stages[1].first, t.stages[1].last, 1));
}

}  // namespace ob::plan

namespace ob::plan {
namespace {

// Every mixed or uniform template of `nodes` nodes (stages of the degrees
// `degrees`, each node's GPUs all used, no stage across nodes, each fitting
// with its 1F1B in-flight count), scored Σw + (m − 1)·max w.
double ExhaustiveMixed(const Problem& p, int nodes, double m, const std::vector<int>& degrees) {
  const int L = p.num_layers(), g = p.cluster.gpus_per_node;
  double best = std::numeric_limits<double>::infinity();
  std::vector<StageShape> stages;
  auto score = [&] {
    const int S = static_cast<int>(stages.size());
    double sum = 0, worst = 0;
    for (int i = 0; i < S; ++i) {
      const StageShape& s = stages[i];
      if (!StageFits(p, s.first, s.last, s.tp, S - i)) return;
      const bool crosses = i + 1 < S && stages[i + 1].node != s.node;
      const double w = StageComputeSeconds(p, s.first, s.last, s.tp) + StageBoundarySeconds(p, s.last, crosses);
      sum += w;
      worst = std::max(worst, w);
    }
    best = std::min(best, sum + (m - 1) * worst);
  };
  std::function<void(int, int, int)> walk = [&](int j, int q, int used) {
    if (j == L) {
      if (q == nodes) score();
      return;
    }
    if (q == nodes) return;
    for (int t : degrees) {
      if (used + t > g) continue;
      for (int e = j; e < L; ++e) {
        stages.push_back({j, e, t, q});
        if (used + t == g) {
          walk(e + 1, q + 1, 0);
        } else {
          walk(e + 1, q, used + t);
        }
        stages.pop_back();
      }
    }
  };
  walk(0, 0, 0);
  return best;
}

double Objective(const Problem& p, const Template& t, double m) {
  return t.total + (m - 1) * t.bottleneck + StepTailSeconds(p, t);
}

}  // namespace

// Issue 14's fourth known error: a template could not mix stage sizes.
TEST_CASE("mixed stages: the LM head on a node of its own, the blocks one GPU a stage") {
  // 2 nodes of 2 GPUs; an embedding of 0.6 ms, 4 blocks of 6 ms, whose
  // tensor-parallel all-reduces cost 3 ms a block at degree 2 (2 MiB each
  // over 2.8 GB/s), and a head of 24 ms (forward + backward), which has
  // none. One degree: 4 stages of 1 GPU leave the head alone at 24 ms; 2
  // stages of 2 GPUs at best 19.2 ms (the embedding and 3 blocks, their
  // 13 all-reduces; the other the head's 12 with one block's 9). Mixed: the embedding and the blocks on node 0,
  // one GPU a stage (12.6 and 12 ms, plus a boundary inside the node), the
  // head alone on both GPUs of node 1 (12 ms).
  Problem p = testing::UniformProblem(4, 2, 0, 32, 2);
  p.cluster.intra_bytes_per_s = 2.796e9;
  p.layers.back().forward = 8e-3;
  p.layers.back().backward = 16e-3;
  p.tp = 0;
  auto uniform = BestTemplate(p, 2);
  REQUIRE(uniform);
  CHECK_FALSE(uniform->mixed());
  p.mixed_stages = true;
  auto mixed = BestTemplate(p, 2);
  REQUIRE(mixed);
  REQUIRE(mixed->mixed());
  REQUIRE(mixed->stages.size() == 3);
  CHECK(mixed->stages[0].tp == 1);
  CHECK(mixed->stages[1].tp == 1);
  CHECK(mixed->stages[2].tp == 2);
  CHECK(mixed->stages[2].first == 5);  // the head alone
  CHECK(mixed->NodeOf(1) == 0);
  CHECK(mixed->NodeOf(2) == 1);
  CHECK(mixed->FirstStageOn(1) == 2);
  CHECK(mixed->LastStageOn(0) == 1);
  CHECK(mixed->tp == 2);
  CHECK(mixed->bottleneck < uniform->bottleneck);
  CHECK(mixed->bottleneck == Approx(13.4e-3).epsilon(0.01));
  CHECK(uniform->bottleneck == Approx(19.2e-3).epsilon(0.01));  // + the embedding's all-reduce
  // Where one degree is forced, no mixing.
  p.tp = 1;
  CHECK_FALSE(BestTemplate(p, 2)->mixed());
}

TEST_CASE("mixed stages: the best mixed template, by brute force on random problems") {
  int mixed_chosen = 0, compared = 0;
  for (uint64_t seed = 1; seed <= 600; ++seed) {
    testing::RandomProblemOptions o;
    o.max_layers = 6;
    o.max_nodes = 3;
    o.max_gpus_per_node = 4;
    Problem p = testing::RandomProblem(seed, o);
    p.tp = 0;
    p.tp_at.clear();
    // Nodes of 2 or 4 GPUs, tensor parallelism from cheap to dear: where
    // mixing can win.
    p.cluster.gpus_per_node = 2 + 2 * static_cast<int>(seed % 2);
    p.cluster.intra_bytes_per_s = 0.5e9 * static_cast<double>(1 + seed % 40);
    // Every template the same step tail: the choice is the 1F1B time's.
    for (auto& l : p.layers) l.gradient_bytes = 0, l.update = 0;
    const std::vector<int> degrees = TensorParallelChoices(p);
    for (int n = 1; n <= std::min(2, p.cluster.nodes); ++n) {
      const double m = std::max(1.0, static_cast<double>(p.microbatches) * n / p.cluster.nodes);
      auto uniform = BestTemplate(p, n);
      p.mixed_stages = true;
      auto best = BestTemplate(p, n);
      p.mixed_stages = false;
      const double brute = ExhaustiveMixed(p, n, m, degrees);
      INFO("seed " << seed << ", " << n << " node(s), m " << m);
      if (!std::isfinite(brute)) {  // nothing fits, mixed or not
        CHECK_FALSE(best);
        continue;
      }
      REQUIRE(best);
      ++compared;
      // Never worse than the uniform template, exact when mixed.
      if (uniform) CHECK(Objective(p, *best, m) <= Objective(p, *uniform, m));
      CHECK(Close(best->total + (m - 1) * best->bottleneck, brute));
      if (best->mixed()) {
        ++mixed_chosen;
        // Stages tile the layers, fill every node, and fit.
        int next = 0;
        std::vector<int> used(static_cast<size_t>(n), 0);
        for (size_t i = 0; i < best->stages.size(); ++i) {
          const StageShape& s = best->stages[i];
          CHECK(s.first == next);
          next = s.last + 1;
          used[static_cast<size_t>(s.node)] += s.tp;
          CHECK(StageFits(p, s.first, s.last, s.tp, static_cast<int>(best->stages.size() - i)));
        }
        CHECK(next == p.num_layers());
        for (int u : used) CHECK(u == p.cluster.gpus_per_node);
      }
    }
  }
  // Random costs seldom favour mixing (1 of 1,025 template sizes here);
  // every size is checked exact against the brute force above, and the
  // case before builds one where mixing wins.
  CHECK(compared > 500);
  CHECK(mixed_chosen >= 1);
}

}  // namespace ob::plan

// ---- Recomputation (issue 56) ------------------------------------------------

namespace {

// UniformProblem with each block's costs in every mode: selective keeps
// half, full an eighth; their backwards compute 10% and a forward again.
Problem RecomputingProblem(int nodes, uint64_t gpu_memory) {
  Problem p = testing::UniformProblem(8, nodes, 0, 16);
  p.cluster.gpu_memory = gpu_memory;
  for (LayerCost& c : p.layers) {
    c.kept_bytes = {c.activation_bytes, c.activation_bytes / 2, c.activation_bytes / 8};
    c.recompute_seconds = {0.0, 0.1 * c.forward, c.forward};
  }
  p.has_recompute_costs = true;
  return p;
}

}  // namespace

TEST_CASE("recompute: a stage runs the fastest mode it fits in, and pays for what it computes again") {
  Problem p = RecomputingProblem(4, 64ull << 30);
  p.recompute_modes.assign(std::begin(model::kRecomputeModes), std::end(model::kRecomputeModes));
  const int L = p.num_layers();
  // Memory: state + in-flight × kept + one block's activations again.
  const uint64_t none = StageMemoryBytes(p, 1, 4, 1, 4, model::Recompute::kNone);
  const uint64_t full = StageMemoryBytes(p, 1, 4, 1, 4, model::Recompute::kFull);
  const uint64_t sel = StageMemoryBytes(p, 1, 4, 1, 4, model::Recompute::kSelective);
  const uint64_t act = 8 << 20, in = 1 << 20;
  CHECK(none - full == 4 * 4 * (act - act / 8) - (act - act / 8));
  CHECK(none - sel == 4 * 4 * (act - act / 2) - (act - act / 2));
  (void)in;
  CHECK(StageComputeSeconds(p, 1, 4, 1, model::Recompute::kFull) ==
        Approx(StageComputeSeconds(p, 1, 4, 1) + 4 * 2e-3));
  CHECK(StageComputeSeconds(p, 1, 4, 1, model::Recompute::kSelective) ==
        Approx(StageComputeSeconds(p, 1, 4, 1) + 4 * 0.2e-3));
  // With room, none; as the memory shrinks, selective, then full, then nothing.
  CHECK(StageMode(p, 0, L - 1, 1, 4) == model::Recompute::kNone);
  p.cluster.gpu_memory = sel;
  CHECK(StageMode(p, 1, 4, 1, 4) == model::Recompute::kSelective);
  p.cluster.gpu_memory = full;
  CHECK(StageMode(p, 1, 4, 1, 4) == model::Recompute::kFull);
  p.cluster.gpu_memory = full - 1;
  CHECK_FALSE(StageMode(p, 1, 4, 1, 4));
  // Without the modes (--recompute none), full's memory does not fit.
  p.cluster.gpu_memory = full;
  p.recompute_modes = {model::Recompute::kNone};
  CHECK_FALSE(StageFits(p, 1, 4, 1, 4));
}

TEST_CASE("recompute: templates shrink with it, and each stage says its mode") {
  // Memory that one node does not hold without recomputation.
  Problem p = RecomputingProblem(8, 0);
  const int L = p.num_layers();
  p.cluster.gpu_memory = StageMemoryBytes(p, 0, L - 1, 1, 1, model::Recompute::kFull);
  auto plain = BuildTemplates(p);
  p.recompute_modes.assign(std::begin(model::kRecomputeModes), std::end(model::kRecomputeModes));
  auto with = BuildTemplates(p);
  REQUIRE(with.ok());
  CHECK(with->min_nodes == 1);
  if (plain.ok()) CHECK(plain->min_nodes > 1);
  const Template& one = with->templates.front();
  REQUIRE(one.stages.size() == 1);
  CHECK(one.stages[0].recompute == model::Recompute::kFull);
  CHECK(one.stage_memory[0] <= p.cluster.gpu_memory);
  CHECK(one.stage_seconds[0] == Approx(StageComputeSeconds(p, one.stages[0])));
  // A larger template fits without it: its stages run none where they can.
  for (const Template& t : with->templates) {
    for (size_t i = 0; i < t.stages.size(); ++i) {
      const StageShape& s = t.stages[i];
      const int in_flight = static_cast<int>(t.stages.size() - i);
      CHECK(StageMode(p, s.first, s.last, s.tp, in_flight) == s.recompute);
    }
  }
}

}  // namespace ob::plan

namespace {

// UniformProblem with each block's backward a third weight gradients and
// `w_bytes` kept between its B and W; every schedule allowed.
ob::plan::Problem SplitProblem(int nodes, int microbatches, uint64_t w_bytes) {
  ob::plan::Problem p = ::ob::plan::testing::UniformProblem(8, nodes, 0, microbatches);
  for (auto& l : p.layers) {
    if (!l.is_block) continue;
    l.weight_grad = l.backward / 3;
    l.weight_input_bytes = w_bytes;
  }
  p.schedules = ::ob::schedule::All();
  return p;
}

}  // namespace

TEST_CASE("schedules: each template runs the fastest that fits, timed by its order") {
  using namespace ob::plan;
  Problem p = SplitProblem(4, 16, 4 << 20);
  auto ts = BuildTemplates(p);
  REQUIRE(ts.ok());
  for (const Template& t : ts->templates) {
    INFO(t.nodes << " nodes");
    // Never slower than 1F1B at its share; with three stages or more of
    // near-equal blocks a zero-bubble one wins, and saves. (At two, the
    // embed's and the head's stages differ enough that the unit-cost
    // orders lose: 1F1B stays.)
    CHECK(t.saved >= 0);
    CHECK(t.Seconds(t.saved_at) <= t.total + (t.saved_at - 1) * t.bottleneck);
    if (t.stages.size() >= 3) {
      CHECK(t.schedule != &::ob::schedule::OneFOneB());
      CHECK(t.saved > 0);
      CHECK(t.Seconds(16) < t.total + 15 * t.bottleneck);
    }
    // Seconds never falls as m grows.
    for (int m = 1; m < 40; ++m) CHECK(t.Seconds(m + 1) >= t.Seconds(m));
    // The stages' memory is their schedule's worst moment, within the GPU.
    const int m_memory = std::min(16, 2 * static_cast<int>(t.stages.size()));
    for (size_t i = 0; i < t.stages.size(); ++i) {
      CHECK(t.stage_memory[i] == StageMemoryOf(p, t, static_cast<int>(i), m_memory));
      CHECK(t.stage_memory[i] <= p.cluster.gpu_memory);
    }
  }
  // 1F1B only: the plans of before.
  Problem one = p;
  one.schedules = {&::ob::schedule::OneFOneB()};
  auto ts1 = BuildTemplates(one);
  REQUIRE(ts1.ok());
  for (const Template& t : ts1->templates) {
    CHECK(t.schedule == &::ob::schedule::OneFOneB());
    CHECK(t.Seconds(7) == t.total + 6 * t.bottleneck);
  }
}

TEST_CASE("schedules: one that does not fit is not chosen, and Validate counts what W holds") {
  using namespace ob::plan;
  // What W keeps is huge: zb-h2's extra micro-batches cannot fit.
  Problem p = SplitProblem(2, 16, uint64_t{6} << 30);
  p.cluster.gpu_memory = uint64_t{12} << 30;
  p.schedules = {::ob::schedule::Find("zb-h2")};
  auto ts = BuildTemplates(p);
  REQUIRE(ts.ok());
  const Template* two = ts->ForNodes(2);
  REQUIRE(two != nullptr);
  CHECK(two->schedule == &::ob::schedule::OneFOneB());
  // A template that claims zb-h2 with what its stages then hold fails the
  // check the master runs after a recovery.
  Template bad = *two;
  bad.schedule = ::ob::schedule::Find("zb-h2");
  bad.stage_held.assign(bad.stages.size(), ::ob::schedule::Held{1, 3});
  TemplateSet set = *ts;
  for (Template& t : set.templates)
    if (t.nodes == 2) t = bad;
  Instantiation inst;
  inst.pipelines = {{2, {0, 1}, 16}};
  CHECK(Validate(p, set, inst).find("more than") != std::string::npos);
}
