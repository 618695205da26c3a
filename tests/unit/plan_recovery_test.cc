// Re-instantiation after failures (design/recovery.md): every set of ≤ f lost
// nodes is recoverable from the stored templates, fetches come only from
// survivors that hold the layer, intact pipelines stay put, and beyond f the
// lost layers are named exactly.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "ob/plan/instantiation.h"
#include "ob/plan/recovery.h"
#include "ob/plan/templates.h"
#include "plan_testing.h"

namespace ob::plan {
namespace {

struct Planned {
  Problem p;
  TemplateSet ts;
  Instantiation inst;
};

std::optional<Planned> Plan(const Problem& p) {
  auto ts = BuildTemplates(p);
  if (!ts.ok()) return std::nullopt;
  auto inst = Instantiate(p, *ts);
  if (!inst.ok()) return std::nullopt;
  return Planned{p, *ts, *inst};
}

// The layers node position `pos` of template `n` holds, as a set.
std::set<int> Holds(const TemplateSet& ts, int n, int pos) {
  const Template& t = *ts.ForNodes(n);
  std::set<int> s;
  for (int i = pos * t.stages_per_node; i < (pos + 1) * t.stages_per_node; ++i)
    for (int l = t.stages[i].first; l <= t.stages[i].last; ++l) s.insert(l);
  return s;
}

std::map<int, std::set<int>> HeldBy(const TemplateSet& ts, const Instantiation& inst) {
  std::map<int, std::set<int>> held;
  for (const auto& pipe : inst.pipelines)
    for (int pos = 0; pos < pipe.template_nodes; ++pos)
      held[pipe.nodes[pos]] = Holds(ts, pipe.template_nodes, pos);
  return held;
}

// Layers no node outside `lost` holds, by brute force.
std::vector<int> Orphans(const Planned& x, const std::set<int>& lost) {
  std::set<int> covered;
  for (const auto& [node, layers] : HeldBy(x.ts, x.inst))
    if (!lost.count(node)) covered.insert(layers.begin(), layers.end());
  std::vector<int> orphans;
  for (int l = 0; l < x.p.num_layers(); ++l)
    if (!covered.count(l)) orphans.push_back(l);
  return orphans;
}

// Everything a recovery promises, checked against the definitions.
void CheckRecovery(const Planned& x, const Instantiation& current, const std::vector<int>& lost,
                   const std::vector<int>& added, const Recovery& r) {
  INFO("lost " << lost.size() << " added " << added.size() << ": " << r.reason);
  REQUIRE(r.ok);
  CHECK(r.lost_layers.empty());
  REQUIRE(Validate(x.p, x.ts, r.next) == "");
  // The new node set is exactly what the pipelines and the idle list use.
  const std::set<int> gone(lost.begin(), lost.end());
  std::map<int, std::set<int>> before;
  for (const auto& [node, layers] : HeldBy(x.ts, current))
    if (!gone.count(node)) before[node] = layers;
  std::set<int> expected;
  for (const auto& [node, layers] : before) expected.insert(node);
  expected.insert(added.begin(), added.end());
  std::multiset<int> used(r.idle.begin(), r.idle.end());
  for (const auto& pipe : r.next.pipelines) used.insert(pipe.nodes.begin(), pipe.nodes.end());
  CHECK(std::set<int>(used.begin(), used.end()) == expected);
  CHECK(used.size() == expected.size());
  // Fetches come from survivors holding the layer and cover exactly what each node lacks.
  std::map<int, std::multiset<int>> fetched;
  uint64_t bytes = 0;
  for (const auto& f : r.fetches) {
    REQUIRE(before.count(f.from_node));
    CHECK(before[f.from_node].count(f.layer));
    CHECK(f.bytes == x.p.layers[f.layer].state_bytes);
    fetched[f.node].insert(f.layer);
    bytes += f.bytes;
  }
  CHECK(bytes == r.bytes_copied);
  for (const auto& [node, layers] : HeldBy(x.ts, r.next)) {
    std::multiset<int> lacks;
    for (int l : layers)
      if (!before[node].count(l)) lacks.insert(l);
    CHECK(fetched[node] == lacks);
    fetched.erase(node);
  }
  CHECK(fetched.empty());  // nobody outside the next instantiation fetches
}

std::vector<int> AllNodes(const Instantiation& inst) {
  std::vector<int> nodes;
  for (const auto& pipe : inst.pipelines)
    nodes.insert(nodes.end(), pipe.nodes.begin(), pipe.nodes.end());
  std::sort(nodes.begin(), nodes.end());
  return nodes;
}

// Calls f(subset) for every subset of `items` with 1..k elements.
template <typename F>
void ForEachSubset(const std::vector<int>& items, int k, std::vector<int>& subset, size_t from,
                   F&& f) {
  if (!subset.empty()) f(subset);
  if (static_cast<int>(subset.size()) == k) return;
  for (size_t i = from; i < items.size(); ++i) {
    subset.push_back(items[i]);
    ForEachSubset(items, k, subset, i + 1, f);
    subset.pop_back();
  }
}

// A gpt3-175b-like problem (h = 12288, 96 blocks, s = 2048, 80 GB GPUs) on
// `nodes` nodes of 8 GPUs.
Problem Gpt3Problem(int nodes, int faults, int microbatches) {
  Problem p = testing::UniformProblem(96, nodes, faults, microbatches, 8);
  const double h = 12288, s = 2048, a = 96, v = 50257;
  const uint64_t block_state = static_cast<uint64_t>(16 * (12 * h * h + 13 * h));
  for (auto& l : p.layers) {
    l.state_bytes = l.is_block ? block_state : static_cast<uint64_t>(16 * v * h);
    l.gradient_bytes = l.state_bytes / 8;
    l.activation_bytes = static_cast<uint64_t>(s * h * (34 + 5 * a * s / h));
    l.output_bytes = static_cast<uint64_t>(2 * s * h);
    l.forward = l.is_block ? 0.15 : 0.05;
    l.backward = 2 * l.forward;
  }
  p.layers.back().activation_bytes += static_cast<uint64_t>(s * v * 4);
  p.layers.back().output_bytes = 4;
  p.cluster.gpu_memory = 80ull << 30;
  p.sequence_length = 2048;
  p.n_embd = 12288;
  p.n_head = 96;
  return p;
}

double Millis(std::chrono::steady_clock::time_point start) {
  const auto elapsed = std::chrono::steady_clock::now() - start;
  return std::chrono::duration<double, std::milli>(elapsed).count();
}

}  // namespace

TEST_CASE("every set of at most f lost nodes is recoverable", "[plan][recovery]") {
  int planned = 0, sets = 0, multistage = 0;
  for (uint64_t seed = 1; seed <= 600 && planned < 150; ++seed) {
    testing::RandomProblemOptions o;
    o.max_nodes = 12;
    o.max_faults = 3;
    Problem p = testing::RandomProblem(seed, o);
    if (seed % 2 == 0) {
      // Slow intra-node links: templates put several stages on a node.
      p.cluster.gpus_per_node = 2 + static_cast<int>(seed % 3);
      p.cluster.intra_bytes_per_s = 1e6;
    }
    auto x = Plan(p);
    if (!x) continue;
    ++planned;
    multistage += x->ts.templates.front().stages_per_node > 1 ? 1 : 0;
    INFO("seed " << seed << " N " << x->p.cluster.nodes << " f " << x->p.faults << " n0 "
                 << x->ts.min_nodes << " pipelines " << x->inst.pipelines.size());
    const std::vector<int> nodes = AllNodes(x->inst);
    REQUIRE(static_cast<int>(nodes.size()) == x->p.cluster.nodes);
    std::vector<int> subset;
    ForEachSubset(nodes, x->p.faults, subset, 0, [&](const std::vector<int>& lost) {
      ++sets;
      const Recovery r = Reinstantiate(x->p, x->ts, x->inst, lost);
      CheckRecovery(*x, x->inst, lost, {}, r);
      CHECK(static_cast<int>(r.idle.size()) < x->ts.min_nodes);
    });
  }
  CHECK(planned >= 100);
  CHECK(multistage >= 20);
  CHECK(sets > 2000);
}

TEST_CASE("sampled failure sets on 64 nodes", "[plan][recovery]") {
  std::mt19937_64 rng(7);
  int planned = 0;
  for (uint64_t seed = 1; seed <= 200 && planned < 8; ++seed) {
    testing::RandomProblemOptions o;
    o.max_layers = 40;
    o.max_gpus_per_node = 4;
    Problem p = testing::RandomProblem(seed, o);
    p.cluster.nodes = 64;
    p.faults = 1 + static_cast<int>(seed % 4);
    p.microbatches = 64 + static_cast<int>(seed % 50);
    auto x = Plan(p);
    if (!x) continue;
    ++planned;
    INFO("seed " << seed << " n0 " << x->ts.min_nodes << " f " << p.faults);
    std::vector<int> nodes = AllNodes(x->inst);
    for (int trial = 0; trial < 40; ++trial) {
      std::shuffle(nodes.begin(), nodes.end(), rng);
      const int k = 1 + static_cast<int>(rng() % p.faults);
      const std::vector<int> lost(nodes.begin(), nodes.begin() + k);
      const Recovery r = Reinstantiate(x->p, x->ts, x->inst, lost);
      CheckRecovery(*x, x->inst, lost, {}, r);
      CHECK(static_cast<int>(r.idle.size()) < x->ts.min_nodes);
      // A second wave of failures on the recovered instantiation.
      if (!r.ok) continue;
      const std::vector<int> more(nodes.begin() + k, nodes.begin() + k + 1);
      const Recovery again = Reinstantiate(x->p, x->ts, r.next, more);
      std::vector<int> all = lost;
      all.push_back(more[0]);
      if (Orphans(*x, std::set<int>(all.begin(), all.end())).empty() && !again.ok)
        FAIL_CHECK("second failure refused: " << again.reason);
    }
  }
  CHECK(planned >= 4);
}

TEST_CASE("pipelines that lost no node are kept as they were", "[plan][recovery]") {
  // Three micro-batches over 24 nodes: three pipelines of 8.
  Problem p = testing::UniformProblem(30, 24, 2, 3);
  p.cluster.gpu_memory = 1200ull << 20;  // n0 = 4
  auto x = Plan(p);
  REQUIRE(x);
  REQUIRE(x->inst.pipelines.size() >= 3);
  int checked = 0;
  for (size_t j = 0; j < x->inst.pipelines.size(); ++j) {
    const auto& damaged = x->inst.pipelines[j];
    if (damaged.template_nodes - 1 < x->ts.min_nodes) continue;
    ++checked;
    const int victim = damaged.nodes[damaged.template_nodes / 2];
    const Recovery r = Reinstantiate(x->p, x->ts, x->inst, {victim});
    CheckRecovery(*x, x->inst, {victim}, {}, r);
    REQUIRE(r.next.pipelines.size() == x->inst.pipelines.size());
    for (size_t i = 0; i < x->inst.pipelines.size(); ++i) {
      const auto& was = x->inst.pipelines[i];
      const auto& now = r.next.pipelines[i];
      if (i != j) {
        CHECK(now.nodes == was.nodes);
        CHECK(now.template_nodes == was.template_nodes);
      } else {
        // Survivors keep their order on the template one node smaller.
        std::vector<int> survivors = was.nodes;
        survivors.erase(std::find(survivors.begin(), survivors.end(), victim));
        CHECK(now.nodes == survivors);
      }
    }
    for (const auto& f : r.fetches)
      CHECK(std::count(damaged.nodes.begin(), damaged.nodes.end(), f.node) == 1);
  }
  CHECK(checked >= 3);
}

TEST_CASE("an undersized survivor group goes where it copies least", "[plan][recovery]") {
  // Drop one node of a pipeline of n0 nodes: its survivors cannot run alone.
  // Whatever the recovery chose must copy no more than joining them to any
  // other pipeline or borrowing one node for them from any other pipeline.
  int checked = 0;
  for (uint64_t seed = 1; seed <= 400; ++seed) {
    testing::RandomProblemOptions o;
    o.max_nodes = 12;
    auto x = Plan(testing::RandomProblem(seed, o));
    if (!x || x->ts.min_nodes < 2 || x->p.faults < 1) continue;
    const int n0 = x->ts.min_nodes;
    const auto held = HeldBy(x->ts, x->inst);
    for (size_t j = 0; j < x->inst.pipelines.size(); ++j) {
      const auto& pipe = x->inst.pipelines[j];
      if (pipe.template_nodes != n0) continue;
      ++checked;
      const Recovery r = Reinstantiate(x->p, x->ts, x->inst, {pipe.nodes[0]});
      CheckRecovery(*x, x->inst, {pipe.nodes[0]}, {}, r);
      const std::vector<int> u(pipe.nodes.begin() + 1, pipe.nodes.end());
      std::optional<uint64_t> cheapest;
      auto consider = [&](std::vector<PipelineInstance> alt) {
        uint64_t bytes = 0;
        for (const auto& a : alt)
          for (int pos = 0; pos < a.template_nodes; ++pos) {
            const auto it = held.find(a.nodes[pos]);
            for (int l : Holds(x->ts, a.template_nodes, pos))
              if (!it->second.count(l)) bytes += x->p.layers[l].state_bytes;
          }
        cheapest = std::min(cheapest.value_or(bytes), bytes);
      };
      for (size_t d = 0; d < x->inst.pipelines.size(); ++d) {
        if (d == j) continue;
        const auto& donor = x->inst.pipelines[d];
        const int size = donor.template_nodes;
        if (x->ts.ForNodes(size + n0 - 1)) {
          PipelineInstance joined{size + n0 - 1, donor.nodes, 0};
          joined.nodes.insert(joined.nodes.end(), u.begin(), u.end());
          consider({joined});
        }
        if (size - 1 >= n0 && x->ts.ForNodes(size - 1)) {
          PipelineInstance kept{size - 1, {donor.nodes.begin(), donor.nodes.end() - 1}, 0};
          PipelineInstance lent{n0, u, 0};
          lent.nodes.push_back(donor.nodes.back());
          consider({kept, lent});
        }
      }
      INFO("seed " << seed << " pipeline " << j);
      if (cheapest) {
        CHECK(r.idle.empty());
        CHECK(r.bytes_copied <= *cheapest);
      }
    }
  }
  CHECK(checked >= 20);
}

TEST_CASE("beyond f: recovered when every layer survives or else the lost layers named exactly",
          "[plan][recovery]") {
  std::mt19937_64 rng(11);
  int refused = 0, recovered = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    testing::RandomProblemOptions o;
    o.max_nodes = 12;
    auto x = Plan(testing::RandomProblem(seed, o));
    if (!x) continue;
    std::vector<int> nodes = AllNodes(x->inst);
    for (int trial = 0; trial < 20; ++trial) {
      std::shuffle(nodes.begin(), nodes.end(), rng);
      const int k = std::min<int>(nodes.size(), x->p.faults + 1 + static_cast<int>(rng() % 3));
      const std::vector<int> lost(nodes.begin(), nodes.begin() + k);
      const std::set<int> gone(lost.begin(), lost.end());
      const std::vector<int> orphans = Orphans(*x, gone);
      const int left = static_cast<int>(nodes.size()) - k;
      const Recovery r = Reinstantiate(x->p, x->ts, x->inst, lost);
      INFO("seed " << seed << " lost " << k << " of " << nodes.size() << ": " << r.reason);
      CHECK(r.lost_layers == orphans);
      if (orphans.empty() && left >= x->ts.min_nodes) {
        CheckRecovery(*x, x->inst, lost, {}, r);
        ++recovered;
      } else {
        CHECK_FALSE(r.ok);
        CHECK_FALSE(r.reason.empty());
        CHECK(r.next.pipelines.empty());
        ++refused;
      }
    }
  }
  CHECK(refused > 50);
  CHECK(recovered > 50);
}

