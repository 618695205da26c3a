// The worker runtime's torch-free parts: the 1F1B op order of a stage and
// the rank/group layout of an instantiated plan.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "ob/plan/instantiation.h"
#include "ob/plan/templates.h"
#include "ob/schedule/program.h"
#include "ob/schedule/schedule.h"
#include "ob/runtime/topology.h"
#include "plan_testing.h"

using ob::runtime::BuildTopology;
using ob::runtime::Topology;

namespace {

// 1F1B's order as forward/backward pairs (schedule/one_f_one_b.cc).
struct PipelineOp {
  bool forward = true;
  int microbatch = 0;
};
std::vector<PipelineOp> OneFOneB(int stage, int stages, int m) {
  std::vector<PipelineOp> out;
  for (const auto& op : ob::schedule::Order(ob::schedule::OneFOneB(), stage, stages, m))
    out.push_back({op.type == ob::schedule::Op::kForward, op.microbatch});
  return out;
}

ob::plan::Template MakeTemplate(int nodes, std::vector<std::pair<int, int>> ranges) {
  ob::plan::Template t;
  t.nodes = nodes;
  t.stages_per_node = static_cast<int>(ranges.size()) / nodes;
  for (auto [first, last] : ranges) t.stages.push_back({first, last, 1});
  return t;
}

}  // namespace

TEST_CASE("1F1B runs every micro-batch once each way, in order, within the memory bound",
          "[runtime][schedule]") {
  for (int stages = 1; stages <= 6; ++stages) {
    for (int m = 0; m <= 9; ++m) {
      for (int i = 0; i < stages; ++i) {
        const auto ops = OneFOneB(i, stages, m);
        REQUIRE(ops.size() == 2 * static_cast<size_t>(m));
        int forwards = 0, backwards = 0, max_in_flight = 0;
        for (const PipelineOp& op : ops) {
          if (op.forward) {
            REQUIRE(op.microbatch == forwards++);
          } else {
            REQUIRE(op.microbatch == backwards++);
            REQUIRE(backwards <= forwards);  // backward after its forward
          }
          max_in_flight = std::max(max_in_flight, forwards - backwards);
        }
        REQUIRE(forwards == m);
        REQUIRE(backwards == m);
        if (m > 0) REQUIRE(max_in_flight == std::min(stages - i, m));
        // Warm-up forwards: min(S - i - 1, m) before the first backward.
        int warm = 0;
        while (warm < static_cast<int>(ops.size()) && ops[warm].forward) ++warm;
        if (m > 0) REQUIRE(warm == std::min(stages - i - 1, m) + (stages - i - 1 < m ? 1 : 0));
      }
    }
  }
}

TEST_CASE("1F1B for the last stage alternates from the start", "[runtime][schedule]") {
  const auto ops = OneFOneB(2, 3, 3);
  const std::vector<std::pair<bool, int>> want = {{true, 0},  {false, 0}, {true, 1},
                                                  {false, 1}, {true, 2},  {false, 2}};
  REQUIRE(ops.size() == want.size());
  for (size_t k = 0; k < ops.size(); ++k) {
    CHECK(ops[k].forward == want[k].first);
    CHECK(ops[k].microbatch == want[k].second);
  }
}

