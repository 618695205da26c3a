// The recovery decision (design/recovery.md), in a room of its own: a pure
// function from the facts the master gathered to what it does next. The
// master only gathers facts (who is connected, who was lost, where the
// layers are, which checkpoint verifies) and carries the decision out;
// every scenario of a failing cluster is a unit test of DecideRecovery
// that runs in milliseconds (tests/unit/decision_test.cc).
//
// Where the layers are. Workers restore from the snapshots their agents
// keep (runtime/snapshot_arena.h), and those are laid out as `holding`:
// the instantiation of the newest generation every rank of which completed
// a step. Until a new generation has done so its fetches may not have
// happened, and hosts it left idle still hold what they held. So a failure
// during a recovery is decided against `holding` with every loss since it
// (`lost`): losing h4 and then h1 90 ms after the first decision is the
// same decision as losing both at once, and an idle host that still holds
// a layer is a replica of it. Deciding against the half-reached new
// instantiation instead would count layers its fetches had not copied yet
// and miss those only an idle host holds.
//
// When the lineage has no step yet (a fresh start, a restart from a
// checkpoint, a rollback: WeightLineage below), every worker reads its
// layers from the lineage's start, so any instantiation of the live nodes
// will do and no layer can be lost.
//
// The outcomes, in the order they are considered:
//   stop (kTempFail) after kMaxFruitless recoveries in a row that completed
//     no step, or when hosts were lost right after the master's own stall
//     (theirs is not the fault: the agents gave up on a master that did not
//     run; SIGSTOP, a starved CPU);
//   a rollback: the newest usable checkpoint on the current instantiation,
//     else stop (kDataErr: the model diverged and there is nothing to go
//     back to);
//   restart in place: nothing lost, nothing added since `holding`;
//   re-instantiate (plan/recovery.h) from `holding` without the lost
//     nodes, with the live nodes it does not hold as added ones;
//   restore from the newest usable checkpoint, the templates instantiated
//     afresh on the live nodes, when some layer has no replica left;
//   stop (kTempFail) naming the layers, and why no checkpoint helps.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <utility>
#include <string>
#include <vector>

#include "ob/control.pb.h"
#include "ob/plan/instantiation.h"
#include "ob/plan/plan_io.h"
#include "ob/plan/recovery.h"
#include "ob/launch/wire/weight_source.h"
#include "ob/status.h"

namespace ob::launch {

inline constexpr int kMaxFruitless = 3;  // recoveries in a row that complete no step before giving up

struct CheckpointRef {
  std::string path;
  int64_t step = -1;
};

struct RecoveryFacts {
  const plan::LoadedPlan* plan = nullptr;  // problem and templates; REQUIRES: set
  plan::Instantiation current;             // what the current generation runs
  plan::Instantiation holding;             // where the snapshots are (above)
  bool snapshots = true;                   // the lineage has steps: layers come from `holding`
  std::vector<int> live;                   // nodes whose agents are connected now
  std::vector<int> lost;                   // nodes lost since `holding` (some may be live again)
  std::string lost_names;                  // the hosts lost in this event, for the text ("" none)
  std::string what;                        // the first failure detected, for the text
  int fruitless = 0;                       // recoveries since a step, this one included
  int64_t stalled_ms = 0;                  // the master's own stall just before (0: none)
  double master_timeout_s = 0;             // for the text
  std::string rollback;                    // non-empty: roll back to a checkpoint, why
  // The newest checkpoint that verifies and is this job's; nullptr: no
  // --ckpt-dir. Called only when the decision needs one (it reads files).
  std::function<Result<CheckpointRef>()> newest_checkpoint;
};

struct Decision {
  enum class Kind { kInPlace, kReinstantiate, kCheckpoint, kStop };
  Kind kind = Kind::kStop;
  plan::Instantiation next;                // kInPlace, kReinstantiate, kCheckpoint
  std::vector<plan::LayerFetch> fetches;   // kReinstantiate
  std::vector<int> idle;                   // live nodes `next` leaves out
  CheckpointRef checkpoint;                // kCheckpoint
  std::string text;                        // one line for events.log
  Status stop;                             // kStop: the run's outcome
};

Decision DecideRecovery(const RecoveryFacts& facts);

// A host↔host partition (peer_probe.h): `cut` holds the pairs (a < b) of
// live nodes one of which reported it cannot reach the other. The nodes to
// exclude so that every remaining pair reaches each other: again and again
// the one that reaches the fewest of the others (the side that cannot reach
// the majority), ties broken by the highest node id. None, with `why`, when
// every pair is cut: probes that cannot tell (a firewall that drops them),
// not a partition to act on.
struct PartitionVerdict {
  std::vector<int> exclude;
  std::string why;  // one line: who cannot reach whom, and the choice
};
PartitionVerdict PartitionExclusions(const std::vector<int>& live, const std::set<std::pair<int, int>>& cut);

// The cuts agents report (AgentPool::Cuts), by what their reporter saw:
// `whole`, from a host that reports every peer of its generation
// unreachable; `partial`, from one that still reaches some.
struct CutReports {
  std::set<std::pair<int, int>> partial;
  std::set<std::pair<int, int>> whole;
};

// Which reported cuts to judge now. A host that reaches some of its peers
// and not others is evidence at once (a partition; the far side reports it
// too, a round later at most). A host that reaches none is either cut off,
// and then the others report it as well (partial reports, judged at once),
// or behind a firewall that drops the probes everywhere, and then every
// host will report every other. The agents confirm on probe rounds of their
// own, so the first such reports named one host alone: judged at once, it
// was excluded, then the next, until the job stopped. Whole reports are
// judged once every report has stayed the same for kCutSettleMs (a probe
// round with its timeout, and two agent heartbeats).
inline constexpr int64_t kCutSettleMs = 2200;
class CutSettle {
 public:
  std::optional<std::set<std::pair<int, int>>> Update(const CutReports& reports, int64_t now_ms);

 private:
  std::set<std::pair<int, int>> seen_;
  int64_t since_ms_ = 0;
};

// The templates instantiated afresh on `live` nodes (for a restart from a
// checkpoint): with the plan's fault tolerance if they allow it, else as
// much as they do. kConfig when no pipeline fits.
Result<plan::Instantiation> InstantiateOn(const plan::LoadedPlan& plan, const std::vector<int>& live);

// Where each generation's weights come from (control.proto's
// WeightSource). A lineage starts from the initial weights or from a
// checkpoint; once every rank of one of its generations has completed a
// step, later generations start from the workers' snapshots of that
// lineage, and before that from its start again. A checkpoint chosen for
// the next generation (a resume, a restart beyond f, a rollback) starts a
// new lineage, named by the generation that starts it.
class WeightLineage {
 public:
  // The next generation, `generation`, starts from checkpoint `c`.
  void RestoreNext(const CheckpointRef& c) { restore_ = c; }
  bool restoring() const { return !restore_.path.empty(); }
  // The source of generation `generation` (called once per generation).
  pb::WeightSource Next(uint64_t generation);
  // Every rank of the current generation completed a step.
  void Stepped() { has_steps_ = true; }
  bool has_steps() const { return has_steps_; }
  // What a standby master mirrors (design/master.md), and takes over with.
  const pb::WeightSource& start() const { return start_; }
  void Adopt(const pb::WeightSource& start, bool has_steps) {
    start_ = start;
    has_steps_ = has_steps;
  }

 private:
  pb::WeightSource start_;
  bool has_steps_ = false;
  CheckpointRef restore_;
};

}  // namespace ob::launch