TEST_CASE("losing every replica of a layer names it", "[plan][recovery]") {
  const Problem p = testing::UniformProblem(10, 6, 1, 12);
  auto x = Plan(p);
  REQUIRE(x);
  // Every node that holds layer 5 (one per pipeline).
  std::vector<int> lost;
  for (const auto& [node, layers] : HeldBy(x->ts, x->inst))
    if (layers.count(5)) lost.push_back(node);
  const Recovery r = Reinstantiate(x->p, x->ts, x->inst, lost);
  CHECK_FALSE(r.ok);
  CHECK(r.lost_layers == Orphans(*x, std::set<int>(lost.begin(), lost.end())));
  CHECK(std::count(r.lost_layers.begin(), r.lost_layers.end(), 5) == 1);
  CHECK(r.reason.find("no surviving replica") != std::string::npos);
  CHECK(r.reason.rfind("layer", 0) == 0);
}

TEST_CASE("fewer than n0 nodes left: refused though every layer survives", "[plan][recovery]") {
  // Hand-made templates for 6 layers: 3 nodes hold [0-3] [4] [5], 4 nodes
  // hold [0] [1] [2] [3-5]. Nodes 0 and 6 together still hold every layer.
  Problem p;
  for (int l = 0; l < 6; ++l) {
    LayerCost c;
    c.forward = 1e-3;
    c.backward = 2e-3;
    c.state_bytes = 100 + l;
    p.layers.push_back(c);
  }
  p.cluster.nodes = 7;
  p.cluster.gpu_memory = 1 << 20;
  p.microbatches = 4;
  auto make = [](std::vector<StageShape> stages) {
    Template t;
    t.nodes = static_cast<int>(stages.size());
    t.stages = std::move(stages);
    t.bottleneck = 4e-3;
    t.total = 6 * 3e-3;
    return t;
  };
  Planned x{p, {}, {}};
  x.ts.min_nodes = 3;
  x.ts.templates = {make({{0, 3}, {4, 4}, {5, 5}}), make({{0, 0}, {1, 1}, {2, 2}, {3, 5}})};
  x.inst.pipelines = {{3, {0, 1, 2}, 2}, {4, {3, 4, 5, 6}, 2}};
  REQUIRE(Validate(x.p, x.ts, x.inst) == "");
  const std::vector<int> lost = {1, 2, 3, 4, 5};
  const Recovery r = Reinstantiate(x.p, x.ts, x.inst, lost);
  CHECK_FALSE(r.ok);
  CHECK(r.lost_layers.empty());
  CHECK(r.reason.find("only 2 nodes remain") != std::string::npos);
  // One newcomer makes three: the survivors run again, fetching only layer 5.
  const Recovery joined = Reinstantiate(x.p, x.ts, x.inst, lost, {7});
  CheckRecovery(x, x.inst, lost, {7}, joined);
  REQUIRE(joined.next.pipelines.size() == 1);
  CHECK(joined.next.pipelines[0].nodes == std::vector<int>{0, 6, 7});
  CHECK(joined.bytes_copied == 105);
}