TEST_CASE("topology of a 3-stage and a 2-stage pipeline", "[runtime][topology]") {
  ob::plan::TemplateSet ts;
  ts.min_nodes = 2;
  ts.templates = {MakeTemplate(2, {{0, 2}, {3, 5}}), MakeTemplate(3, {{0, 1}, {2, 3}, {4, 5}})};
  ob::plan::Instantiation inst;
  inst.pipelines = {{3, {0, 1, 2}, 3}, {2, {3, 4}, 2}};
  auto topo = BuildTopology(ts, inst, 4);
  REQUIRE(topo.ok());
  CHECK(topo->num_layers == 6);
  CHECK(topo->world_size() == 5);
  CHECK(topo->total_microbatches == 5);
  CHECK(topo->global_batch() == 20);
  const auto& r3 = topo->ranks[3];
  CHECK(r3.pipeline == 1);
  CHECK(r3.stage == 0);
  CHECK(r3.node == 3);
  CHECK(r3.first_layer == 0);
  CHECK(r3.last_layer == 2);
  CHECK(r3.first_microbatch == 3);
  CHECK(r3.num_microbatches == 2);
  CHECK(r3.prev_rank == -1);
  CHECK(r3.next_rank == 4);
  CHECK(topo->ranks[1].prev_rank == 0);
  CHECK(topo->ranks[1].next_rank == 2);
  CHECK(topo->pipelines == std::vector<std::vector<int>>{{0, 1, 2}, {3, 4}});
  // Owner sets: layers 0-1 {0,3}, 2 {1,3}, 3 {1,4}, 4-5 {2,4}.
  REQUIRE(topo->layer_groups.size() == 4);
  CHECK(topo->layer_groups[0].ranks == std::vector<int>{0, 3});
  CHECK(topo->layer_groups[0].layers == std::vector<int>{0, 1});
  CHECK(topo->layer_groups[1].ranks == std::vector<int>{1, 3});
  CHECK(topo->layer_groups[2].ranks == std::vector<int>{1, 4});
  CHECK(topo->layer_groups[3].ranks == std::vector<int>{2, 4});
  CHECK(topo->layer_groups[3].layers == std::vector<int>{4, 5});
  CHECK(topo->layer_group_of == std::vector<int>{0, 0, 1, 2, 3, 3});
  CHECK(topo->layer_groups[1].name() == "layers/1,3");
  CHECK(topo->LayerGroupsOf(3) == std::vector<int>{0, 1});
  CHECK(topo->tied == std::vector<std::vector<int>>{{0, 2, 3, 4}});
  CHECK_FALSE(topo->InTied(1));
}

TEST_CASE("a single-stage pipeline is in the tied group once", "[runtime][topology]") {
  ob::plan::TemplateSet ts;
  ts.min_nodes = 1;
  ts.templates = {MakeTemplate(1, {{0, 5}}), MakeTemplate(2, {{0, 2}, {3, 5}})};
  ob::plan::Instantiation inst;
  inst.pipelines = {{2, {0, 1}, 2}, {1, {2}, 1}};
  auto topo = BuildTopology(ts, inst, 1);
  REQUIRE(topo.ok());
  CHECK(topo->tied == std::vector<std::vector<int>>{{0, 1, 2}});
  CHECK(topo->ranks[2].is_first_stage());
  CHECK(topo->ranks[2].is_last_stage());
}

