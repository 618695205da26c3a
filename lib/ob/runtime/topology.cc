// Rank layout and communication groups of an instantiation (see topology.h).
#include "ob/runtime/topology.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "ob/model/pieces.h"

namespace ob::runtime {

namespace {

std::string JoinRanks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

std::string LayerGroup::name() const {
  return "layers/" + JoinRanks(ranks) + (piece > 0 ? "/" + std::to_string(piece) : "");
}

std::string Topology::PipelineGroupName(int lane) { return "pipeline/" + std::to_string(lane); }

std::string Topology::TpGroupName(const std::vector<int>& ranks) { return "tp/" + JoinRanks(ranks); }

std::string Topology::TiedGroupName(int piece) {
  return piece == 0 ? "tied" : "tied/" + std::to_string(piece);
}

const std::vector<int>& Topology::TpGroupOf(int rank) const {
  static const std::vector<int> kNone;
  for (const auto& g : tp_groups) {
    if (std::binary_search(g.begin(), g.end(), rank)) return g;
  }
  return kNone;
}

int Topology::FirstPieceOf(int rank) const {
  const RankInfo& r = ranks[static_cast<size_t>(rank)];
  return model::FirstPiece(r.tp, r.tp_rank, pieces);
}

BoundaryPeers Topology::Boundary(int rank, int peer_stage) const {
  const RankInfo& me = ranks[static_cast<size_t>(rank)];
  // The peer stage's TP rank 0 (its ranks follow ours in pipeline order).
  int peer_first = -1;
  for (const RankInfo& r : ranks) {
    if (r.pipeline == me.pipeline && r.stage == peer_stage && r.tp_rank == 0) peer_first = r.rank;
  }
  BoundaryPeers out;
  if (peer_first < 0) return out;
  const int peer_tp = ranks[static_cast<size_t>(peer_first)].tp;
  out.receive_from = peer_first + me.tp_rank % peer_tp;
  out.whole = peer_tp != me.tp;
  for (int r = me.tp_rank; r < peer_tp; r += me.tp) out.send_to.push_back(peer_first + r);
  return out;
}

int Topology::LaneIndex(int rank, int peer) const {
  const RankInfo& me = ranks[static_cast<size_t>(rank)];
  return me.lane_base >= 0 ? peer - me.lane_base : ranks[static_cast<size_t>(peer)].stage;
}

std::vector<int> Topology::LayerGroupsOf(int rank) const {
  std::vector<int> out;
  for (const auto& g : layer_groups) {
    if (std::binary_search(g.ranks.begin(), g.ranks.end(), rank)) out.push_back(g.id);
  }
  return out;
}

bool Topology::InTied(int rank) const {
  for (const auto& g : tied) {
    if (std::binary_search(g.begin(), g.end(), rank)) return true;
  }
  return false;
}

Status CheckRunnable(const plan::TemplateSet& ts, const plan::Instantiation& inst, int microbatch_size,
                     const model::GptConfig& model) {
  // Every template, not only those instantiated: a recovery may use any.
  int pieces = 1;  // the least common multiple of every template's degree
  for (const plan::Template& t : ts.templates) {
    // Chunks (interleaved, zb-v): a worker holds up to 8 layer ranges (its
    // snapshot arena's header), over stages of one degree.
    if (t.chunks > 8 || (t.chunks > 1 && t.mixed()))
      return Status::Config("the template for " + std::to_string(t.nodes) + " node(s) runs " +
                            std::string(t.schedule->name) + " with " + std::to_string(t.chunks) + " chunks a stage" +
                            (t.mixed() ? " over stages of different degrees" : "") +
                            ", which ob-launch does not run: at most 8, over stages of one degree");
    for (size_t s = 0; s < t.stages.size(); ++s) {
      const int tp = t.stages[s].tp;
      const std::string where = "the template for " + std::to_string(t.nodes) + " node(s), stage " +
                                std::to_string(s) + ": tensor parallelism " + std::to_string(tp);
      if (tp < 1) return Status::Config(where + " is not a degree");
      if (model.n_head % tp != 0 || model.kv_heads() % tp != 0) {
        return Status::Config(where + " does not divide the model's " + std::to_string(model.n_head) +
                              " attention heads" +
                              (model.kv_heads() != model.n_head
                                   ? " (" + std::to_string(model.kv_heads()) + " key/value heads)"
                                   : std::string()));
      }
      if (model.mlp_width() % tp != 0 || tp > model.vocab_size) {
        return Status::Config(where + " does not divide the model's MLP width " +
                              std::to_string(model.mlp_width()) + " or exceeds its vocabulary");
      }
      if (!t.mixed() && tp != t.stages.front().tp) {
        return Status::Config(where + ", stage 0's " + std::to_string(t.stages.front().tp) +
                              ": only a mixed template's stages differ in degree");
      }
      pieces = std::lcm(pieces, tp);
    }
  }
  // Replicas of different degrees meet in pieces of the least common
  // multiple (topology.h). What each degree divides their multiple divides
  // too; only the vocabulary can be too small for it.
  if (pieces > model.vocab_size) {
    return Status::Config("the templates' tensor-parallel degrees meet in " + std::to_string(pieces) +
                          " pieces, more than the model's vocabulary of " + std::to_string(model.vocab_size));
  }
  return BuildTopology(ts, inst, microbatch_size).status();
}

Result<Topology> BuildTopology(const plan::TemplateSet& ts, const plan::Instantiation& inst,
                               int microbatch_size) {
  if (microbatch_size <= 0) {
    return Status::Config("micro-batch size " + std::to_string(microbatch_size) +
                          " is not positive");
  }
  if (inst.pipelines.empty()) return Status::Config("instantiation has no pipelines");
  Topology topo;
  topo.microbatch_size = microbatch_size;
  int next_microbatch = 0;
  for (size_t p = 0; p < inst.pipelines.size(); ++p) {
    const auto& pipe = inst.pipelines[p];
    const std::string where = "pipeline " + std::to_string(p);
    const plan::Template* t = ts.ForNodes(pipe.template_nodes);
    if (t == nullptr) {
      return Status::Config(where + ": no template for " + std::to_string(pipe.template_nodes) +
                            " nodes");
    }
    if (t->stages.empty()) return Status::Config(where + ": template has no stages");
    if (pipe.microbatches <= 0) return Status::Config(where + ": has no micro-batches");
    const int layers = t->Virtual().back().last + 1;
    if (topo.num_layers == 0) topo.num_layers = layers;
    if (layers != topo.num_layers) {
      return Status::Config(where + ": template covers " + std::to_string(layers) +
                            " layers, another " + std::to_string(topo.num_layers));
    }
    const int num_stages = static_cast<int>(t->stages.size());
    const int base = topo.world_size();
    const int tp = t->stages.front().tp;
    const int first_lane = static_cast<int>(topo.pipelines.size());
    // Each stage's first rank and degree.
    std::vector<int> stage_first(static_cast<size_t>(num_stages) + 1, base);
    bool mixed = false;
    for (int s = 0; s < num_stages; ++s) {
      const auto& shape = t->stages[s];
      if (shape.tp < 1) {
        return Status::Config(where + " stage " + std::to_string(s) + ": tensor parallelism " +
                              std::to_string(shape.tp) + " is not a degree");
      }
      mixed = mixed || shape.tp != tp;
      stage_first[s + 1] = stage_first[s] + shape.tp;
    }
    if (mixed && !t->mixed()) {
      return Status::Config(where + ": its template of " + std::to_string(t->stages_per_node) +
                            " stages a node has stages of different tensor parallelism (only a mixed template may)");
    }
    auto tp_of = [&](int s) { return s < 0 || s >= num_stages ? 0 : t->stages[s].tp; };
    const auto order_costs = std::make_shared<const std::vector<schedule::StageCosts>>(t->OrderCosts());
    // The stages (with chunks, the slices) tile the layers in order.
    int expected_first = 0;
    for (size_t k = 0; k < t->Virtual().size(); ++k) {
      const auto& shape = t->Virtual()[k];
      if (shape.first != expected_first || shape.last < shape.first) {
        return Status::Config(where + (t->chunks > 1 ? " slice " : " stage ") + std::to_string(k) + ": layers " +
                              std::to_string(shape.first) + "-" + std::to_string(shape.last) +
                              " do not follow layer " + std::to_string(expected_first - 1));
      }
      expected_first = shape.last + 1;
    }
    for (int s = 0; s < num_stages; ++s) {
      const auto& shape = t->stages[s];
      std::vector<int> stage_ranks;
      for (int tr = 0; tr < shape.tp; ++tr) {
        RankInfo r;
        r.rank = topo.world_size();
        r.pipeline = static_cast<int>(p);
        r.stage = s;
        r.num_stages = num_stages;
        const size_t node_slot = static_cast<size_t>(t->NodeOf(s));
        r.node = node_slot < pipe.nodes.size() ? pipe.nodes[node_slot] : -1;
        r.tp = shape.tp;
        r.tp_rank = tr;
        r.lane = first_lane + (mixed ? 0 : tr);
        r.lane_base = mixed ? base : -1;
        r.prev_tp = tp_of(s - 1);
        r.next_tp = tp_of(s + 1);
        r.first_layer = shape.first;
        r.last_layer = shape.last;
        r.ranges = t->LayersOf(s);
        r.recompute = shape.recompute;
        r.schedule = t->schedule;
        r.op_costs = order_costs;
        r.first_microbatch = next_microbatch;
        r.num_microbatches = pipe.microbatches;
        r.prev_rank = s > 0 ? stage_first[s - 1] + tr % r.prev_tp : -1;
        r.next_rank = s + 1 < num_stages ? stage_first[s + 1] + tr % r.next_tp : -1;
        stage_ranks.push_back(r.rank);
        topo.ranks.push_back(r);
      }
      if (shape.tp > 1) topo.tp_groups.push_back(std::move(stage_ranks));
      topo.pieces = std::lcm(topo.pieces, shape.tp);
    }
    if (mixed) {
      std::vector<int> lane;
      for (int q = base; q < stage_first[num_stages]; ++q) lane.push_back(q);
      topo.pipelines.push_back(std::move(lane));
    } else {
      for (int tr = 0; tr < tp; ++tr) {
        std::vector<int> lane;
        for (int s = 0; s < num_stages; ++s) lane.push_back(base + s * tp + tr);
        topo.pipelines.push_back(std::move(lane));
      }
    }
    next_microbatch += pipe.microbatches;
  }
  topo.total_microbatches = next_microbatch;

  // Holder sets of each piece, in order of the first layer each holds, then
  // of the piece: a layer's holders of piece 0 (TP rank 0 of each of its
  // stages) fix the stages, hence the holders of every piece.
  const int T = topo.pieces;
  auto holds_piece = [&](const RankInfo& r, int piece) {
    const int first = model::FirstPiece(r.tp, r.tp_rank, T);
    return first <= piece && piece < first + T / r.tp;
  };
  std::map<std::vector<int>, int> id_of;
  for (int layer = 0; layer < topo.num_layers; ++layer) {
    std::vector<int> owners;
    for (const auto& r : topo.ranks) {
      if (r.tp_rank == 0 && r.Holds(layer)) owners.push_back(r.rank);
    }
    auto [it, inserted] = id_of.emplace(owners, static_cast<int>(topo.layer_groups.size()));
    if (inserted) {
      for (int piece = 0; piece < T; ++piece) {
        LayerGroup g;
        g.id = it->second + piece;
        g.piece = piece;
        for (const auto& r : topo.ranks) {
          if (r.Holds(layer) && holds_piece(r, piece)) g.ranks.push_back(r.rank);
        }
        topo.layer_groups.push_back(std::move(g));
      }
    }
    for (int piece = 0; piece < T; ++piece) topo.layer_groups[it->second + piece].layers.push_back(layer);
    topo.layer_group_of.push_back(it->second);
  }

  // Per piece, the ranks of every pipeline that hold the embedding or the
  // head and the piece (its first stage and its last; one rank each, a
  // rank that holds both once).
  topo.tied.resize(T);
  for (const auto& r : topo.ranks) {
    if (!r.Holds(0) && !r.Holds(topo.num_layers - 1)) continue;
    for (int piece = 0; piece < T; ++piece) {
      if (holds_piece(r, piece)) topo.tied[piece].push_back(r.rank);
    }
  }
  return topo;
}

std::vector<schedule::StageInstr> RankInfo::Program() const {
  if (op_costs && static_cast<int>(op_costs->size()) == num_stages * chunks())
    return schedule::StageProgram(*schedule, *op_costs, stage, num_microbatches, chunks());
  return schedule::StageProgram(*schedule, stage, num_stages, num_microbatches, chunks());
}

}  // namespace ob::runtime
