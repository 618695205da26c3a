// The master's control socket (master.h, ob-launch(1) "Run directory"):
// the operator's and ob-watch's requests, and the status answer.
#include "ob/launch/master/master_impl.h"

#include "ob/launch/wire/store_keys.h"
#include "ob/log.h"

namespace ob::launch::detail {

pb::OperatorResponse Master::OnOperator(const pb::OperatorRequest& req) {
  pb::OperatorResponse r;
  r.set_ok(true);
  r.set_run(run_id_);
  // Evidence from another run's records (ob-watch --act fed another job's
  // metrics, or an old run's) must not steer this one.
  if (!req.run().empty() && req.run() != run_id_) {
    r.set_ok(false);
    r.set_error("this request is for run " + req.run() + ", and this master runs run " + run_id_ +
                ": its evidence came from another run's records");
    events_.Write("refuse", "request for run " + req.run() + " (" + pb::OperatorCommand_Name(req.command()) +
                                "): not this run's");
    OB_LOG(Warn) << "refused a request for run " << req.run() << " (this is run " << run_id_ << ")";
    return r;
  }
  switch (req.command()) {
    case pb::OPERATOR_STOP:
      RequestStop(req.reason());
      break;
    case pb::OPERATOR_STATUS:
      break;
    case pb::OPERATOR_CHECKPOINT_NOW: {
      if (opt_.ckpt_dir.empty()) {
        r.set_ok(false);
        r.set_error("no --ckpt-dir: nowhere to save");
        return r;
      }
      Result<int64_t> k = AskCheckpoint(req.reason());
      if (!k.ok()) {
        r.set_ok(false);
        r.set_error(k.status().message());
        return r;
      }
      break;
    }
    case pb::OPERATOR_EXCLUDE_HOST:
    case pb::OPERATOR_DRAIN:
      if (const std::string why = Exclude(req); !why.empty()) {
        r.set_ok(false);
        r.set_error(why);
        return r;
      }
      break;
    case pb::OPERATOR_ROLLBACK: {
      const std::string why = Rollback(req.reason());
      if (!why.empty()) {
        r.set_ok(false);
        r.set_error(why);
      }
      break;
    }
    default:
      r.set_ok(false);
      r.set_error("not a request the master takes here");
      return r;
  }
  static const char* kStates[] = {"starting", "running", "stopping", "stopped"};
  r.set_state(kStates[static_cast<int>(state_)]);
  r.set_step(metrics_.last_step());
  r.set_world_size(static_cast<uint32_t>(ranks_.size()));
  r.set_workers_running(static_cast<uint32_t>(state_ == State::kRunning ? ranks_.size() - ranks_done_ : 0));
  r.set_uptime_seconds((Now() - start_ms_) / 1e3);
  r.set_waiting_for(WaitingFor());
  agents_.Report(Now(), &r);
  return r;
}

// ob-launch exclude and drain (and ob-watch's actions): the host taken out
// now, since the survivors resume from the last step every one of them
// completed, so nothing is lost by not waiting. "" when done, else why not.
std::string Master::Exclude(const pb::OperatorRequest& req) {
  AgentState* a = agents_.Find(req.host());
  if (a == nullptr || a->state != AgentState::State::kConnected || state_ != State::kRunning) {
    return a == nullptr ? "no host '" + req.host() + "' in this run"
                        : "host '" + req.host() + "' is not running workers";
  }
  std::string reason = req.reason();
  if (req.slowdown() > 0) {
    // A slow host, not a failed one: out only if the plan runs faster
    // without it than with it at that speed.
    if (decide_deadline_ms_ >= 0 || rec_.active()) {
      return "kept " + req.host() + ": a recovery is in progress";
    }
    const plan::Exclusion x =
        plan::WeighExclusion(loaded_.problem, loaded_.templates, loaded_.instantiation,
                             a->node, req.slowdown(), LiveIdle());
    if (!x.pays) {
      events_.Write("keep", "host=" + req.host() + " " + x.reason + "; " + reason);
      OB_LOG(Warn) << "kept slow host " << req.host() << ": " << x.reason;
      return "kept " + req.host() + ": " + x.reason;
    }
    reason += " (" + x.reason + ")";
  }
  // Never the last replica of a layer: the survivors could not go on,
  // and the run would end (or roll back to its last checkpoint),
  // losing the steps the operator meant to keep. `stop` ends a run.
  // Hosts already lost whose recovery is still to come count as gone.
  std::vector<int> gone = {a->node};
  for (const auto& pipe : loaded_.instantiation.pipelines) {
    for (int n : pipe.nodes) {
      if (n != a->node && !agents_.at(n).connected()) gone.push_back(n);
    }
  }
  const plan::Recovery without =
      plan::Reinstantiate(loaded_.problem, loaded_.templates, loaded_.instantiation, gone, LiveIdle());
  if (!without.lost_layers.empty()) {
    const std::string why = "kept " + req.host() + ": without it " + without.reason +
                            " (the run would stop, or roll back to its last checkpoint; 'stop' ends it)";
    events_.Write("keep", "host=" + req.host() + " " + why + "; " + reason);
    OB_LOG(Warn) << why;
    return why;
  }
  const char* verb = req.command() == pb::OPERATOR_DRAIN ? "drained" : "excluded";
  events_.Write("exclude", "host=" + req.host() + " " + reason);
  HostLost(*a, std::string("host ") + req.host() + " " + verb + ": " + reason, 0, Lost::kExcluded);
  return "";
}

std::string Master::WaitingFor() {
  if (state_ != State::kRunning) return "";
  if (decide_deadline_ms_ >= 0) return "deciding: gathering the failures detected within " + std::to_string(kDecideMs) + " ms";
  std::vector<RecoveryClock::Rank> ranks(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    ranks[r].phase = ranks_[r].phase;
    ranks[r].stepped = ranks_[r].exited || ranks_[r].have_metrics;
  }
  for (const auto& a : agents_.all()) {
    for (int r : a->ranks) {
      if (static_cast<size_t>(r) < ranks.size()) ranks[static_cast<size_t>(r)].host = a->host.name;
    }
  }
  return rec_.WaitingFor(generation_, ranks);
}

}  // namespace ob::launch::detail