TEST_CASE("topology of 2 pipelines x 2 stages with tensor parallelism 2", "[runtime][topology]") {
  ob::plan::TemplateSet ts;
  ts.min_nodes = 1;
  ts.templates = {MakeTemplate(1, {{0, 2}, {3, 5}})};
  for (auto& s : ts.templates[0].stages) s.tp = 2;
  ts.templates[0].stages_per_node = 2;
  ob::plan::Instantiation inst;
  inst.pipelines = {{1, {0}, 2}, {1, {1}, 3}};
  auto topo = BuildTopology(ts, inst, 1);
  REQUIRE(topo.ok());
  CHECK(topo->pieces == 2);
  CHECK(topo->world_size() == 8);
  // Rank = 2·(Σ S_q + s) + r: pipeline 1's stage 1, TP rank 1 is rank 7.
  const auto& r7 = topo->ranks[7];
  CHECK(r7.pipeline == 1);
  CHECK(r7.stage == 1);
  CHECK(r7.tp_rank == 1);
  CHECK(r7.node == 1);
  CHECK(r7.lane == 3);
  CHECK(r7.prev_rank == 5);
  CHECK(r7.first_microbatch == 2);
  CHECK(topo->ranks[2].next_rank == -1);
  CHECK(topo->ranks[0].next_rank == 2);
  CHECK(topo->pipelines == std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(topo->tp_groups == std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(Topology::TpGroupName(topo->tp_groups[1]) == "tp/2,3");
  // Each shard's owners: layers 0-2 {0,4} / {1,5}, layers 3-5 {2,6} / {3,7}.
  REQUIRE(topo->layer_groups.size() == 4);
  CHECK(topo->layer_groups[0].ranks == std::vector<int>{0, 4});
  CHECK(topo->layer_groups[1].ranks == std::vector<int>{1, 5});
  CHECK(topo->layer_groups[1].layers == std::vector<int>{0, 1, 2});
  CHECK(topo->layer_groups[3].ranks == std::vector<int>{3, 7});
  CHECK(topo->layer_group_of == std::vector<int>{0, 0, 0, 2, 2, 2});
  CHECK(topo->LayerGroupsOf(5) == std::vector<int>{1});
  CHECK(topo->tied == std::vector<std::vector<int>>{{0, 2, 4, 6}, {1, 3, 5, 7}});
  CHECK(Topology::TiedGroupName(1) == "tied/1");

  CHECK(topo->layer_groups[1].name() == "layers/1,5/1");
  CHECK(topo->FirstPieceOf(5) == 1);
  CHECK(topo->PiecesOf(5) == 1);
  CHECK(topo->TpGroupOf(5) == std::vector<int>{4, 5});
}

TEST_CASE("replicas of tensor parallelism 2 and 4 sum their gradients in 4 pieces", "[runtime][topology]") {
  ob::plan::TemplateSet ts;
  ts.min_nodes = 1;
  ts.templates = {MakeTemplate(1, {{0, 5}}), MakeTemplate(2, {{0, 2}, {3, 5}})};
  for (auto& s : ts.templates[0].stages) s.tp = 4;
  for (auto& s : ts.templates[1].stages) s.tp = 2;
  ob::plan::Instantiation inst;
  inst.pipelines = {{2, {0, 1}, 2}, {1, {2}, 2}};
  auto topo = BuildTopology(ts, inst, 1);
  REQUIRE(topo.ok());
  CHECK(topo->pieces == 4);
  CHECK(topo->world_size() == 8);  // pipeline 0: ranks 0-3 (2 stages x 2), pipeline 1: ranks 4-7
  CHECK(topo->ranks[5].tp == 4);
  CHECK(topo->ranks[5].lane == 3);
  CHECK(topo->pipelines == std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4}, {5}, {6}, {7}});
  CHECK(topo->tp_groups == std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5, 6, 7}});
  CHECK(topo->FirstPieceOf(1) == 2);
  CHECK(topo->PiecesOf(1) == 2);
  CHECK(topo->FirstPieceOf(6) == 2);
  CHECK(topo->PiecesOf(6) == 1);
  // Layers 0-2: piece P's holders are rank P / 2 of pipeline 0 and 4 + P.
  REQUIRE(topo->layer_groups.size() == 8);
  CHECK(topo->layer_groups[0].ranks == std::vector<int>{0, 4});
  CHECK(topo->layer_groups[1].ranks == std::vector<int>{0, 5});
  CHECK(topo->layer_groups[2].ranks == std::vector<int>{1, 6});
  CHECK(topo->layer_groups[3].ranks == std::vector<int>{1, 7});
  CHECK(topo->layer_groups[7].ranks == std::vector<int>{3, 7});
  CHECK(topo->layer_groups[7].layers == std::vector<int>{3, 4, 5});
  CHECK(topo->layer_group_of == std::vector<int>{0, 0, 0, 4, 4, 4});
  CHECK(topo->LayerGroupsOf(1) == std::vector<int>{2, 3});
  CHECK(topo->LayerGroupsOf(6) == std::vector<int>{2, 6});
  CHECK(topo->tied == std::vector<std::vector<int>>{{0, 2, 4}, {0, 2, 5}, {1, 3, 6}, {1, 3, 7}});

  // Within a template of k stages a node one degree; a mixed one may differ.
  auto uneven = ts;
  uneven.templates[1].stages[1].tp = 4;
  auto r = BuildTopology(uneven, inst, 1);
  CHECK(r.status().code() == ob::Code::kConfig);
  CHECK(r.status().message().find("only a mixed template may") != std::string::npos);
  uneven.templates[1].stages_per_node = 0;
  uneven.templates[1].stages[1].node = 1;
  CHECK(BuildTopology(uneven, inst, 1).ok());
}

