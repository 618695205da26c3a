// Pipeline templates (design/plan.md): for every node count n the plan may run
// with, the best partition of the layers into stages and of each node's GPUs
// among its stages. Torch-free, pure.
//
// A template for n nodes has k stages per node (k divides g, the GPUs per
// node) with tensor parallelism t = g / k, so S = n·k stages; stage i runs on
// node i / k. Stages never span nodes. Stage i costs
//   w_i = StageComputeSeconds(first_i, last_i, t) + StageBoundarySeconds(last_i)
// over the cluster's nominal link when stage i + 1 is on the next node, and
// inside the node (intra_bytes_per_s) when it is on the same one (the stage
// r-th from the end is its node's last when r ≡ 1 mod k, so the DPs below
// stay indexed by r), and must fit in memory holding S − i
// micro-batches in flight (1F1B). A pipeline of this template running m
// micro-batches takes Σw + (m − 1)·max w (fill and drain, then one
// bottleneck stage per micro-batch).
//
// Cost model: for each k the partition is the best by (max w, Σw) — the
// steady-state bottleneck first, then fill/drain — over all partitions,
// exactly (floating-point values are compared as computed by the shared
// model functions, no tolerance). Across the k, the template is the one a
// pipeline of n nodes finishes soonest with its share of the batch,
// m = max(1, M·n/N) micro-batches: Σw + (m − 1)·max w + StepTailSeconds
// (ties: (max w, Σw); a problem without a batch ranks by (max w, Σw)
// alone). At a few micro-batches a pipeline pays its fill and drain more
// than its bottleneck, and fewer, wider stages (larger t) win. Within one
// k, Σw is the same compute plus S − 1 boundaries whatever the cut, so the
// bottleneck decides there.
//
// Algorithm, per k: a DP from the back over (r stages left, first layer j);
// the stage r-th from the end holds r micro-batches in flight whatever S is,
// so one minimax table F[r][j] gives the best bottleneck B*(S) = F[S][0] for
// every S at once (O(L³)). For each S a second DP then minimises Σw over
// partitions whose every stage has w ≤ B*(S) and fits (O(S·L²) at worst,
// pruned by the running compute sum). Ties keep the shortest first stage,
// then the smallest k. The whole set for a 98-layer model, g = 8, takes a few
// milliseconds.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ob/plan/problem.h"
#include "ob/schedule/schedule.h"
#include "ob/status.h"

namespace ob::plan {

struct Template {
  int nodes = 0;                       // n
  // k, every node holding k stages of degree t = g / k; 0: a mixed
  // template (ob-plan --mixed-stages), whose stages differ in degree or in
  // count per node: stages[i].node and stages[i].tp say which.
  int stages_per_node = 1;
  int tp = 1;                          // t; a mixed template's largest degree
  std::vector<StageShape> stages;      // S = n·k, in pipeline order
  std::vector<double> stage_seconds;   // w_i at the nominal link
  std::vector<uint64_t> stage_memory;  // peak bytes per GPU of each stage
  double bottleneck = 0;               // max w_i
  double total = 0;                    // Σ w_i
  uint64_t node_gradient_bytes = 0;    // largest per-node gradient (all-reduce volume)
  double update_seconds = 0;           // the slowest stage's update, once per iteration
  // The order its stages run their micro-batches in (ob-plan --schedule;
  // ChooseSchedule), and what that order saves on 1F1B's fill and drain:
  // saved_one at one micro-batch and saved at saved_at, linear between and
  // the same beyond (0 for 1F1B).
  const schedule::Schedule* schedule = &schedule::OneFOneB();
  double saved_one = 0, saved = 0;
  int saved_at = 1;
  // Per stage under its schedule: micro-batches held before their
  // backward (1F1B: S − i) and, past their input gradient, before W.
  std::vector<schedule::Held> stage_held;
  // Per stage (per slice with chunks): the op costs its schedule's orders
  // are made for (nominal links; StageCostsOf), which every worker of its
  // pipelines reads from the plan to run the same order. Empty in plans
  // before them: unit costs.
  std::vector<schedule::StageCosts> op_costs;
  std::vector<schedule::StageCosts> OrderCosts() const {
    if (op_costs.size() == Virtual().size()) return op_costs;
    return schedule::UnitCosts(static_cast<int>(Virtual().size()));
  }

  // Chunks (interleaved, zb-v; design/schedule.md): the model cut into V =
  // S·chunks slices, the virtual stages, in model order, slice k on stage
  // chain().StageOf(k); stage i's first/last are then those of its chunk
  // 0 (LayersOf lists all its ranges), and op_costs, OrderCosts and
  // StageCostsOf are per slice. One chunk: slices is empty.
  int chunks = 1;
  std::vector<StageShape> slices;
  // Of the data-parallel all-reduce of its busiest node, the seconds its
  // schedule hides (chunks: a chunk's gradients are final, and go on the
  // wire, once its last backward is done, while the node's other chunks
  // still compute; ChunkedTemplate). 0 for one chunk, whose stage 0
  // finishes last and exposes its all-reduce.
  double allreduce_hidden = 0;
  schedule::Chain chain() const { return schedule->ChainOf(static_cast<int>(stages.size()), chunks); }
  // The shapes the op costs are per: the slices with chunks, else the stages.
  const std::vector<StageShape>& Virtual() const { return chunks > 1 ? slices : stages; }
  // Stage i's shapes in chunk order: its slices, or the stage itself with
  // one chunk; and their layer ranges [first, last].
  std::vector<StageShape> ChunksOf(int i) const;
  std::vector<std::pair<int, int>> LayersOf(int i) const;