TEST_CASE("rejoining nodes brings back a full-size instantiation", "[plan][recovery]") {
  std::mt19937_64 rng(3);
  int checked = 0;
  for (uint64_t seed = 1; seed <= 300 && checked < 200; ++seed) {
    testing::RandomProblemOptions o;
    o.max_nodes = 12;
    auto x = Plan(testing::RandomProblem(seed, o));
    if (!x || x->p.faults == 0) continue;
    std::vector<int> nodes = AllNodes(x->inst);
    for (int trial = 0; trial < 10; ++trial, ++checked) {
      std::shuffle(nodes.begin(), nodes.end(), rng);
      const int k = 1 + static_cast<int>(rng() % x->p.faults);
      const std::vector<int> lost(nodes.begin(), nodes.begin() + k);
      const Recovery r = Reinstantiate(x->p, x->ts, x->inst, lost);
      REQUIRE(r.ok);
      std::vector<int> back = lost;
      back.insert(back.end(), r.idle.begin(), r.idle.end());
      const Recovery joined = Reinstantiate(x->p, x->ts, r.next, {}, back);
      CheckRecovery(*x, r.next, {}, back, joined);
      CHECK(joined.next.nodes_used() == x->p.cluster.nodes);
      CHECK(joined.idle.empty());
    }
  }
  CHECK(checked >= 100);
}