namespace {

// Pipeline of stages of the given degrees over layers 0..S-1, one stage a
// layer, mixed; every stage on its own node (nodes are not the runtime's
// concern here).
ob::plan::TemplateSet MixedSet(const std::vector<int>& degrees) {
  ob::plan::TemplateSet ts;
  ts.min_nodes = static_cast<int>(degrees.size());
  ob::plan::Template t;
  t.nodes = ts.min_nodes;
  t.stages_per_node = 0;
  for (size_t s = 0; s < degrees.size(); ++s) {
    t.stages.push_back({static_cast<int>(s), static_cast<int>(s), degrees[s], static_cast<int>(s)});
  }
  ts.templates = {t};
  return ts;
}

// Every rank's program: its stage's, each message sent to or received from
// the ranks Topology::Boundary names, empty batches dropped (as the worker
// posts them), peers as ranks.
std::vector<std::vector<ob::schedule::StageInstr>> RankPrograms(const Topology& topo, int m) {
  using ob::schedule::StageInstr;
  std::vector<std::vector<StageInstr>> out;
  for (const auto& me : topo.ranks) {
    std::vector<StageInstr> prog;
    for (const StageInstr& in : ob::schedule::StageProgram(ob::schedule::OneFOneB(), me.stage, me.num_stages, m)) {
      if (in.kind != StageInstr::kComm) {
        prog.push_back(in);
        continue;
      }
      StageInstr batch;
      batch.kind = StageInstr::kComm;
      for (const auto& p : in.comm) {
        const auto peers = topo.Boundary(me.rank, p.peer);
        auto msg = p;
        if (p.send) {
          for (int to : peers.send_to) msg.peer = to, batch.comm.push_back(msg);
        } else {
          msg.peer = peers.receive_from;
          batch.comm.push_back(msg);
        }
      }
      if (!batch.comm.empty()) prog.push_back(batch);
    }
    out.push_back(std::move(prog));
  }
  return out;
}

}  // namespace

TEST_CASE("a mixed pipeline: one lane of all its ranks, whole tensors where degrees differ",
          "[runtime][topology]") {
  // Stages of degree 2, 1, 1: ranks 0-1, 2, 3.
  auto ts = MixedSet({2, 1, 1});
  ob::plan::Instantiation inst;
  inst.pipelines = {{3, {4, 5, 6}, 2}};
  auto topo = BuildTopology(ts, inst, 1);
  REQUIRE(topo.ok());
  CHECK(topo->world_size() == 4);
  CHECK(topo->pieces == 2);
  CHECK(topo->pipelines == std::vector<std::vector<int>>{{0, 1, 2, 3}});
  CHECK(topo->tp_groups == std::vector<std::vector<int>>{{0, 1}});
  CHECK(topo->ranks[3].node == 6);
  CHECK(topo->ranks[1].next_rank == 2);
  CHECK(topo->ranks[2].prev_rank == 0);  // TP rank 0 mod 2
  CHECK(topo->ranks[2].lane_base == 0);
  CHECK(topo->LaneIndex(2, 1) == 1);
  // Stage 0 (degree 2) to stage 1 (degree 1): rank 0 sends the whole, rank 1 nothing.
  auto b = topo->Boundary(0, 1);
  CHECK(b.whole);
  CHECK(b.send_to == std::vector<int>{2});
  CHECK(b.receive_from == 2);
  CHECK(topo->Boundary(1, 1).send_to.empty());
  CHECK(topo->Boundary(1, 1).receive_from == 2);
  // Back: rank 2 sends its gradient, whole, to both.
  b = topo->Boundary(2, 0);
  CHECK(b.whole);
  CHECK(b.send_to == std::vector<int>{0, 1});
  CHECK(b.receive_from == 0);
  // Equal degrees: a share along the lane.
  b = topo->Boundary(2, 2);
  CHECK_FALSE(b.whole);
  CHECK(b.send_to == std::vector<int>{3});
  // The tied weight: piece 0 on ranks 0 and 3, piece 1 on ranks 1 and 3.
  CHECK(topo->tied == std::vector<std::vector<int>>{{0, 3}, {1, 3}});
  CHECK(topo->PiecesOf(3) == 2);
}

