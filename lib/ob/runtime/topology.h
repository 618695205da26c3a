// Which worker rank runs what in an instantiated plan, and which ranks talk
// to which: the pipeline neighbours for activations and gradients, and the
// data-parallel groups that sum gradients across pipelines (SPEC §5).
// Torch-free, pure.
//
// Ranks: one per pipeline stage (tensor parallelism is not supported yet:
// a template with tp > 1 is kConfig). Rank order is pipelines in the
// instantiation's order, stages in pipeline order, so pipeline p's stage s is
// rank Σ_{q<p} S_q + s.
//
// Batch: pipeline p runs the micro-batches [start_p, start_p + m_p) of the
// global batch, start_p = Σ_{q<p} m_q; micro-batch g holds samples
// [g·b, (g+1)·b) for micro-batch size b, so the samples drawn do not depend
// on the split.
//
// Groups (every rank derives the same list, so creating them in list order
// is collective and deadlock-free):
//   - pipelines[p]: the ranks of pipeline p in stage order (p2p, and the
//     per-step reduction of statistics);
//   - layer_groups: for each planner layer the set of ranks owning it,
//     deduplicated; ordered by the first layer each set owns, so ids are
//     deterministic. With every pipeline covering all layers, each set has one
//     rank per pipeline;
//   - tied: the first and last stage ranks of every pipeline, ascending (a
//     single-stage pipeline's rank once): the ranks holding the tied LM
//     weight, whose gradient is summed over exactly this set.
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
  int first_layer = 0;        // global planner layers [first_layer, last_layer]
  int last_layer = 0;
  int first_microbatch = 0;   // index within the global batch
  int num_microbatches = 0;   // m of its pipeline
  int prev_rank = -1;         // previous stage's rank; -1 on the first stage
  int next_rank = -1;         // next stage's rank; -1 on the last stage

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
  std::vector<RankInfo> ranks;                  // indexed by rank
  std::vector<std::vector<int>> pipelines;      // ranks of pipeline p, stage order
  std::vector<LayerGroup> layer_groups;
  std::vector<int> layer_group_of;              // layer -> index in layer_groups
  std::vector<int> tied;                        // ascending

  int world_size() const { return static_cast<int>(ranks.size()); }
  int global_batch() const { return total_microbatches * microbatch_size; }
  // Store prefixes of the pipeline and tied groups ("pipeline/2", "tied").
  static std::string PipelineGroupName(int pipeline);
  static std::string TiedGroupName();
  // Ids of the layer groups `rank` belongs to, ascending.
  std::vector<int> LayerGroupsOf(int rank) const;
  bool InTied(int rank) const;
};

// Whether this worker runtime can run `inst` of `ts` for `model`: the
// topology builds (see above), and every stage's tensor-parallel degree t
// is one the runtime supports for this model (t divides the attention
// heads and the MLP width, t <= the vocabulary; today only t = 1: tensor
// parallelism is planned by ob-plan, not yet run). kConfig with one line
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