TEST_CASE("a node that fails and comes back brings the iteration time back", "[plan][recovery]") {
  // ob-sim found the layout drifting over a month of failures: a node lost
  // from a 24-node pipeline left it on the 23-node template, and when the
  // node came back it joined the smallest pipeline (a 16-node one), so the
  // instantiation never returned to the planned one (gpt3-175b, 128 nodes:
  // 15.34 s a step planned, 15.80 s after one failure and its repair). A
  // returning node now goes where it speeds the iteration most, and the
  // planned sizes are among the choices.
  std::mt19937_64 rng(5);
  int checked = 0, improved = 0;
  for (uint64_t seed = 1; seed <= 400 && checked < 300; ++seed) {
    testing::RandomProblemOptions o;
    o.max_nodes = 12;
    auto x = Plan(testing::RandomProblem(seed, o));
    if (!x || x->p.faults == 0 || x->inst.pipelines.size() < 2) continue;
    std::vector<int> nodes = AllNodes(x->inst);
    for (int trial = 0; trial < 5; ++trial) {
      const int victim = nodes[rng() % nodes.size()];
      const Recovery r = Reinstantiate(x->p, x->ts, x->inst, {victim});
      REQUIRE(r.ok);
      // Only where the damaged pipeline was re-laid one node smaller.
      if (r.next.pipelines.size() != x->inst.pipelines.size() || !r.idle.empty()) continue;
      ++checked;
      const Recovery back = Reinstantiate(x->p, x->ts, r.next, {}, {victim});
      REQUIRE(back.ok);
      INFO("seed " << seed << ": planned " << x->inst.iteration_seconds << " s, after the failure "
                   << r.next.iteration_seconds << " s, back " << back.next.iteration_seconds << " s");
      CHECK(back.next.iteration_seconds <= x->inst.iteration_seconds * (1 + 1e-9));
      improved += back.next.iteration_seconds < r.next.iteration_seconds;
    }
  }
  CHECK(checked >= 100);
  CHECK(improved > 0);
}