TEST_CASE("mixed pipelines never deadlock on rendezvous channels, rank by rank", "[runtime][topology]") {
  // Every sequence of degrees from {1, 2, 4} for S <= 4, m <= 8, and a few
  // longer ones; each rank's program against rendezvous-only channels.
  std::vector<std::vector<int>> cases;
  const int kDegrees[] = {1, 2, 4};
  for (int S = 1; S <= 4; ++S) {
    int count = 1;
    for (int i = 0; i < S; ++i) count *= 3;
    for (int c = 0; c < count; ++c) {
      std::vector<int> d;
      for (int i = 0, x = c; i < S; ++i, x /= 3) d.push_back(kDegrees[x % 3]);
      cases.push_back(d);
    }
  }
  cases.push_back({4, 1, 2, 1, 4, 2, 1, 1});
  cases.push_back({1, 1, 1, 1, 1, 1, 2, 4});
  int checked = 0;
  for (const auto& degrees : cases) {
    auto ts = MixedSet(degrees);
    ob::plan::Instantiation inst;
    std::vector<int> nodes;
    for (size_t s = 0; s < degrees.size(); ++s) nodes.push_back(static_cast<int>(s));
    for (int m = 1; m <= 8; ++m) {
      inst.pipelines = {{static_cast<int>(degrees.size()), nodes, m}};
      auto topo = BuildTopology(ts, inst, 1);
      REQUIRE(topo.ok());
      const std::string stuck = ob::schedule::CheckRendezvous(RankPrograms(*topo, m));
      INFO("degrees " << degrees.size() << " stages, m " << m);
      REQUIRE(stuck.empty());
      ++checked;
    }
  }
  CHECK(checked == (3 + 9 + 27 + 81 + 2) * 8);
}

TEST_CASE("topology refuses what the runtime cannot run", "[runtime][topology]") {
  ob::plan::TemplateSet ts;
  ts.min_nodes = 1;
  ts.templates = {MakeTemplate(1, {{0, 2}, {3, 5}})};
  ob::plan::Instantiation inst;
  inst.pipelines = {{1, {0}, 2}};
  CHECK(BuildTopology(ts, inst, 0).status().code() == ob::Code::kConfig);

  auto tp = ts;
  tp.templates[0].stages[1].tp = 2;
  auto r = BuildTopology(tp, inst, 1);
  CHECK(r.status().code() == ob::Code::kConfig);
  CHECK(r.status().message().find("tensor parallelism") != std::string::npos);

  auto gap = ts;
  gap.templates[0].stages[1].first = 4;
  CHECK(BuildTopology(gap, inst, 1).status().code() == ob::Code::kConfig);

  auto missing = inst;
  missing.pipelines[0].template_nodes = 7;
  CHECK(BuildTopology(ts, missing, 1).status().code() == ob::Code::kConfig);

  auto empty = inst;
  empty.pipelines[0].microbatches = 0;
  CHECK(BuildTopology(ts, empty, 1).status().code() == ob::Code::kConfig);
}

