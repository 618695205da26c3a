// Instantiation and batch split (design/plan.md): how many pipelines of each
// template, which nodes run them, and how many micro-batches each gets.
// Torch-free, pure.
//
// Cost model: pipeline j of template n with m_j micro-batches finishes in
//   T_j = Template::Seconds(m_j) + StepTailSeconds(template)
// and the iteration takes max_j T_j. Every pipeline gets at least one
// micro-batch, the micro-batches sum exactly to M, and there are at least
// f + 1 pipelines using all N nodes. Instantiate minimises the iteration time
// exactly: a bisection on the time τ, each step a knapsack DP over node
// counts that maximises the micro-batches the pipelines can finish by τ
// (cap_n(τ) = the most m ≤ M with T(m) ≤ τ; a template with cap 0 is unusable
// at τ; τ is feasible when the best total is ≥ M), never enumerating
// multisets. The optimum is one of the values T_n(m), so the bisection runs
// on τ until at most 64 such candidates remain and then binary-searches them.
// The DP's pipeline count is clipped at f + 1 — O(N · templates · (f + 2))
// per step — unless N / n0 > M, when P ≤ M binds: then, when the templates
// usable at τ have consecutive sizes a..b and N / b ≥ f + 1, τ is feasible
// exactly when ⌈N/b⌉ ≤ M and a knapsack over nodes alone (O(N · templates))
// finishes M (instantiation.cc says why); else P is tracked exactly up to M
// (O(N · templates · M)). About 4 ms for N = 1024, 91 templates.
#pragma once

#include <vector>

#include "ob/plan/problem.h"
#include "ob/plan/templates.h"
#include "ob/status.h"

namespace ob::plan {

struct PipelineInstance {
  int template_nodes = 0;      // which template
  std::vector<int> nodes;      // node ids (0..N-1), in stage order
  int microbatches = 0;
};

struct Instantiation {
  std::vector<PipelineInstance> pipelines;
  double iteration_seconds = 0;   // max over pipelines of T_j
  int nodes_used() const;         // Σ template_nodes
};

// T_j for a pipeline of template `t` running m micro-batches.
double PipelineSeconds(const Problem& p, const Template& t, int m);

// Every pipeline's T_j (its iteration, step tail included) and the
// seconds its stages spend computing, summed over all stages.
struct PipelineTimes {
  std::vector<double> seconds;   // per pipeline of the instantiation
  double busy = 0;
  // Per pipeline, per stage: the seconds it computes; set by the
  // shared-cores replay only (the closed form's is m · StageComputeSeconds).
  std::vector<std::vector<double>> stage_busy;
};

// PipelineSeconds of each pipeline and Σ m·StageComputeSeconds; on a local
// cluster with a measured contention curve, the pipelines' schedules
// replayed together on the shared cores (schedule.h SharedCoresTimes).
PipelineTimes TimePipelines(const Problem& p, const TemplateSet& ts, const Instantiation& inst);
// The largest of TimePipelines' seconds.
double SlowestPipelineSeconds(const Problem& p, const TemplateSet& ts, const Instantiation& inst);

// Splits M micro-batches over pipelines of the given templates, minimising
// the slowest T_j (greedy: each next micro-batch goes to the pipeline that
// would finish it first, ties to the lower index; optimal because each T_j is
// non-decreasing in m). Every pipeline gets at least one; kConfig if M < the
// number of pipelines or a node count has no template in `ts`.
Result<std::vector<int>> SplitBatch(const Problem& p, const TemplateSet& ts,
                                    const std::vector<int>& template_nodes);

// The optimal instantiation; pipelines are ordered by template size, largest
// first (the split then by SplitBatch), and nodes are given ids 0..N-1 in
// pipeline order (placement reorders them). Ties between optimal multisets
// are broken deterministically (the DP tries larger templates first, keeps
// strict improvements). kConfig if no multiset of templates covers N nodes
// with f + 1 ≤ P ≤ M pipelines, or M < f + 1.
Result<Instantiation> Instantiate(const Problem& p, const TemplateSet& ts);

// The instantiation the user fixed (ob-plan --pipelines, as Megatron's fixed
// pipeline and data-parallel sizes): pipelines of the given node counts,
// largest first, node ids 0..N-1 in that order, the batch split by
// SplitBatch. kConfig (one line, naming the first count at fault) when the
// counts do not sum to N, are fewer than f + 1, more than M, or a count has
// no template.
Result<Instantiation> InstantiateGiven(const Problem& p, const TemplateSet& ts,
                                       std::vector<int> pipeline_nodes);

// One tensor-parallel degree for every template (replicas split alike sum
// a layer's gradient shard by shard, and a recovery never re-cuts state;
// mixed degrees, which the runtime sums in pieces, only when asked, by
// Problem::tp_at): the
// degree among TensorParallelChoices(p) whose templates instantiate on the
// cluster with the least iteration time (ties: the smaller degree). The
// error of the last degree tried when none instantiates.
Result<int> ChooseTensorParallel(const Problem& p);

// ChooseTensorParallel's degree with what it made to choose it: that
// degree's templates and their instantiation (Instantiate's), which a
// caller planning the degree need not make again.
// With a sweep (fault_sweep.h), its templates and instantiations.
struct TensorParallelPlan {
  int tp = 0;
  TemplateSet templates;
  Instantiation inst;
};
class FaultSweep;
Result<TensorParallelPlan> ChooseTensorParallelPlan(const Problem& p, FaultSweep* sweep = nullptr);

// Whether Instantiate(p, ts) is the same for every f that leaves ts and
// M ≥ f + 1 as they are: more pipelines than micro-batches are possible
// (N / n0 > M), and no multiset of ts has fewer than f + 1 (N / the largest
// ≥ f + 1), so that f + 1 ≤ P never binds (instantiation.cc).
bool InstantiationIgnoresFaults(const Problem& p, const TemplateSet& ts);

// Recomputes microbatches (by SplitBatch) and iteration_seconds of `inst` for
// its pipelines, keeping their order and nodes; SplitBatch's errors.
Status Rebalance(const Problem& p, const TemplateSet& ts, Instantiation* inst);

}  // namespace ob::plan