TEST_CASE("f failures one by one and their repairs one by one end on the plan's iteration time", "[plan][recovery]") {
  // Node by node, six failures and their returns left gpt3-175b on 128
  // nodes at 2x16 1x22 1x24 2x25 nodes (15.78 s a step) instead of the
  // planned 2x16 4x24 (15.34 s): each return alone could not fix it.
  std::mt19937_64 rng(11);
  int checked = 0;
  for (uint64_t seed = 1; seed <= 400 && checked < 150; ++seed) {
    testing::RandomProblemOptions o;
    o.max_nodes = 12;
    o.max_faults = 3;
    auto x = Plan(testing::RandomProblem(seed, o));
    if (!x || x->p.faults == 0) continue;
    std::vector<int> nodes = AllNodes(x->inst);
    std::shuffle(nodes.begin(), nodes.end(), rng);
    Instantiation inst = x->inst;
    std::vector<int> out, idle;  // idle: left out by the last decision, added again by the next (as the master does)
    bool ok = true;
    for (int k = 0; k < x->p.faults && ok; ++k) {
      const Recovery r = Reinstantiate(x->p, x->ts, inst, {nodes[k]}, idle);
      ok = r.ok;
      if (!ok) break;
      inst = r.next;
      idle = r.idle;
      out.push_back(nodes[k]);
    }
    if (!ok) continue;
    // The nodes back one at a time.
    for (size_t i = 0; i < out.size(); ++i) {
      std::vector<int> added = idle;
      added.push_back(out[i]);
      const Recovery r = Reinstantiate(x->p, x->ts, inst, {}, added);
      REQUIRE(r.ok);
      inst = r.next;
      idle = r.idle;
    }
    ++checked;
    INFO("seed " << seed << ": planned " << x->inst.iteration_seconds << " s, after " << x->p.faults
                 << " failures and returns " << inst.iteration_seconds << " s");
    CHECK(inst.nodes_used() == x->p.cluster.nodes);
    CHECK(inst.iteration_seconds <= x->inst.iteration_seconds / (1 - 0.005) * (1 + 1e-9));
  }
  CHECK(checked >= 50);
}