TEST_CASE("CheckRunnable: every template's tensor parallelism against the model", "[runtime][topology]") {
  ob::model::GptConfig cfg;
  cfg.n_layer = 4;
  cfg.n_embd = 128;
  cfg.n_head = 4;
  cfg.n_positions = 64;
  cfg.vocab_size = 256;
  ob::plan::TemplateSet ts;
  ts.min_nodes = 1;
  ts.templates = {MakeTemplate(1, {{0, 2}, {3, 5}}), MakeTemplate(2, {{0, 1}, {2, 3}, {4, 4}, {5, 5}})};
  ob::plan::Instantiation inst;
  inst.pipelines = {{1, {0}, 2}};
  CHECK(ob::runtime::CheckRunnable(ts, inst, 1, cfg).ok());

  // A template not instantiated is checked too (a recovery may use it).
  auto heads = ts;
  heads.templates[1].stages[2].tp = 3;
  auto st = ob::runtime::CheckRunnable(heads, inst, 1, cfg);
  CHECK(st.code() == ob::Code::kConfig);
  CHECK(st.message() ==
        "the template for 2 node(s), stage 2: tensor parallelism 3 does not divide the model's 4 attention heads");

  // Templates with chunks (ob-plan --schedule zb-v): runnable up to 8 a
  // stage (a snapshot arena's header holds 8 ranges), over one degree.
  auto chunked = ts;
  chunked.templates[1].schedule = ob::schedule::Find("zb-v");
  chunked.templates[1].chunks = 2;
  CHECK(ob::runtime::CheckRunnable(chunked, inst, 1, cfg).ok());
  chunked.templates[1].chunks = 9;
  st = ob::runtime::CheckRunnable(chunked, inst, 1, cfg);
  CHECK(st.code() == ob::Code::kConfig);
  CHECK(st.message() ==
        "the template for 2 node(s) runs zb-v with 9 chunks a stage, which ob-launch does not run: at most 8, over "
        "stages of one degree");

  auto two = ts;  // every stage t = 2: runnable
  for (auto& t : two.templates) {
    for (auto& s : t.stages) s.tp = 2;
  }
  CHECK(ob::runtime::CheckRunnable(two, inst, 1, cfg).ok());
  for (auto& s : two.templates[1].stages) s.tp = 4;  // replicas meet in 4 pieces: runnable
  CHECK(ob::runtime::CheckRunnable(two, inst, 1, cfg).ok());
  two.templates[1].stages[3].tp = 1;  // one template of k stages a node, one degree
  st = ob::runtime::CheckRunnable(two, inst, 1, cfg);
  CHECK(st.code() == ob::Code::kConfig);
  CHECK(st.message() ==
        "the template for 2 node(s), stage 3: tensor parallelism 1, stage 0's 4: only a mixed template's "
        "stages differ in degree");
  two.templates[1].stages_per_node = 0;  // a mixed one may
  for (int s = 0; s < 4; ++s) two.templates[1].stages[static_cast<size_t>(s)].node = s / 2;
  CHECK(ob::runtime::CheckRunnable(two, inst, 1, cfg).ok());
  // Degrees that do not divide one another meet in pieces of their least
  // common multiple, which divides whatever each divides.
  auto coprime = ts;
  for (auto& s : coprime.templates[0].stages) s.tp = 2;
  for (auto& s : coprime.templates[1].stages) s.tp = 3;
  cfg.n_head = 6;
  cfg.n_embd = 96;
  CHECK(ob::runtime::CheckRunnable(coprime, inst, 1, cfg).ok());
  cfg.vocab_size = 5;  // 6 pieces of a vocabulary of 5: some would be empty
  st = ob::runtime::CheckRunnable(coprime, inst, 1, cfg);
  CHECK(st.code() == ob::Code::kConfig);
  CHECK(st.message().find("meet in 6 pieces") != std::string::npos);
  cfg.n_head = 4;
  cfg.n_embd = 128;
  cfg.vocab_size = 256;

  auto zero = ts;
  zero.templates[0].stages[0].tp = 0;
  CHECK(ob::runtime::CheckRunnable(zero, inst, 1, cfg).code() == ob::Code::kConfig);
  CHECK(ob::runtime::CheckRunnable(ts, inst, 0, cfg).code() == ob::Code::kConfig);  // BuildTopology's
}

