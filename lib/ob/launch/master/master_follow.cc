// The standby master (design/master.md): it follows the master's state over
// the control channel and, once the master is lost and a majority of the
// hosts it heard have come here, takes over as the next term: the master's
// host and every host that did not come are lost, and the next generation
// is decided by the same DecideRecovery, from the replicas.
#include "ob/launch/master/master_impl.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "ob/clock.h"
#include "ob/io/text.h"
#include "ob/launch/wire/store_keys.h"
#include "ob/log.h"

namespace ob::launch {

using io::Fixed;

namespace detail {

namespace {

constexpr uint32_t kSyncFrameBytes = 256u << 20;  // a full state: the plan and the store
// How long the hosts have to come after the master is lost: as long as an
// agent asks to rejoin (agent.h kRejoinMs).
constexpr int64_t kComeMs = 30000;
constexpr int kLeaderProbeMs = 1000;  // while waiting for them, the master is asked this often if it is there

}  // namespace

void Master::Follow() {
  std::string host;
  int port = 0;
  if (Status st = SplitHostPort(opt_.standby_of, "--standby-master-of", &host, &port); !st.ok()) {
    return LeaderLost(st.message());
  }
  pb::Hello hello;
  hello.set_host(opt_.standby_host);
  hello.set_pid(static_cast<uint32_t>(::getpid()));
  hello.set_role(1);
  hello.set_address(AdvertisedHost(bind_addr_) + ":" + std::to_string(server_.port()));
  hello.set_build(opt_.build);
  Connect(&loop_, host, port, 10000, secret_, hello, [this](Result<std::shared_ptr<Connection>> r) {
    if (state_ != State::kFollowing) return;
    if (!r.ok()) return LeaderLost(r.status().message());
    leader_ = std::move(r).value();
    leader_->SetMaxFrameBytes(kSyncFrameBytes);
    leader_->SetHandlers([this](Connection&, pb::Control& m) { OnLeaderMessage(m); },
                         [this](Connection&, const std::string& why) { LeaderLost("connection " + why); });
  });
}

void Master::OnLeaderMessage(pb::Control& m) {
  if (state_ != State::kFollowing) return;
  if (m.has_master_sync()) return ApplySync(m.master_sync());
  if (m.has_stop()) {  // the run ended under the master: so do we
    OB_LOG(Info) << "the master ended the run (" << m.stop().reason() << "); the standby stops";
    events_.Write("standby-stop", m.stop().reason());
    state_ = State::kDone;
    agents_.Close();
    uv_stop(&loop_);
  }
}

void Master::ApplySync(const pb::MasterSync& s) {
  if (s.full()) {
    if (Status st = metrics_.WriteRaw(s.metrics_so_far()); !st.ok()) {
      OB_LOG(Warn) << "standby: " << st.message();
    }
    std::vector<std::string> keys;
    for (const auto& [k, v] : store_.data()) keys.push_back(k);
    for (const std::string& k : keys) store_.Erase(k);
  }
  for (const pb::StoreEntry& e : s.store()) {
    if (e.erased()) {
      store_.Erase(e.key());
    } else if (Status st = store_.Set(e.key(), e.value()); !st.ok()) {
      OB_LOG(Warn) << "standby: " << st.message();
    }
  }
  for (const std::string& line : s.events()) events_.WriteLine(line);
  for (const pb::Metrics& mx : s.metrics()) {
    metrics_.Publish(mx);
    if (!mx.heartbeat() && (mx.generation() == 0 || mx.generation() == generation_)) metrics_.Step(mx);
  }
  if (s.term() == 0) return;  // no state change
  term_ = s.term();
  if (s.generation() != generation_) metrics_.NewGeneration();
  generation_ = s.generation();
  if (s.has_plan()) {
    Result<plan::LoadedPlan> l = plan::FromProto(s.plan());
    if (l.ok()) {
      plan_ = s.plan();
      loaded_ = std::move(l).value();
    } else {
      OB_LOG(Warn) << "standby: the master's plan of generation " << generation_ << ": " << l.status().message();
    }
  }
  if (Result<plan::LoadedPlan> h = plan::FromProto(s.holding()); h.ok()) holding_ = h->instantiation;
  lost_since_holding_.clear();
  for (uint32_t n : s.lost_since_holding()) lost_since_holding_.insert(static_cast<int>(n));
  idle_.assign(s.idle().begin(), s.idle().end());
  lost_hosts_ = {s.lost_hosts().begin(), s.lost_hosts().end()};
  for (const std::string& x : s.excluded()) {
    const size_t tab = x.find('\t');
    if (AgentState* a = agents_.Find(x.substr(0, tab)); a != nullptr && tab != std::string::npos) {
      a->excluded = x.substr(tab + 1);
    }
  }
  lineage_.Adopt(s.lineage_start(), s.lineage_has_steps());
  fruitless_ = s.fruitless();
  if (!s.run_id().empty() && s.run_id() != run_id_) {
    run_id_ = s.run_id();
    metrics_.set_run(run_id_);
  }
  followed_host_ = s.master_host();
  followed_members_.assign(s.connected().begin(), s.connected().end());
}

void Master::LeaderLost(const std::string& why) {
  if (state_ != State::kFollowing || leader_lost_) return;
  leader_lost_ = true;
  leader_lost_ms_ = Now();
  leader_lost_why_ = why;
  leader_heard_ms_ = leader_ ? leader_->last_receive_ms() : leader_lost_ms_;
  if (leader_) {
    leader_->SetHandlers(nullptr, nullptr);
    leader_->Close("lost");
    leader_.reset();
  }
  const size_t base = followed_members_.size();
  const std::string msg = "lost the master" + (followed_host_.empty() ? "" : " on " + followed_host_) + " (" + why +
                          "); taking over once " + std::to_string(Quorum(base)) + " of the " +
                          std::to_string(base) + " hosts it heard have come here";
  events_.Write("leader-lost", msg);
  OB_LOG(Warn) << msg;
}

void Master::FollowTick() {
  const int64_t now = Now();
  grace_.Tick(now);
  store_.Sweep(now);
  if (leader_ && grace_.MayJudge(now)) {
    const int64_t silent = now - leader_->last_receive_ms();
    const bool over = silent > static_cast<int64_t>(opt_.master_timeout_s * 1e3);
    if (over && leader_suspect_) LeaderLost("silent for " + Fixed(silent / 1e3, 1) + " s");
    leader_suspect_ = over;
  }
  if (!leader_lost_) return;
  size_t votes = 0;
  std::string coming;
  for (const std::string& h : followed_members_) {
    const AgentState* a = agents_.Find(h);
    votes += a != nullptr && a->connected() ? 1 : 0;
    if (a != nullptr && !a->connected() && Coming(*a, now)) coming += (coming.empty() ? "" : ", ") + h;
  }
  const bool quorum = !followed_members_.empty() && votes >= Quorum(followed_members_.size());
  if (quorum) {
    if (coming.empty()) return TakeOver();
    if (coming != takeover_waits_for_) {  // said once for each set of hosts waited for
      takeover_waits_for_ = coming;
      events_.Write("takeover-wait", "votes=" + std::to_string(votes) + "/" +
                                         std::to_string(followed_members_.size()) + " coming=" + coming);
      OB_LOG(Info) << "a majority has come; waiting for " << coming << ", alive and not here yet";
    }
  }
  // Is the master still there (we were stopped, or cut off alone)? If it
  // answers at all, it runs on: nothing to take over.
  if (!probing_ && now >= next_probe_ms_) {
    probing_ = true;
    next_probe_ms_ = now + kLeaderProbeMs;
    std::string host;
    int port = 0;
    if (SplitHostPort(opt_.standby_of, "--standby-master-of", &host, &port).ok()) {
      pb::Hello hello;
      hello.set_host(opt_.standby_host);
      hello.set_role(1);
      hello.set_pid(static_cast<uint32_t>(::getpid()));
      Connect(&loop_, host, port, kLeaderProbeMs, secret_, hello, [this](Result<std::shared_ptr<Connection>> r) {
        probing_ = false;
        if (state_ != State::kFollowing) return;
        if (!r.ok() && r.status().code() != Code::kConfig) {  // not reached: gone, lost, or cut off
          if (!NobodyListens(r.status())) leader_refused_ms_ = -1;
          else if (leader_refused_ms_ < 0) leader_refused_ms_ = Now();
          return;
        }
        if (r.ok()) (*r)->Close("this standby stops");
        StandbyStops("no takeover: the master" + (followed_host_.empty() ? "" : " on " + followed_host_) +
                         " answers again (this standby was stopped or cut off alone); this standby stops",
                     false);
      });
    }
  }
  if (quorum) return;  // the rest are coming, each within its bound (Coming)
  // The master's process is gone (its address refuses): its hosts lost it
  // as we did and come within their failover window, or they never will
  // (the run ended while we were cut off, or they are gone too).
  if (leader_refused_ms_ >= 0 && now - leader_refused_ms_ > FailoverWindowMs(opt_.master_timeout_s) + kLeaderProbeMs) {
    return StandbyStops("no takeover: the master" + (followed_host_.empty() ? "" : " on " + followed_host_) +
                            " is gone (its address refuses connections) and " + std::to_string(votes) + " of the " +
                            std::to_string(followed_members_.size()) +
                            " hosts came within their failover window (the run has ended, or they are gone)",
                        true);
  }
  // The master lives on without us (we were cut off, or stopped), or the
  // hosts are gone: nothing to take over.
  if (now - leader_lost_ms_ > kComeMs + static_cast<int64_t>(opt_.master_timeout_s * 1e3)) {
    StandbyStops("no takeover: " + std::to_string(votes) + " of the " + std::to_string(followed_members_.size()) +
                     " hosts came in " + std::to_string((now - leader_lost_ms_) / 1000) +
                     " s after the master was lost (it runs on without this standby, or they are gone)",
                 true);
  }
}

// Whether a member that has not come yet may still come, so that a takeover
// waits for it rather than call it lost (slow is not dead; each host a
// takeover loses costs the run a pipeline, and when it held the only other
// replica of some layers, the run). One that asked us while we still heard
// the master is alive and failing over: it asks for its failover window,
// from its first ask. One that has not asked had the master's silence to
// notice (--master-timeout from when we last heard the master) and then as
// long as the master gives any agent to speak (--agent-timeout), unless it
// is the master's own host, which the master's loss most likely took with
// it. Our own stall postpones every judgement, as the master's does.
bool Master::Coming(const AgentState& a, int64_t now) const {
  if (!a.excluded.empty()) return false;
  if (!grace_.MayJudge(now)) return true;
  if (a.asked_first_ms >= 0 && a.asked_last_ms >= leader_heard_ms_ - FailoverWindowMs(opt_.master_timeout_s)) {
    return now - a.asked_first_ms <= FailoverWindowMs(opt_.master_timeout_s) + kFailoverConnectMs;
  }
  if (a.host.name == followed_host_) return false;
  return now - leader_heard_ms_ <= static_cast<int64_t>((opt_.master_timeout_s + opt_.agent_timeout_s) * 1e3);
}

void Master::StandbyStops(const std::string& msg, bool failed) {
  events_.Write("standby-stop", msg);
  OB_LOG(Warn) << msg;
  if (failed) outcome_ = Status::TempFail(msg);
  state_ = State::kDone;
  agents_.Close();
  uv_stop(&loop_);
}

void Master::TakeOver() {
  const std::string old_host = followed_host_;
  ++term_;
  state_ = State::kRunning;
  takeover_ms_ = Now();
  size_t votes = 0;
  for (const auto& a : agents_.all()) votes += a->connected() ? 1 : 0;
  const std::string msg = "standby master on " + opt_.standby_host + " takes over as term " + std::to_string(term_) +
                          ": the master" + (old_host.empty() ? "" : " on " + old_host) + " was lost (" +
                          leader_lost_why_ + "), " + std::to_string(votes) + " of the " +
                          std::to_string(followed_members_.size()) + " hosts here";
  events_.Write("takeover", "term=" + std::to_string(term_) + " lost_master=" + old_host +
                                " votes=" + std::to_string(votes) + "/" + std::to_string(followed_members_.size()) +
                                " waited_ms=" + std::to_string(Now() - leader_lost_ms_));
  OB_LOG(Warn) << msg;
  // The checkpoints and --metrics are ours now.
  Status st = ckpt_.Open({opt_.ckpt_dir, opt_.ckpt_keep, "", opt_.resume_from_other, opt_.steps, opt_.seed,
                          opt_.data, opt_.data_sum, opt_.eval_split, "ob-launch, run directory " + run_dir_,
                          opt_.optimizer, /*predecessor_may_hold=*/true},
                         &plan_, loaded_.problem.num_layers(), &events_);
  // The workers check the directory's lock file against the store's line
  // (inputs.h): ours, when we took the lock.
  if (st.ok() && !ckpt_.lock_line().empty()) st = store_.Set(CheckpointDirKey(), ckpt_.lock_line());
  if (st.ok()) st = metrics_.TakeOver(opt_.metrics, run_dir_ + "/metrics.pb");
  if (!st.ok()) {
    const std::string why = "the standby cannot take over: " + st.message();
    events_.Write("detect", why);
    OB_LOG(Error) << why;
    return BeginStop(why, st);
  }
  ckpt_.set_unchecked([this] { return CopiesOfData(false); });
  master_host_ = opt_.standby_host;
  // Every member that did not come is lost, the master's host first.
  for (const auto& a : agents_.all()) {
    if (a->connected()) continue;
    lost_since_holding_.insert(a->node);
    if (a->excluded.empty()) lost_hosts_.insert(a->host.name);
    if (a->host.name == old_host || std::find(followed_members_.begin(), followed_members_.end(), a->host.name) !=
                                        followed_members_.end()) {
      failed_hosts_.insert(a->host.name);
    }
  }
  Failure(msg, old_host, Now() - leader_heard_ms_);
  // A standby of our own, on another live host.
  standby_.host.clear();
  standby_.starts = 0;
  standby_wanted_ = opt_.standby_master != "off";
  if (standby_wanted_) StartStandby();
}

}  // namespace detail

}  // namespace ob::launch