TEST_CASE("a failure and a new node in one step", "[plan][recovery]") {
  const Problem p = testing::UniformProblem(20, 12, 2, 30);
  auto x = Plan(p);
  REQUIRE(x);
  const int victim = x->inst.pipelines[0].nodes[0];
  const Recovery r = Reinstantiate(x->p, x->ts, x->inst, {victim}, {100});
  CheckRecovery(*x, x->inst, {victim}, {100}, r);
  CHECK(r.next.nodes_used() == 12);
  // Reinstantiation is deterministic.
  const Recovery again = Reinstantiate(x->p, x->ts, x->inst, {victim}, {100});
  CHECK(again.bytes_copied == r.bytes_copied);
  REQUIRE(again.fetches.size() == r.fetches.size());
  for (size_t i = 0; i < r.fetches.size(); ++i)
    CHECK(again.fetches[i].from_node == r.fetches[i].from_node);
}

TEST_CASE("excluding a straggler pays only when the smaller instantiation is faster",
          "[plan][recovery]") {
  const Problem p = testing::UniformProblem(12, 6, 1, 16);
  auto x = Plan(p);
  REQUIRE(x);
  const int node = x->inst.pipelines[0].nodes[0];
  const Recovery r = Reinstantiate(x->p, x->ts, x->inst, {node});
  REQUIRE(r.ok);
  REQUIRE(r.next.pipelines.size() >= 2);
  // Five nodes run the batch slower than six: a small slowdown is kept.
  REQUIRE(r.next.iteration_seconds > x->inst.iteration_seconds * 1.1);
  const Exclusion mild = WeighExclusion(x->p, x->ts, x->inst, node, 1.05);
  CHECK_FALSE(mild.pays);
  CHECK(mild.without_seconds == r.next.iteration_seconds);
  CHECK(mild.slowed_seconds == Approx(x->inst.iteration_seconds * 1.05).epsilon(0.05));
  CHECK(mild.reason.find("1.05x") != std::string::npos);
  // A node that slows its pipeline beyond what the others lose pays.
  const double tipping = r.next.iteration_seconds / x->inst.iteration_seconds;
  CHECK_FALSE(WeighExclusion(x->p, x->ts, x->inst, node, tipping * 0.98).pays);
  CHECK(WeighExclusion(x->p, x->ts, x->inst, node, tipping * 1.1).pays);
  // With an idle node to take its place, even a mild slowdown pays.
  const Exclusion spare = WeighExclusion(x->p, x->ts, x->inst, node, 1.2, {100});
  CHECK(spare.without_seconds == Approx(x->inst.iteration_seconds));
  CHECK(spare.pays);
  const Exclusion nobody = WeighExclusion(x->p, x->ts, x->inst, 77, 2);
  CHECK_FALSE(nobody.pays);
  CHECK(nobody.reason == "node 77 runs no pipeline");

  // Never below f + 1 pipelines, however slow: f = 3 on 4 nodes.
  auto y = Plan(testing::UniformProblem(12, 4, 3, 16));
  REQUIRE(y);
  REQUIRE(y->inst.pipelines.size() == 4);
  const Exclusion tolerance = WeighExclusion(y->p, y->ts, y->inst, y->inst.pipelines[0].nodes[0], 100);
  CHECK_FALSE(tolerance.pays);
  CHECK(tolerance.reason ==
        "without it 3 pipelines would remain, fewer than the 4 that survive f = 3 failures");
}