TEST_CASE("topologies of planned instantiations cover every layer once per pipeline",
          "[runtime][topology]") {
  for (int nodes = 2; nodes <= 9; ++nodes) {
    const auto p = ob::plan::testing::UniformProblem(6, nodes, 1, 16);
    auto ts = ob::plan::BuildTemplates(p);
    REQUIRE(ts.ok());
    auto inst = ob::plan::Instantiate(p, *ts);
    REQUIRE(inst.ok());
    auto topo = BuildTopology(*ts, *inst, 2);
    REQUIRE(topo.ok());
    const int pipelines = static_cast<int>(inst->pipelines.size());
    CHECK(topo->total_microbatches == 16);
    int next = 0;
    for (const auto& ranks : topo->pipelines) {
      CHECK(topo->ranks[ranks.front()].first_microbatch == next);
      next += topo->ranks[ranks.front()].num_microbatches;
    }
    std::set<std::vector<int>> distinct;
    for (int layer = 0; layer < topo->num_layers; ++layer) {
      const auto& g = topo->layer_groups[topo->layer_group_of[layer]];
      CHECK(static_cast<int>(g.ranks.size()) == pipelines);
      std::set<int> pipes;
      for (int r : g.ranks) {
        CHECK(topo->ranks[r].first_layer <= layer);
        CHECK(layer <= topo->ranks[r].last_layer);
        pipes.insert(topo->ranks[r].pipeline);
      }
      CHECK(static_cast<int>(pipes.size()) == pipelines);
      distinct.insert(g.ranks);
    }
    CHECK(distinct.size() == topo->layer_groups.size());
  }
}

TEST_CASE("chunked templates: a rank holds its chunks' ranges, layer groups and the tied group follow them",
          "[runtime][topology]") {
  // Two stages of two chunks over 6 layers: slices 0-1, 2-3, 4, 5.
  for (const char* name : {"zb-v", "interleaved"}) {
    INFO(name);
    ob::plan::Template t = MakeTemplate(2, {{0, 1}, {2, 3}});
    t.schedule = ob::schedule::Find(name);
    t.chunks = 2;
    t.slices = {{0, 1, 1}, {2, 3, 1}, {4, 4, 1}, {5, 5, 1}};
    const bool vee = std::string(name) == "zb-v";
    ob::plan::TemplateSet ts;
    ts.min_nodes = 2;
    ts.templates = {t};
    ob::plan::Instantiation inst;
    inst.pipelines = {{2, {0, 1}, 4}, {2, {2, 3}, 4}};
    auto topo = BuildTopology(ts, inst, 1);
    REQUIRE(topo.ok());
    CHECK(topo->num_layers == 6);
    // A V: stage 0 holds 0-1 and 5 (the embedding and the head), stage 1
    // 2-3 and 4; a loop: stage 0 0-1 and 4, stage 1 2-3 and 5.
    const std::vector<std::pair<int, int>> s0 = vee ? std::vector<std::pair<int, int>>{{0, 1}, {5, 5}}
                                                    : std::vector<std::pair<int, int>>{{0, 1}, {4, 4}};
    CHECK(topo->ranks[0].ranges == s0);
    CHECK(topo->ranks[2].ranges == s0);
    CHECK(topo->ranks[0].first_layer == 0);
    CHECK(topo->ranks[0].last_layer == 1);
    // Layer 4 and 5 are summed over the ranks that hold them in each pipeline.
    const auto& g4 = topo->layer_groups[topo->layer_group_of[4]];
    const auto& g5 = topo->layer_groups[topo->layer_group_of[5]];
    CHECK(g4.ranks == (vee ? std::vector<int>{1, 3} : std::vector<int>{0, 2}));
    CHECK(g5.ranks == (vee ? std::vector<int>{0, 2} : std::vector<int>{1, 3}));
    // The tied weight: the embedding's and the head's holders; in a V both
    // on stage 0, each rank once.
    REQUIRE(topo->tied.size() == 1);
    CHECK(topo->tied[0] == (vee ? std::vector<int>{0, 2} : std::vector<int>{0, 1, 2, 3}));
  }
}
