// Which worker rank runs what in an instantiated plan, and which ranks talk
// to which: the pipeline neighbours for activations and gradients, and the
// data-parallel groups that sum gradients across pipelines (design/launch.md).
// Torch-free, pure.
//
// Ranks: t per pipeline stage, t the stage's tensor-parallel degree. In a
// pipeline of one degree, lane r is TP rank r of every stage, and a stage
// boundary moves 1/t of the tensor along each lane (the receiving stage's
// TP group gathers it). A mixed pipeline (ob-plan --mixed-stages: stages of
// different degrees) has one lane of all its ranks; where neighbouring
// stages have the same degree the boundary is as above, and where they
// differ, TP rank r of the receiving stage (degree t_b) receives the whole
// tensor from TP rank r mod t_a of the sending one (degree t_a), which
// thus sends to every r' ≡ r (mod t_a) (Topology::Boundary); both ways
// alike, activations forward and gradients back (every rank of a stage
// holds the whole of both). Pipelines may differ in t: data parallelism then sums a layer's
// gradient piece by piece, T (the least common multiple of the degrees)
// pieces of every sharded parameter, rank r of t holding
// pieces [r·T/t, (r+1)·T/t) (model::PieceViews). Rank order is pipelines in
// the instantiation's order, stages in pipeline order, TP ranks in order:
// a stage's TP group is t consecutive ranks, which LayOut places on one
// node.
//
// Batch: pipeline p runs the micro-batches [start_p, start_p + m_p) of the
// global batch, start_p = Σ_{q<p} m_q; micro-batch g holds samples
// [g·b, (g+1)·b) for micro-batch size b, so the samples drawn do not depend
// on the split.
//
// Groups (every rank derives the same list, so creating them in list order
// is collective and deadlock-free):
//   - pipelines[i]: the lanes: TP rank r of every stage of pipeline p, in
//     stage order (p2p, and the per-step reduction of statistics), lanes of
//     pipeline p before those of p + 1; a mixed pipeline's one lane holds
//     all its ranks in rank order;
//   - tp_groups: the t ranks of each stage, by (pipeline, stage), when t > 1;
//   - layer_groups: for each planner layer and piece P, the set of ranks
//     holding piece P of it, deduplicated; ordered by the first layer each
//     set owns, then P, so ids are deterministic. With every pipeline
//     covering all layers, each set has one rank per pipeline; with one
//     degree t everywhere, T = t and piece P is TP rank P's shard (two
//     pieces may have the same holders when T is no pipeline's degree:
//     the group's name tells them apart);
//   - tied[P]: the ranks of every pipeline holding the embedding or the
//     head (its first and last stages; with a V of chunks, stage 0 alone)
//     and piece P of the tied LM weight, ascending (a rank holding both
//     once), whose gradient is summed over exactly this set.
//
// Failure: an inconsistent plan (a pipeline whose template is missing, stages
// that do not tile [0, L) contiguously, different layer counts across
// templates, a pipeline without micro-batches, a micro-batch size <= 0,
// a template whose stages do not fill their nodes) is
// kConfig with a one-line message.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ob/model/config.h"
#include "ob/plan/instantiation.h"
#include "ob/plan/templates.h"
#include "ob/schedule/program.h"
#include "ob/schedule/schedule.h"
#include "ob/status.h"

namespace ob::runtime {

struct RankInfo {
  int rank = 0;
  int pipeline = 0;
  int stage = 0;              // 0-based within the pipeline
  int num_stages = 0;         // S of its pipeline
  int node = -1;              // the plan's node id running this stage
  int tp = 1;                 // tensor-parallel degree of the stage
  int tp_rank = 0;            // 0 .. tp-1: which shard this rank holds
  int lane = 0;               // index in Topology::pipelines
  int first_layer = 0;        // global planner layers [first_layer, last_layer]
  int last_layer = 0;         // (with chunks: its chunk 0's)
  // Its layer ranges in chunk order: [first_layer, last_layer] alone with
  // one chunk; with chunks (interleaved, zb-v) each chunk's slice
  // (plan::Template::LayersOf), chunk c being virtual stage
  // Chain().At(stage, c).
  std::vector<std::pair<int, int>> ranges;
  int chunks() const { return ranges.empty() ? 1 : static_cast<int>(ranges.size()); }
  schedule::Chain Chain() const { return schedule->ChainOf(num_stages, chunks()); }
  bool Holds(int layer) const {
    for (const auto& [first, last] : ranges)
      if (first <= layer && layer <= last) return true;
    return false;
  }
  model::Recompute recompute = model::Recompute::kNone;  // its stage's, from the plan's template
  const schedule::Schedule* schedule = &schedule::OneFOneB();  // its template's
  // The op costs of its pipeline's stages that the schedule orders by
  // (Template::OrderCosts), shared by the pipeline's ranks.
  std::shared_ptr<const std::vector<schedule::StageCosts>> op_costs;
  // Its stage's program for its micro-batches (schedule/program.h).
  std::vector<schedule::StageInstr> Program() const;
  int first_microbatch = 0;   // index within the global batch
  int num_microbatches = 0;   // m of its pipeline
  int prev_rank = -1;         // the rank its activations come from; -1 on the first stage
  int next_rank = -1;         // the rank its output gradients come from; -1 on the last stage
  int prev_tp = 0;            // degrees of the neighbouring stages; 0 where there is none
  int next_tp = 0;
  // A mixed pipeline's first rank: its lane holds all the pipeline's
  // ranks, a peer's index there is its rank minus this; -1 in a pipeline
  // of one degree, whose lanes index peers by stage.
  int lane_base = -1;

