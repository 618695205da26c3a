// How the master stops (design: launch, "Stopping"): asked (a signal, the
// operator) or at the end, with a checkpoint first where --ckpt-dir asks for
// one, and what the exit code says of the work kept.
#include "ob/launch/master/master_impl.h"

#include <algorithm>
#include <utility>

#include "ob/clock.h"
#include "ob/io/text.h"
#include "ob/launch/wire/store_keys.h"
#include "ob/log.h"

namespace ob::launch {

using io::Fixed;

namespace detail {

void Master::RequestStop(const std::string& reason) {
  if (state_ == State::kStopping || state_ == State::kDone) return;
  if (state_ == State::kFollowing) {  // a standby asked to stop: the master's run is the master's
    events_.Write("standby-stop", reason);
    OB_LOG(Info) << "standby master stopping: " << reason;
    state_ = State::kDone;
    agents_.Close();
    uv_stop(&loop_);
    return;
  }
  events_.Write("stop-request", reason);
  // Nothing to save before the run's first step: its weights are the
  // checkpoint it resumed from, or the seed's.
  if (stop_requested_ || state_ != State::kRunning || !ckpt_.enabled() || !metrics_.stepped()) {
    return BeginStop(reason, StopWithoutSaving(reason));
  }
  stop_requested_ = true;
  stop_reason_ = reason;
  grace_deadline_ms_ = Now() + static_cast<int64_t>(opt_.stop_grace_s * 1e3);
  AskStopCheckpoint();
}

std::vector<pb::UncheckedCopy> Master::CopiesOfData(bool differing) const {
  std::vector<pb::UncheckedCopy> out;
  const std::string flag = "--data";
  for (const cluster::Host& h : hosts_) {
    std::string identity;
    if (differing) {
      std::optional<std::string> d = store_.Get(InputCheckDiffersKey(flag, h.name));
      if (!d) continue;
      identity = *d;
    } else {
      std::optional<std::string> claim = store_.Get(InputCheckClaimKey(flag, h.name));
      if (!claim) continue;
      identity = InputCheckClaimIdentity(*claim);
      if (store_.Get(InputCheckDoneKey(flag, h.name)) == identity) continue;  // its bytes agreed
    }
    pb::UncheckedCopy& u = out.emplace_back();
    u.set_host(h.name);
    u.set_flag(flag);
    u.set_identity(identity);
  }
  if (differing) return out;
  for (const pb::UncheckedCopy& u : inherited_unchecked_) {
    if (store_.Get(InputCheckDoneKey(u.flag(), u.host())) == u.identity()) continue;  // found the job's here
    if (std::none_of(out.begin(), out.end(), [&](const pb::UncheckedCopy& x) { return SameCopy(x, u); })) {
      out.push_back(u);
    }
  }
  return out;
}

std::string Master::Unsaved() const {
  if (!metrics_.stepped()) return "";
  const int64_t saved = std::max(ckpt_.good_step(), ckpt_.resume().step);
  const int64_t last = static_cast<int64_t>(metrics_.last_step());
  if (last <= saved) return "";
  const bool one = saved + 1 == last;
  const std::string steps =
      one ? "step " + std::to_string(last) : "steps " + std::to_string(saved + 1) + "-" + std::to_string(last);
  return steps + ", trained since " + (saved < 0 ? "the start" : "the checkpoint of step " + std::to_string(saved)) +
         (one ? ", is" : ", are") + " not on disk";
}

Status Master::StopWithoutSaving(const std::string& reason) const {
  const std::string lost = Unsaved();
  if (lost.empty()) return Status::Ok();
  return Status::TempFail(reason + ": stopped without saving: " + lost + (ckpt_.enabled() ? "" : " (no --ckpt-dir)"));
}

Result<int64_t> Master::AskCheckpoint(const std::string& reason) {
  const int64_t k = static_cast<int64_t>(metrics_.last_step()) + 2;
  if (opt_.steps > 0 && k > opt_.steps - 1) {
    return Status::Usage("too late: the run ends at step " + std::to_string(opt_.steps - 1) + ", before step " +
                         std::to_string(k) + ", the first no worker may have begun");
  }
  OB_RETURN_IF_ERROR(store_.Set(CheckpointNowKey(generation_), std::to_string(k)));
  events_.Write("checkpoint-request", "step=" + std::to_string(k) + " " + reason);
  return k;
}

// The master stops once the checkpoint is committed (CheckStopCheckpoint).
void Master::AskStopCheckpoint() {
  Result<int64_t> k = AskCheckpoint(stop_reason_);
  stop_ckpt_generation_ = generation_;
  if (!k.ok() && k.status().code() == Code::kUsage) {  // the run ends first, and saves its last step
    grace_deadline_ms_ = -1;
    OB_LOG(Info) << stop_reason_ << ": " << k.status().message() << "; letting the run finish (again to stop now)";
    return;
  }
  if (!k.ok()) return BeginStop(stop_reason_ + "; cannot ask for a checkpoint: " + k.status().message(), k.status());
  stop_ckpt_step_ = *k;
  OB_LOG(Info) << stop_reason_ << ": saving a checkpoint after step " << *k
               << ", then stopping (again to stop now, without it)";
}

void Master::CheckStopCheckpoint(int64_t now) {
  if (!stop_requested_ || state_ == State::kStopping || state_ == State::kDone) return;
  if (stop_ckpt_step_ >= 0 && ckpt_.good_step() >= stop_ckpt_step_) {
    return BeginStop(stop_reason_ + "; saved the checkpoint of step " + std::to_string(ckpt_.good_step()),
                     Status::Ok());
  }
  if (stop_ckpt_step_ >= 0 && ckpt_.failed_step() >= stop_ckpt_step_) {
    const std::string msg = stop_reason_ + ": the checkpoint of step " + std::to_string(stop_ckpt_step_) +
                            " failed; the work since the last good checkpoint is not on disk";
    return BeginStop(msg, Status::IoErr(msg));
  }
  if (grace_deadline_ms_ >= 0 && now >= grace_deadline_ms_) {
    const std::string msg = stop_reason_ + ": no checkpoint committed within --stop-grace " +
                            Fixed(opt_.stop_grace_s, 0) + " s; the work since the last good checkpoint is not on disk";
    return BeginStop(msg, Status::TempFail(msg));
  }
  // A recovery started a new generation before the save: ask it again.
  if (state_ == State::kRunning && stop_ckpt_generation_ != generation_ && decide_deadline_ms_ < 0) {
    AskStopCheckpoint();
  }
}

void Master::BeginStop(const std::string& reason, Status outcome) {
  if (state_ == State::kStopping || state_ == State::kDone) return;
  Progress();  // the last figures, if not printed yet
  state_ = State::kStopping;
  outcome_ = std::move(outcome);
  stop_deadline_ms_ = Now() + kStopWaitMs;
  grace_deadline_ms_ = -1;
  if (outcome_.ok()) {
    OB_LOG(Info) << "stopping: " << reason;
    // The prediction of the layout that ran last (a recovery re-instantiates).
    const auto& in = plan_.instantiation();
    const double predicted = in.placed_iteration_seconds() > 0 ? in.placed_iteration_seconds() : in.iteration_seconds();
    if (const std::string s = metrics_.Summary(predicted, PricedForAnother()); !s.empty()) {
      OB_LOG(Info) << s;
    }
  }
  if (!metrics_.lost().empty()) {
    OB_LOG(Warn) << metrics_.lost();
  }
  events_.Write("stop", reason);
  if (standby_.conn) {  // the last changes, then the end: the standby stops too
    SyncStandby();
    pb::Control m;
    m.mutable_stop()->set_reason(reason);
    standby_.conn->Send(m);
  }
  standby_wanted_ = false;
  agents_.Stop(reason);
  server_.Close();
}

std::string Master::PricedForAnother() const {
  // The profile's device: "cpu" or "cuda" (measured), or the GPU an analytic
  // profile modelled ("h100"); the run's: each agent's --device resolved.
  const auto& d = plan_.profile().device();
  const bool plan_cpu = d.kind() == "cpu";
  for (const auto& a : agents_.all()) {
    if (a->device.empty()) continue;
    if ((a->device == "cpu") == plan_cpu) return "";
    return d.kind() + (d.name().empty() || d.name() == d.kind() ? "" : " (" + d.name() + ")") + ", not this run's " +
           a->device;
  }
  return "";
}

void Master::FinishStop() {
  if (state_ == State::kDone) return;
  state_ = State::kDone;
  agents_.Close();
  server_.Close();
  operator_.Close();
  for (uv_handle_t* h : {reinterpret_cast<uv_handle_t*>(&tick_), reinterpret_cast<uv_handle_t*>(&heartbeat_),
                         reinterpret_cast<uv_handle_t*>(&progress_), reinterpret_cast<uv_handle_t*>(&sigchld_),
                         reinterpret_cast<uv_handle_t*>(&sigterm_), reinterpret_cast<uv_handle_t*>(&sigint_),
                         reinterpret_cast<uv_handle_t*>(&sigusr1_), reinterpret_cast<uv_handle_t*>(&sighup_)}) {
    if (h->loop == &loop_ && !uv_is_closing(h)) uv_close(h, nullptr);
  }
  if (drain_.loop == &loop_) {
    uv_timer_start(&drain_, [](uv_timer_t* t) { uv_stop(t->loop); }, kDrainMs, 0);
    uv_unref(reinterpret_cast<uv_handle_t*>(&drain_));
  }
}

}  // namespace detail

}  // namespace ob::launch
