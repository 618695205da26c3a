// ob-sim (docs/design/sim.md): a plan's run over days of node failures
// and repairs, each failure decided by the master's own DecideRecovery
// (launch/master/decision.h), not by a model of it. Torch-free, pure: the same
// trace, plan and costs give the same result.
//
// The run, as the simulator sees it. The current instantiation trains at
// its iteration time (the planner's cost model, as ob-plan predicts it);
// every K steps a checkpoint costs `checkpoint_s` of training time. A
// failure ends the step in flight (its work is lost) and the master
// decides, with the facts it would have: the live nodes, the nodes lost
// since `holding` (the last instantiation that completed a step), whether
// the lineage has steps, the recoveries in a row without a step, and the
// newest checkpoint. The decision's kind sets what follows:
//   in place, re-instantiation: training resumes after `recovery_s` on
//     the decision's instantiation, from the last completed step;
//   a restart from a checkpoint: after `restart_s`, from the last
//     checkpoint's step (the steps since are redone);
//   stop: the job is down (back to the last checkpoint) until the nodes
//     that come back let the templates be instantiated again, then restarts
//     from the checkpoint after `restart_s` (a scheduler's requeue).
// A node that comes back joins at a decision of its own (the master's
// "hosts came back"), costing a recovery like any other.
//
// The checkpoint-restart policy (torchrun-style) ignores the templates'
// fault tolerance: the plan instantiated with f = 0 on every node, every
// failure a restart from the last checkpoint after `restart_s`, on as many
// nodes as before (a spare takes the failed node's place within the
// restart time; the repair returns the node to the spare pool).
//
// The Oobleck-style policy is our reading of Oobleck's published design
// (SOSP '23): the same reconfiguration from the templates on failures (here
// through the same decision function), f as the user chose it, and nodes
// that come back are not taken in again during the run; beyond f, a
// restart from the last checkpoint.
//
// Useful work is the steps that are never redone; ETTR (effective training
// time ratio) is the iteration time of those steps over the horizon;
// goodput, their tokens per second of the horizon.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ob/launch/master/decision.h"
#include "ob/plan/plan_io.h"
#include "ob/status.h"