  bool is_first_stage() const { return stage == 0; }
  bool is_last_stage() const { return stage == num_stages - 1; }
};

// A set of ranks that all-reduce (sum) the gradients of `layers`.
struct LayerGroup {
  int id = 0;                 // index in Topology::layer_groups
  std::vector<int> ranks;     // ascending
  std::vector<int> layers;    // ascending global layer indices
  int piece = 0;              // which piece of them (topology.h)
  // A name unique among all groups of a topology, used as the store prefix
  // under which the group rendezvouses, e.g. "layers/0,3".
  std::string name() const;
};

// What one rank sends and receives across the boundary with a neighbouring
// stage (topology.h, "Ranks").
struct BoundaryPeers {
  std::vector<int> send_to;   // ranks, ascending (empty: it sends nothing)
  int receive_from = -1;      // the rank it receives from
  bool whole = false;         // whole tensors; false: 1/t shares its TP group gathers
};

struct Topology {
  int num_layers = 0;          // L + 2 planner layers
  int microbatch_size = 0;     // samples per micro-batch
  int total_microbatches = 0;  // M over all pipelines
  int pieces = 1;              // T: the least common multiple of the degrees
  std::vector<RankInfo> ranks;                  // indexed by rank
  std::vector<std::vector<int>> pipelines;      // lanes: ranks in stage order
  std::vector<std::vector<int>> tp_groups;      // when t > 1: each stage's ranks
  std::vector<LayerGroup> layer_groups;
  // layer -> index in layer_groups of the holders of its piece 0; piece
  // P's are the index + P.
  std::vector<int> layer_group_of;
  std::vector<std::vector<int>> tied;           // by piece; each ascending

  int world_size() const { return static_cast<int>(ranks.size()); }
  int global_batch() const { return total_microbatches * microbatch_size; }
  // Store prefixes of the lane, TP and tied groups ("pipeline/2", "tp/4,5",
  // "tied", "tied/1").
  static std::string PipelineGroupName(int lane);
  static std::string TpGroupName(const std::vector<int>& ranks);
  static std::string TiedGroupName(int piece = 0);
  // Ids of the layer groups `rank` belongs to, ascending.
  std::vector<int> LayerGroupsOf(int rank) const;
  bool InTied(int rank) const;
  // The TP group (stage) of `rank`; empty when its stage has t = 1.
  const std::vector<int>& TpGroupOf(int rank) const;
  // `rank`'s exchange with stage `peer_stage` of its pipeline (its own ± 1;
  // with chunks, also the loop's wrap between its first and last stages).
  BoundaryPeers Boundary(int rank, int peer_stage) const;
  // The index of `peer` (a rank of `rank`'s pipeline) in `rank`'s lane group.
  int LaneIndex(int rank, int peer) const;
  // The pieces rank holds: [first, first + count).
  int FirstPieceOf(int rank) const;
  int PiecesOf(int rank) const { return pieces / ranks[static_cast<size_t>(rank)].tp; }
};

// Whether this worker runtime can run `inst` of `ts` for `model`: the
// topology builds (see above), and every stage's tensor-parallel degree t
// is one the runtime supports for this model (no template has chunks,
// which the workers do not run yet; t divides the attention
// heads and the MLP width, t <= the vocabulary), one within each template,
// and so is the least common multiple of all templates' degrees (a
// recovery may put any two side by side, or re-shard from one to another).
// kConfig with one line
// naming the template, stage and reason (every template is checked: a
// recovery may instantiate any); the master calls it before any
// host starts, so a plan the runtime cannot run never reaches a worker.
Status CheckRunnable(const plan::TemplateSet& ts, const plan::Instantiation& inst, int microbatch_size,
                     const model::GptConfig& model);

// The topology of `inst` running templates from `ts` with micro-batches of
// `microbatch_size` samples.
Result<Topology> BuildTopology(const plan::TemplateSet& ts, const plan::Instantiation& inst,
                               int microbatch_size);

}  // namespace ob::runtime
