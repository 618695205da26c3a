// f from failure rates (ob-plan -f auto): the number of node failures a plan
// survives in place, chosen to maximise expected goodput, and the
// checkpoint interval for the failures beyond f. Torch-free, pure.
//
// The model (design/sim.md). N nodes fail independently, each every
// `node_mtbf_s` on average (exponential), and a failed node is back after
// `repair_s`: the cluster sees failures at λ = N / MTBF, and the number of
// nodes down at a time is Poisson with mean a = λ·R (an M/G/∞ queue, whose
// stationary law does not depend on the repair time's distribution). A
// failure that finds k nodes down (failures see the stationary law, PASTA)
// is survivable when k + 1 ≤ f: the survivors re-instantiate from the
// templates and redo at most the step in flight, costing `recovery_s` plus
// half an iteration on average. Otherwise (probability P(K ≥ f)) the job
// restarts from its last checkpoint: `restart_s` plus, on average, half a
// checkpoint interval of redone work. Checkpoints cost `checkpoint_s` of
// training time each, taken every C = sqrt(2·checkpoint_s / λ_beyond)
// (Young's interval, clamped to [one iteration, the horizon]; the horizon
// when nothing goes beyond f). While k nodes are out, whatever f, the run
// trains on N − k at (N − k)/N of the speed, so the throughput is scaled by
// 1 − a/N for every f alike; the planner gives each f's iteration time on
// all N nodes (`iteration_seconds(f, N)`).
//
//   goodput(f) = tokens / iteration(f, N) · (1 − a/N)
//                · (1 − λ·(1 − P_b)·(recovery_s + iteration/2) − μ·(1 − P_b)·takeover_s
//                     − λ·P_b·(restart_s + C/2) − checkpoint_s / C)
//
// with P_b = P(K ≥ f) and μ = 1 / MTBF, the master's host's failures. With
// --standby-master off, those μ are restarts whatever f: the in-place rate
// is (λ − μ)·(1 − P_b), the restarts' (λ − μ)·P_b + μ, and no takeover. f = 0 is checkpoint-restart alone. The f chosen is
// the smallest whose goodput is within 0.01% of the largest.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ob/status.h"

namespace ob::plan {

struct FailureModel {
  double node_mtbf_s = 0;      // mean time between failures of one node (> 0)
  double repair_s = 3600;      // a failed node's time out of the cluster
  double horizon_s = 30 * 86400.0;  // the run's length: bounds the checkpoint interval
  double recovery_s = 5;       // an in-place recovery (f covers the failure)
  double restart_s = 600;      // a restart from a checkpoint (beyond f)
  double checkpoint_s = 5;     // training time one checkpoint costs
  // The master's host (design/master.md), one of the N: with a standby
  // master its failure is recovered in place like another's, takeover_s
  // later (the standby hears the master's silence first); without one, it
  // is a restart from a checkpoint whatever f.
  bool standby_master = true;
  double takeover_s = 3;
};

// One candidate f.
struct FaultOption {
  int f = 0;
  bool feasible = false;
  std::string why;                 // when !feasible: the planner's reason
  double iteration_s = 0;          // all N nodes up
  double tokens_per_s = 0;         // all N nodes up
  double degraded_tokens_per_s = 0;  // with the nodes out on average
  double p_beyond = 0;             // a failure finds f nodes already down
  double failures_per_day = 0;     // λ, whole cluster
  double beyond_per_day = 0;       // λ·P_b
  double checkpoint_interval_s = 0;  // Young's C, at most the horizon
  double lost_fraction = 0;        // recoveries, restarts, redone work, checkpoints
  double goodput = 0;              // expected useful tokens/s
};

struct FaultChoice {
  int f = -1;                      // the chosen one
  std::vector<FaultOption> options;  // every f tried, in order
};

// The iteration time of the plan made for `f` failures on `nodes` nodes, or
// the planner's error when there is none.
using IterationSeconds = std::function<Result<double>(int f, int nodes)>;

// P(K ≥ k) for K ~ Poisson(mean).
double PoissonTail(double mean, int k);

// Tries f = 0, 1, ... up to `max_f` (or the first f the planner cannot
// instantiate) on `nodes` nodes whose iteration processes
// `tokens_per_iteration` tokens, and picks the f of largest goodput.
// kUsage for a model that is not one (MTBF ≤ 0, negative times); kConfig,
// naming the failure rate and what took the time (every node out at once
// for its repair; else the shares of recoveries, restarts and checkpoints
// at the best f), when no f leaves a positive goodput, or none can be
// planned.
Result<FaultChoice> ChooseFaults(int nodes, double tokens_per_iteration, const FailureModel& model,
                                 const IterationSeconds& iteration_seconds, int max_f = 16);

// The table ob-plan --explain prints for -f auto.
std::string ExplainFaultChoice(const FaultChoice& choice, const FailureModel& model, int nodes);

// "7.9h", "30d", "90s", "45m", "1.5d" and plain seconds: a duration; kUsage
// naming `what` otherwise.
Result<double> ParseDuration(const std::string& text, const std::string& what);

}  // namespace ob::plan
