// Which worker rank runs what in an instantiated plan, and which ranks talk
// to which: the pipeline neighbours for activations and gradients, and the
// data-parallel groups that sum gradients across pipelines (SPEC §5).
// Torch-free, pure.
//
// Ranks: t per pipeline stage, t the tensor-parallel degree (one t for
// the whole instantiation: data parallelism sums a layer's gradient shard
// by shard, so every replica must be split alike; templates of another t
// are kConfig). Rank order is pipelines in the instantiation's order,
// stages in pipeline order, TP ranks in order, so TP rank r of pipeline p's
// stage s is rank t·(Σ_{q<p} S_q + s) + r: a stage's TP group is t
// consecutive ranks, which LayOut places on one node.
//
// Batch: pipeline p runs the micro-batches [start_p, start_p + m_p) of the
// global batch, start_p = Σ_{q<p} m_q; micro-batch g holds samples
// [g·b, (g+1)·b) for micro-batch size b, so the samples drawn do not depend
// on the split.
//
// Groups (every rank derives the same list, so creating them in list order
// is collective and deadlock-free):
//   - pipelines[i]: the lanes, i = t·p + r: TP rank r of every stage of
//     pipeline p, in stage order (p2p, and the per-step reduction of
//     statistics); with t = 1 one lane per pipeline;
//   - tp_groups: the t ranks of each stage, by (pipeline, stage), when t > 1;
//   - layer_groups: for each planner layer and TP rank r, the set of ranks
//     owning shard r of it, deduplicated; ordered by the first layer each
//     set owns, then r, so ids are deterministic. With every pipeline
//     covering all layers, each set has one rank per pipeline;
//   - tied[r]: TP rank r of the first and last stages of every pipeline,
//     ascending (a single-stage pipeline's rank once): the ranks holding
//     shard r of the tied LM weight, whose gradient is summed over exactly
//     this set.
//
// Failure: an inconsistent plan (a pipeline whose template is missing, stages
// that do not tile [0, L) contiguously, different layer counts across
// templates, a pipeline without micro-batches, a micro-batch size <= 0) is
// kConfig with a one-line message.
#pragma once

#include <string>
#include <vector>

#include "ob/model/config.h"
#include "ob/plan/instantiation.h"
#include "ob/plan/templates.h"
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
  int last_layer = 0;
  int first_microbatch = 0;   // index within the global batch
  int num_microbatches = 0;   // m of its pipeline
  int prev_rank = -1;         // previous stage's rank in this lane; -1 on the first stage
  int next_rank = -1;         // next stage's rank in this lane; -1 on the last stage

  bool is_first_stage() const { return stage == 0; }
  bool is_last_stage() const { return stage == num_stages - 1; }
};

// A set of ranks that all-reduce (sum) the gradients of `layers`.
struct LayerGroup {
  int id = 0;                 // index in Topology::layer_groups
  std::vector<int> ranks;     // ascending
  std::vector<int> layers;    // ascending global layer indices
  // A name unique among all groups of a topology, used as the store prefix
  // under which the group rendezvouses, e.g. "layers/0,3".
  std::string name() const;
};

struct Topology {
  int num_layers = 0;          // L + 2 planner layers
  int microbatch_size = 0;     // samples per micro-batch
  int total_microbatches = 0;  // M over all pipelines
  int tp = 1;                  // tensor-parallel degree of every stage
  std::vector<RankInfo> ranks;                  // indexed by rank
  std::vector<std::vector<int>> pipelines;      // lanes: ranks in stage order
  std::vector<std::vector<int>> tp_groups;      // when tp > 1: each stage's ranks
                                                // (rank q's: tp_groups[q / tp])
  std::vector<LayerGroup> layer_groups;
  // layer -> index in layer_groups of its TP rank 0's owners; TP rank r's
  // are the index + r.
  std::vector<int> layer_group_of;
  std::vector<std::vector<int>> tied;           // by TP rank; each ascending

  int world_size() const { return static_cast<int>(ranks.size()); }
  int global_batch() const { return total_microbatches * microbatch_size; }
  // Store prefixes of the lane, TP and tied groups ("pipeline/2", "tp/4,5",
  // "tied", "tied/1").
  static std::string PipelineGroupName(int lane);
  static std::string TpGroupName(const std::vector<int>& ranks);
  static std::string TiedGroupName(int tp_rank = 0);
  // Ids of the layer groups `rank` belongs to, ascending.
  std::vector<int> LayerGroupsOf(int rank) const;
  bool InTied(int rank) const;
};

// Whether this worker runtime can run `inst` of `ts` for `model`: the
// topology builds (see above), and every stage's tensor-parallel degree t
// is one the runtime supports for this model (t divides the attention
// heads and the MLP width, t <= the vocabulary), the same in every template
// (a recovery from one degree to another would re-shard: not yet).
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