TEST_CASE("Validate names what is wrong", "[plan][recovery]") {
  const Problem p = testing::UniformProblem(10, 6, 1, 12);
  auto x = Plan(p);
  REQUIRE(x);
  CHECK(Validate(x->p, x->ts, x->inst) == "");
  Instantiation bad = x->inst;
  bad.pipelines[0].microbatches += 1;
  CHECK(Validate(x->p, x->ts, bad).find("sum to") != std::string::npos);
  bad = x->inst;
  bad.pipelines[1].nodes[0] = bad.pipelines[0].nodes[0];
  CHECK(Validate(x->p, x->ts, bad).find("is in pipelines 0 and 1") != std::string::npos);
  bad = x->inst;
  bad.pipelines[0].template_nodes = 1000;
  CHECK(Validate(x->p, x->ts, bad).find("no template") != std::string::npos);
  bad = x->inst;
  bad.pipelines[0].nodes.pop_back();
  CHECK_FALSE(Validate(x->p, x->ts, bad).empty());
  bad = x->inst;
  bad.pipelines[0].microbatches = 0;
  CHECK_FALSE(Validate(x->p, x->ts, bad).empty());
  Problem small = x->p;
  small.cluster.gpu_memory = 1 << 20;
  CHECK(Validate(small, x->ts, x->inst).find("bytes per GPU") != std::string::npos);
  CHECK(Validate(x->p, x->ts, Instantiation{}) == "no pipelines");
}

