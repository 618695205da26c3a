// The master's side of its agents (design: launch): starting them, admitting
// each (or refusing it), and what their messages say: heartbeats, the
// workers' metrics, refusals and exits; an agent lost.
#include "ob/launch/master/master_impl.h"

#include <signal.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "ob/clock.h"
#include "ob/io/text.h"
#include "ob/launch/master/machine_checks.h"
#include "ob/launch/wire/store_keys.h"
#include "ob/launch/wire/store_relay.h"
#include "ob/log.h"

namespace ob::launch {

namespace {

using io::Fixed;
using io::NameSome;

}  // namespace

namespace detail {

Status Master::StartAgents() {
  AgentPool::Options o;
  o.rsh = opt_.rsh;
  o.self_exe = opt_.self_exe;
  o.agent_flags = opt_.agent_flags;
  o.master_timeout_s = opt_.master_timeout_s;
  o.agent_timeout_s = opt_.agent_timeout_s;
  OB_RETURN_IF_ERROR(agents_.Start(o, layout_.hosts, layout_.host_ranks,
                                   AdvertisedHost(bind_addr_) + ":" + std::to_string(server_.port()), secret_));
  OB_LOG(Info) << "started " << agents_.all().size() << " agent(s) with --rsh " << opt_.rsh
               << "; world size " << layout_.ranks.size();
  if (!layout_.spares.empty()) {
    OB_LOG(Info) << layout_.spares.size() << " host(s) not in the plan stay idle";
  }
  return Status::Ok();
}

std::string Master::Admit(const pb::Hello& hello) {
  if (hello.role() == 1) {  // a standby master (master_standby.cc)
    if (state_ == State::kFollowing) return "this is a standby master itself";
    if (standby_.host.empty() || hello.host() != standby_.host) {
      return "no standby master was started on host '" + hello.host() + "'";
    }
    return state_ == State::kStarting || state_ == State::kRunning ? "" : "the run is ending";
  }
  AgentState* a = agents_.Find(hello.host());
  if (a == nullptr) return "unknown host '" + hello.host() + "'";
  if (!a->excluded.empty()) return "host '" + hello.host() + "' was excluded: " + a->excluded;
  if (state_ == State::kFollowing) {  // an agent that lost the master comes to its standby
    // Alive, and failing over: a takeover waits for it (master_follow.cc).
    const int64_t now = Now();
    if (a->asked_last_ms < 0 || now - a->asked_last_ms > FailoverWindowMs(opt_.master_timeout_s)) {
      a->asked_first_ms = now;
    }
    a->asked_last_ms = now;
    // Until we have lost the master too, it runs: the agent asks it next
    // (agent.h). (Taken earlier, an agent the master only evicted would
    // wait here, lost to the run.)
    if (!leader_lost_) return "the master of term " + std::to_string(term_) + " is alive: ask it";
    if (hello.term() > term_) return "this standby is of term " + std::to_string(term_) + ", older than the agent's";
    return a->state == AgentState::State::kConnected ? "host '" + hello.host() + "' already connected" : "";
  }
  if (hello.term() > term_) {  // it follows a newer master: we were replaced
    return "this master is of term " + std::to_string(term_) + " and the agent of term " +
           std::to_string(hello.term());
  }
  if (state_ == State::kRunning && a->state == AgentState::State::kLost) {  // rejoin
    // on the job's kind of device (a host back from a GPU fault without its
    // GPUs is not), and with this build (a node reinstalled is not)
    std::vector<MachineOf> machines;
    for (const auto& other : agents_.all()) {
      if (other.get() != a) machines.push_back({other->host.name, "", {}, 0, other->device, "", {}, {}});
    }
    machines.push_back({hello.host(), "", {}, a->host.slots, hello.device(), hello.build(),
                        {hello.gpu_memory_bytes().begin(), hello.gpu_memory_bytes().end()},
                        {hello.gpu_names().begin(), hello.gpu_names().end()}});
    Status one = CheckOneDevice(machines);
    if (one.ok()) one = CheckOneBuild(machines, opt_.build);
    if (one.ok()) one = CheckGpuMemory({machines.back()}, LargestStageBytes(plan_), plan_.gpu_memory_bytes());
    if (one.ok()) return "";
    const std::string why = "host '" + hello.host() + "' may not rejoin: " + one.message();
    events_.Write("refused-rejoin", why);
    return why;
  }
  if (a->state != AgentState::State::kStarting) return "host '" + hello.host() + "' already connected";
  if (state_ != State::kStarting) return "the run is not accepting agents now";
  return "";
}

void Master::OnAgentReady(std::shared_ptr<Connection> conn, const pb::Hello& hello) {
  if (hello.role() == 1) return OnStandbyReady(std::move(conn), hello);
  AgentState* a = agents_.Find(hello.host());
  const bool follow = a != nullptr && state_ == State::kFollowing && a->state == AgentState::State::kLost;
  const bool rejoin = a != nullptr && (state_ == State::kRunning && a->state == AgentState::State::kLost);
  if (a == nullptr || (state_ != State::kStarting && !rejoin && !follow)) {
    conn->Close("not accepting agents");
    return;
  }
  a->conn = std::move(conn);
  a->state = AgentState::State::kConnected;
  a->boot_id = hello.boot_id();
  a->gpus.assign(hello.gpus().begin(), hello.gpus().end());
  a->gpu_memory.assign(hello.gpu_memory_bytes().begin(), hello.gpu_memory_bytes().end());
  a->gpu_names.assign(hello.gpu_names().begin(), hello.gpu_names().end());
  a->device = hello.device();
  a->build = hello.build();
  a->conn->SetHandlers([this, a](Connection&, pb::Control& m) { OnAgentMessage(*a, m); },
                       [this, a](Connection&, const std::string& r) { OnAgentClosed(*a, r); });
  const int64_t ms = Now() - start_ms_;
  OB_LOG(Info) << "agent on host " << a->host.name << " (pid " << hello.pid() << ", "
               << a->conn->peer() << ") authenticated after " << ms << " ms";
  events_.Write(follow ? "agent-came" : rejoin ? "agent-rejoined" : "agent-connected",
                "host=" + a->host.name + " peer=" + a->conn->peer() + " after_ms=" + std::to_string(ms));
  if (follow) return;  // a vote for the takeover (master_follow.cc)
  TellStandby(a);
  if (rejoin) {  // added at the next generation, decided with anything else pending
    lost_hosts_.erase(a->host.name);
    if (decide_deadline_ms_ < 0) decide_deadline_ms_ = Now() + kDecideMs;
    return;
  }
  if (agents_.AllConnected()) StartWorkers();
}

void Master::OnAgentMessage(AgentState& a, pb::Control& m) {
  if (state_ == State::kStopping || state_ == State::kDone) return;
  if (m.has_store_request()) return ServeStoreRequest(&store_, a.conn, m.store_request(), Now());
  if (m.has_heartbeat()) {
    a.unreachable.assign(m.heartbeat().unreachable().begin(), m.heartbeat().unreachable().end());
    if (m.heartbeat().unix_ms() > 0) a.clock_offset_ms = UnixMs() - m.heartbeat().unix_ms();
    return;
  }
  if (m.has_worker_metrics()) return OnWorkerMetrics(m.worker_metrics().metrics());
  if (m.has_refusal()) return OnRefusal(a, m.refusal());
  if (m.has_worker_exited()) return OnWorkerExited(a, m.worker_exited());
}

// A training rank's record: published, counted for its generation's
// progress (hang watch, the first step after a recovery, evaluations).
void Master::OnWorkerMetrics(const pb::Metrics& mx) {
  // A record an agent sends again after a takeover (agent.h), that the
  // lost master had passed on: published once.
  if ((state_ == State::kFollowing || mx.generation() < generation_) && !mx.heartbeat() && metrics_.Seen(mx)) return;
  metrics_.Publish(mx);
  if (state_ == State::kFollowing) {  // sent again by an agent that came here: published, no more
    if (!mx.heartbeat() && mx.generation() == generation_) metrics_.Step(mx);
    return;
  }
  if (standby_.conn && standby_synced_) *delta_.add_metrics() = mx;
  const bool current = mx.generation() == 0 || mx.generation() == generation_;
  if (current && mx.has_checkpoint()) ckpt_.Part(mx, ranks_.size());
  if (current && mx.rank() < ranks_.size()) {
    ranks_[mx.rank()].phase = std::max<int>(mx.phase(), 1);
    hang_.Record(mx.rank(), mx.phase(), mx.progress(), mx.waiting(),
                 mx.heartbeat() ? -1 : static_cast<int64_t>(mx.step()), Now(), mx.step_seconds());
  }
  if (current && mx.rank() < ranks_.size() && !mx.heartbeat()) {
    if (!ranks_[mx.rank()].have_metrics && ++ranks_reported_ == static_cast<int>(ranks_.size())) {
      lineage_.Stepped();  // every rank holds a snapshot of this lineage past its start
      holding_ = loaded_.instantiation;
      lost_since_holding_.clear();
    }
    ranks_[mx.rank()].last_step = mx.step();
    ranks_[mx.rank()].have_metrics = true;
    metrics_.Step(mx);
    if (mx.rank() == 0 && mx.has_eval_loss()) {
      events_.Write("eval", "generation=" + std::to_string(generation_) + " step=" + std::to_string(mx.step()) +
                                " loss=" + Fixed(mx.eval_loss(), 6));
    }
    fruitless_ = 0;
    if (mx.process_start_unix_ms() > 0) {
      const std::string line = rec_.FirstStep(mx, generation_, static_cast<int>(ranks_.size()));
      if (!line.empty()) {
        events_.Write("recovered", line);
        OB_LOG(Info) << "recovered: " << line;
      }
    }
  }
}

// A host refused the generation (its worker could not run it): the run stops
// with the code the host gave.
void Master::OnRefusal(AgentState& a, const pb::Refusal& r) {
  if (r.generation() != generation_) return;
  const std::string msg = "host " + a.host.name + " refused generation " + std::to_string(r.generation()) +
                          ": " + log::Printable(r.reason(), 512);
  events_.Write("refused", msg);
  OB_LOG(Error) << msg;
  const int code = r.exit_code() > 0 ? r.exit_code() : static_cast<int>(Code::kConfig);
  return BeginStop(msg, Status(static_cast<Code>(code), msg));
}

// A worker exited: finished, failed for good (said so first, or a bad flag,
// its input missing), or failed: a recovery.
void Master::OnWorkerExited(AgentState& a, const pb::WorkerExited& x) {
  if (x.generation() != 0 && x.generation() != generation_) return;  // replaced on purpose
  if (x.rank() >= ranks_.size() || ranks_[x.rank()].exited) return;
  ranks_[x.rank()].exited = true;
  hang_.Exited(x.rank());
  // By our clock: a host minutes off made the detection minutes late, or 0.
  const int64_t latency = std::max<int64_t>(0, UnixMs() - (x.unix_ms() + a.clock_offset_ms));
  metrics_.Exited(a.host.name, x, x.generation() != 0 ? x.generation() : generation_,
                  ranks_[x.rank()].last_step);
  events_.Write("worker-exit", "rank=" + std::to_string(x.rank()) + " host=" + a.host.name +
                                   " " + x.description() + " latency_ms=" + std::to_string(latency));
  if (x.exit_status() == 0 && x.signal() == 0) {
    OB_LOG(Info) << "worker rank " << x.rank() << " on host " << a.host.name << " finished";
    if (++ranks_done_ == static_cast<int>(ranks_.size())) {
      BeginStop("training finished: every worker exited 0", Status::Ok());
    }
    return;
  }
  // A worker that knew its failure permanent said so before it exited
  // (its data not the job's, or malformed: store_keys.h FatalKey), with
  // the code it exits with.
  if (x.signal() == 0) {
    const uint64_t g = x.generation() != 0 ? x.generation() : generation_;
    if (std::optional<std::string> v = store_.Get(FatalKey(g, static_cast<int>(x.rank())))) {
      if (auto f = ParseFatal(*v); f && f->first == x.exit_status()) {
        const std::string msg = "worker rank " + std::to_string(x.rank()) + " on host " + a.host.name +
                                " " + x.description() + ": " + log::Printable(f->second, 1024) +
                                "; not restarting what fails the same way again";
        events_.Write("detect", msg);
        OB_LOG(Error) << msg;
        return BeginStop(msg, Status(static_cast<Code>(f->first), msg));
      }
    }
  }
  // A worker that met a permanent mistake (a bad flag, its input missing
  // on its host: EX_USAGE, EX_NOINPUT) meets it again on every restart.
  if (x.signal() == 0 && (x.exit_status() == static_cast<int>(Code::kUsage) ||
                          x.exit_status() == static_cast<int>(Code::kNoInput))) {
    const std::string msg = "worker rank " + std::to_string(x.rank()) + " on host " + a.host.name + " " +
                            x.description() + (x.exit_status() == static_cast<int>(Code::kNoInput)
                                                   ? " (its input is missing there)"
                                                   : " (a bad flag)") +
                            "; not restarting what fails the same way again";
    events_.Write("detect", msg);
    OB_LOG(Error) << msg;
    return BeginStop(msg, Status(static_cast<Code>(x.exit_status()), msg));
  }
  Failure("worker rank " + std::to_string(x.rank()) + " on host " + a.host.name + " failed (" +
              x.description() + "), detected in " + std::to_string(latency) + " ms",
          "", latency);
}

void Master::OnAgentClosed(AgentState& a, const std::string& reason) {
  const int64_t silent = Now() - (a.conn ? a.conn->last_receive_ms() : Now());
  if (a.state != AgentState::State::kConnected) return;
  HostLost(a, "lost the agent on host " + a.host.name + " (connection " + reason + "), detected " +
                  std::to_string(silent) + " ms after its last message",
           silent, Lost::kCutOff);
}

void Master::ReapAgents() {
  agents_.Reap([this](AgentState& a, const std::string& desc) {
    if (state_ == State::kStopping || state_ == State::kDone) return;
    if (a.state == AgentState::State::kStarting) {
      // 127: the shell on the host found no such program.
      const std::string what =
          desc == "exit status 127" ? desc + ": no " + opt_.self_exe + " there; see --agent-exe" : desc;
      failed_starts_.push_back({a.host.name, what});
      const std::string msg = ExitedBeforeConnecting(failed_starts_.back());
      events_.Write("detect", msg);
      // A line each for the first few; the rest are in events.log and the
      // closing line (a thousand hosts whose ssh fails alike).
      if (failed_starts_.size() <= kHostsNamed) {
        OB_LOG(Error) << msg;
      } else if (failed_starts_.size() == kHostsNamed + 1) {
        OB_LOG(Error) << "more agents exited before they connected: events.log names each";
      }
      CheckFailedStarts();
    } else if (a.connected()) {
      const int64_t silent = a.conn ? Now() - a.conn->last_receive_ms() : 0;
      HostLost(a, "lost the agent on host " + a.host.name + " (its process " + desc + "), detected " +
                      std::to_string(silent) + " ms after its last message",
               silent, Lost::kGone);
    }
  });
}

std::string Master::ExitedBeforeConnecting(const FailedStart& f) {
  return "the agent on host " + f.host + " exited before it connected (" + f.what + ")";
}

// The hosts by what their agents' exits said, in the order first seen; a
// few names each (a thousand hosts whose ssh fails alike make one line).
std::string Master::FailedStartsText() const {
  std::vector<std::pair<std::string, std::vector<std::string>>> by_what;
  for (const FailedStart& f : failed_starts_) {
    auto it = std::find_if(by_what.begin(), by_what.end(), [&](const auto& g) { return g.first == f.what; });
    if (it == by_what.end()) it = by_what.insert(by_what.end(), {f.what, {}});
    it->second.push_back(f.host);
  }
  std::string s;
  for (const auto& [what, hosts] : by_what) {
    s += (s.empty() ? "" : "; ") + NameSome(hosts, kHostsNamed) + " (" + what + ")";
  }
  return s;
}

void Master::CheckFailedStarts() {
  if (failed_starts_.empty() || state_ != State::kStarting || agents_.AnyPending()) return;
  const std::string msg =
      failed_starts_.size() == 1
          ? ExitedBeforeConnecting(failed_starts_[0])
          : "the agents on " + std::to_string(failed_starts_.size()) + " hosts exited before they connected: " +
                FailedStartsText();
  BeginStop(msg, Status::Unavailable(msg));
}

// A host is gone: its connection is closed and, unless cut off, its rsh
// process killed (an ssh session that ends takes a remote agent, and so its
// workers, with it). A silent or disconnected agent keeps its rsh: cut off
// for a moment, it stops its workers and asks to rejoin (agent.h); cut off
// for longer, it stops on its own after --master-timeout. Either way it may
// come back (Admit) and is added at the next generation, unless excluded.
void Master::HostLost(AgentState& a, const std::string& what, int64_t latency_ms, Lost how) {
  if (a.state != AgentState::State::kConnected) return;
  agents_.Cut(a, /*keep_rsh=*/how == Lost::kCutOff);
  if (how == Lost::kExcluded) a.excluded = what;
  lost_hosts_.insert(a.host.name);
  lost_since_holding_.insert(a.node);
  Failure(what, a.host.name, latency_ms);
}

}  // namespace detail

}  // namespace ob::launch