  // Time of m micro-batches (without the data-parallel all-reduce): 1F1B's
  // Σw + (m − 1)·max w, less what the schedule saves.
  double Seconds(int m) const { return total + (m - 1) * bottleneck - Saved(m); }
  // What stage i holds at its schedule's worst moment (stage_held, or
  // 1F1B's S − i where a template has none).
  schedule::Held HeldBy(int i) const {
    if (i < static_cast<int>(stage_held.size())) return stage_held[static_cast<size_t>(i)];
    return {static_cast<int>(stages.size()) - i, 0};
  }
  double Saved(double m) const {
    if (m >= saved_at) return saved;
    if (m <= 1) return saved_one;
    return saved_one + (saved - saved_one) * (m - 1) / (saved_at - 1);
  }
  // Which stage holds global layer `layer` (with chunks, the stage of the
  // slice holding it); -1 if no stage does.
  int StageOf(int layer) const;
  bool mixed() const { return stages_per_node < 1; }
  // The position within the pipeline of stage i's node.
  int NodeOf(int i) const {
    return mixed() ? stages[static_cast<size_t>(i)].node : i / stages_per_node;
  }
  // Stages [first, last] of the node at position q.
  int FirstStageOn(int q) const;
  int LastStageOn(int q) const;
};

struct TemplateSet {
  int min_nodes = 0;                   // n0: fewest nodes any template fits in
  std::vector<Template> templates;     // for n = min_nodes, min_nodes + 1, ..., in order
  const Template* ForNodes(int n) const;  // nullptr when there is none
  int max_nodes() const { return min_nodes + static_cast<int>(templates.size()) - 1; }
};

// What a pipeline of template `t` adds to its 1F1B once per iteration: the
// data-parallel all-reduce (when other pipelines exist: t spans fewer nodes
// than the cluster) and its slowest stage's update. On a --local
// cluster every collective of the step is priced by the profile's fit: the
// gradient buckets (when other pipelines exist), the tied weight with the
// losses and the gradient norms (when there is more than one rank).
double StepTailSeconds(const Problem& p, const Template& t);

// The peak bytes per GPU of stage i of `t` in a pipeline running m
// micro-batches: with chunks, at its order's worst moment over m
// (StageMemoryBytes over its slices); else at HeldBy(i).
uint64_t StageMemoryOf(const Problem& p, const Template& t, int i, int microbatches);

// Chooses t's schedule among p.schedules (design/schedule.md): the one
// whose pipeline finishes m micro-batches soonest (m: the template's
// expected share; ∞: its steady state, 2S), among those under which every
// stage fits in memory (1F1B always does: the template was cut for it);
// ties to the earlier in p.schedules. Times each at one and at m
// micro-batches (up to 2S) with the stages' forward, input- and
// weight-gradient seconds on the nominal links, and sets schedule,
// saved_one, saved, saved_at, stage_held and (for a schedule other than
// 1F1B) stage_memory. The saving's growth is kept within the bottleneck
// per micro-batch, so Seconds stays non-decreasing in m.
void ChooseSchedule(const Problem& p, Template* t, double m);

// The best template for exactly `nodes` nodes, or nullopt if no partition
// fits in memory (or there are more stages than layers for every k).
std::optional<Template> BestTemplate(const Problem& p, int nodes);

// n0, and a template for every n in [n0, N − f·n0], consecutively: the set
// stops before the first n without one (n·k > layers for every k, or no
// partition fits). kConfig when the model fits on no node count (naming the
// first layer that does not fit alone on a whole node, and the least memory
// per GPU that would do), or when N < n0·(f + 1) ("needs at least X nodes for
// f=…, n0=… (have N)", plus the memory per GPU that would bring n0 down to
// N / (f + 1) when that is at least 1). Messages are one line.
Result<TemplateSet> BuildTemplates(const Problem& p);

// BuildTemplates in two halves, for planning several f (FaultSweep): f
// enters only as the end of the range. The set for f = 0 (p.faults
// ignored; n0's errors), and that set cut to p.faults' range (the N <
// n0·(f + 1) error). CutTemplatesForFaults(p, BuildTemplatesForAnyFaults(p))
// equals BuildTemplates(p) for every p.faults.
Result<TemplateSet> BuildTemplatesForAnyFaults(const Problem& p);
Result<TemplateSet> CutTemplatesForFaults(const Problem& p, const TemplateSet& any);

// n0 alone: the fewest nodes a template of p fits on (0: none), as
// BuildTemplatesForAnyFaults finds it, without the templates.
int LeastNodes(const Problem& p);

// Mixed templates (ob-plan --mixed-stages, design/plan.md): stages of the
// given degrees in any number per node, every GPU of a node used, no
// stage across nodes, each fitting with its 1F1B in-flight count. The
// search is exact for Σw + (m − 1)·max w at m micro-batches (m = ∞: by
// (max w, Σw)) unless it stops at max_bounds bottleneck bounds (capped);
// no search (nullopt) where one DP pass would exceed max_work cells
// (L²·stages·GPUs·degrees), or when nothing fits.
struct MixedOptions {
  std::vector<int> degrees;   // empty: TensorParallelChoices(p)
  double max_work = 4e7;      // a 98-layer model passes up to three 8-GPU nodes
  int max_bounds = 48;
};
struct MixedResult {
  Template t;                 // mixed(), unless the best has one degree
  int bounds_tried = 0;
  bool capped = false;        // a better template may exist
};
std::optional<MixedResult> SearchMixed(const Problem& p, int nodes, double m, const MixedOptions& o = {});

// The tensor-parallel degrees t = g/k a template may use, ascending: t
// divides the model's heads and MLP width (the runtime's rule), and equals
// p.tp when that is set.
std::vector<int> TensorParallelChoices(const Problem& p);

}  // namespace ob::plan