namespace ob::sim {

struct TraceEvent {
  double t = 0;       // seconds from the start of the run
  bool fail = true;   // false: the node is back
  int node = 0;       // index into the plan's hosts
};

// A failure trace file: one event a line, "TIME fail|repair HOST" (TIME a
// duration from the start: 3600, 90m, 7.9h, 2d; HOST a name of the plan's
// hosts or a node index), '#' comments and blank lines ignored; events in
// any order (sorted by time, stable). kDataErr naming `path`:line and the
// problem, which includes a node failing while down or repaired while up,
// in time order.
Result<std::vector<TraceEvent>> ParseTrace(const std::string& text, const std::string& path,
                                           const std::vector<std::string>& hosts);

// Independent nodes, each up for a Weibull time of mean `node_mtbf_s`
// (shape 1: exponential) and then down for `repair_s`, over the horizon;
// seeded, so the same model gives the same trace. kUsage when it would
// hold more than `max_events` events (a small shape draws mostly times far
// below their mean: the count is not the mean's horizon / MTBF) or the
// shape makes no finite scale.
struct TraceModel {
  double node_mtbf_s = 0;
  double weibull_shape = 1;
  double repair_s = 3600;
  double horizon_s = 30 * 86400.0;
  uint64_t seed = 1;
};
Result<std::vector<TraceEvent>> GenerateTrace(int nodes, const TraceModel& m, size_t max_events = 50000000);

// The mean time from a failure's detection to the new generation's first
// step, of the `recovered` lines of an events.log (total_ms − first_step_ms:
// total_ms runs to the end of that first step), in seconds, and how many
// there were; kDataErr naming `path` when it has none. Not counted: a
// first step slower than those after it, and detect_ms (for a connection
// that closes, the time since the host's last message: the step in flight,
// which the simulator charges as lost work; a host that goes silent is
// detected after a timeout that --recovery-time should then include).
struct RecordedRecoveries {
  double mean_s = 0;
  int count = 0;
};
Result<RecordedRecoveries> RecoveriesFromEvents(const std::string& text, const std::string& path);

enum class Policy { kOb, kCheckpointRestart, kOobleck };
// "ob", "checkpoint-restart", "oobleck-style": the names --policy takes and
// SimResult::policy carries.
const char* PolicyName(Policy p);
// The policy of that name; kUsage naming the names there are otherwise.
Result<Policy> ParsePolicy(const std::string& name);

using DecideFn = std::function<launch::Decision(const launch::RecoveryFacts&)>;

struct SimOptions {
  Policy policy = Policy::kOb;
  double horizon_s = 30 * 86400.0;
  double recovery_s = 5;        // an in-place restart or a re-instantiation
  double restart_s = 600;       // a restart from a checkpoint
  double checkpoint_s = 5;      // training time one checkpoint costs
  double checkpoint_interval_s = 3600;  // between checkpoints (at least one step)
  // Every instantiation's predicted iteration time is multiplied by this:
  // a run's measured step time over the plan's predicted one (ob-sim
  // --iteration-time), so that the planner's model errors do not become
  // the simulator's. 1: the prediction as it is.
  double iteration_scale = 1;
  // The master's host (design/master.md): plan node `master_node` at the
  // start (-1: none of the plan's). With a standby master its failure is a
  // lost node like another, recovered takeover_s later (the standby hears
  // the master's silence first), and the master moves to the first live
  // node; without one, the job restarts from its last checkpoint after
  // restart_s on the live nodes (a scheduler's requeue), whatever f.
  // (Checkpoint-restart restarts on every failure already.)
  int master_node = 0;
  bool standby_master = true;
  double takeover_s = 3;
  DecideFn decide;              // the master's (launch::DecideRecovery) when empty
  // Called after each event with the events done and their total (progress
  // of long traces); may be empty.
  std::function<void(size_t done, size_t total)> progress;
};

struct SimResult {
  std::string policy;           // PolicyName(options.policy)
  int nodes = 0;
  int faults = 0;               // the plan's f (0 for checkpoint-restart)
  double horizon_s = 0;
  double tokens_per_step = 0;
  double nominal_iteration_s = 0;  // every node up, as planned (times iteration_scale)
  double mean_iteration_s = 0;     // over the steps the run completed, redone ones too
  double worst_iteration_s = 0;    // the slowest instantiation it trained on
  int64_t steps = 0;            // useful: never redone
  int64_t steps_redone = 0;     // completed, then lost to a restart from a checkpoint
  double goodput = 0;           // useful tokens per second of the horizon
  double ettr = 0;              // useful steps' iteration time over the horizon
  // Where the horizon went (seconds; they sum to it).
  double training_s = 0, checkpointing_s = 0, recovering_s = 0, restarting_s = 0, down_s = 0;
  double lost_work_s = 0;       // of training_s: steps in flight at a failure, and redone steps
  int failures = 0, repairs = 0;
  int in_place = 0, reinstantiations = 0, checkpoint_restarts = 0, stops = 0;
  int master_failures = 0;      // of `failures`: the master's host's (a takeover, or a restart without a standby)
  // (time, useful steps so far) after each event, and the failures' times:
  // the timeline.
  std::vector<std::pair<double, int64_t>> timeline;
  std::vector<double> failure_times;
};

// kConfig when the plan cannot be instantiated for the policy (no f = 0
// instantiation on every node); kUsage for negative costs or a horizon that
// is not positive.
Result<SimResult> Simulate(const plan::LoadedPlan& plan, const std::vector<TraceEvent>& trace,
                           const SimOptions& options);

// The results side by side, one line of figures per policy.
std::string Report(const std::vector<SimResult>& results);

// Useful steps over time, one line per result, failures as ticks along
// the time axis: an SVG document headed by `title`.
std::string TimelineSvg(const std::vector<SimResult>& results, const std::string& title);

}  // namespace ob::sim