TEST_CASE("re-instantiation at 1024 nodes takes milliseconds", "[plan][recovery]") {
  const Problem p = Gpt3Problem(1024, 4, 1536);
  auto x = Plan(p);
  REQUIRE(x);
  std::mt19937_64 rng(5);
  std::vector<int> nodes = AllNodes(x->inst);
  double worst = 0, sum = 0;
  const int runs = 20;
  for (int i = 0; i < runs; ++i) {
    const int victim = nodes[rng() % nodes.size()];
    const auto start = std::chrono::steady_clock::now();
    const Recovery r = Reinstantiate(x->p, x->ts, x->inst, {victim});
    const double ms = Millis(start);
    REQUIRE(r.ok);
    CHECK(Validate(x->p, x->ts, r.next) == "");
    worst = std::max(worst, ms);
    sum += ms;
  }
  // f failures at once, and a pipeline that keeps one node (beyond f, an
  // undersized group to rehouse).
  auto timed = [&](const std::vector<int>& lost) {
    const auto start = std::chrono::steady_clock::now();
    const Recovery r = Reinstantiate(x->p, x->ts, x->inst, lost);
    const double ms = Millis(start);
    CheckRecovery(*x, x->inst, lost, {}, r);
    return ms;
  };
  std::shuffle(nodes.begin(), nodes.end(), rng);
  const double four = timed({nodes.begin(), nodes.begin() + x->p.faults});
  const auto& big = x->inst.pipelines[0].nodes;
  const double gutted = timed({big.begin() + 1, big.end()});
  std::printf("# recovery at 1024 nodes (n0 %d, %zu pipelines): one failure mean %.3f ms,"
              " worst %.3f ms; f at once %.3f ms; a pipeline down to one node %.3f ms\n",
              x->ts.min_nodes, x->inst.pipelines.size(), sum / runs, worst, four, gutted);
  // The bar is 10 ms in Release (bench/); here only blow-ups fail, in any build.
  CHECK(std::max({worst, four, gutted}) < 1000);
}

}  // namespace ob::plan
