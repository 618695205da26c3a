// What an agent watches of its workers (agent.h, "Deadlines"): their record
// streams passed on to the master, their exits reaped and reported, and the
// deadlines before their first step.
#include "ob/launch/agent/agent_impl.h"

#include <signal.h>
#include <sys/wait.h>

#include <cerrno>

#include "ob/clock.h"
#include "ob/io/file.h"
#include "ob/io/records.h"
#include "ob/io/text.h"
#include "ob/log.h"

namespace ob::launch {
namespace detail {

// Delimited Metrics records from a worker's stdout, as io/records.h frames
// them, decoded incrementally.
void Agent::OnWorkerOutput(Worker* w, const char* data, size_t n) {
  if (w->junk) return;  // keep draining so the worker never blocks
  w->buf.append(data, n);
  size_t pos = 0;
  for (;;) {
    uint64_t size = 0;
    int shift = 0;
    size_t i = pos;
    bool have_size = false;
    while (i < w->buf.size() && shift < 64) {
      auto byte = static_cast<unsigned char>(w->buf[i++]);
      size |= uint64_t{byte & 0x7fu} << shift;
      shift += 7;
      if ((byte & 0x80u) == 0) {
        have_size = true;
        break;
      }
    }
    if (!have_size) break;
    if (size > io::kMaxRecordBytes) {
      w->junk = true;
    } else if (w->buf.size() - i >= size) {
      pb::Control m;
      pb::Metrics* metrics = m.mutable_worker_metrics()->mutable_metrics();
      if (!metrics->ParseFromArray(w->buf.data() + i, static_cast<int>(size))) {
        w->junk = true;
      } else {
        // Who sent it is the agent's to say, not the record's: its host,
        // the rank and the generation it started the worker for.
        metrics->set_host(opt_.host);
        metrics->set_rank(w->rank);
        metrics->set_generation(w->generation);
        const int64_t at = static_cast<int64_t>(uv_now(&loop_));
        if (!w->stepped && w->heard_ms >= 0) start_gap_ms_ = std::max(start_gap_ms_, at - w->heard_ms);
        w->heard_ms = at;
        w->deadline_ms = at + StartSilentMs();
        w->suspect = false;
        w->phase = metrics->phase();
        if (!metrics->heartbeat()) {
          w->stepped = true;
          // Sent again to a master that takes over (LostMaster): the lost
          // one may have read none of them (stopped, its host gone).
          std::deque<pb::Control>& recent = recent_records_[w->rank];
          recent.push_back(m);
          if (recent.size() > kResentRecords) recent.pop_front();
        }
        Send(m);
        pos = i + size;
        continue;
      }
    }
    break;
  }
  if (w->junk) {
    OB_LOG(Warn) << "worker rank " << w->rank
                 << ": its stdout is not a stream of Metrics records; ignoring the rest";
    w->buf.clear();
    return;
  }
  w->buf.erase(0, pos);
}

void Agent::ReapWorkers() {
  const size_t dying = dying_.size();
  for (auto it = dying_.begin(); it != dying_.end();) {
    (*it)->proc.WaitFor(0);
    if ((*it)->proc.running()) {
      ++it;
      continue;
    }
    OB_LOG(Info) << "generation " << (*it)->generation << "'s worker rank " << (*it)->rank << " killed, "
                 << static_cast<int64_t>(uv_now(&loop_)) - (*it)->killed_ms << " ms after SIGKILL";
    it = dying_.erase(it);
  }
  if (dying_.size() != dying) StartPending();
  for (auto& [slot, s] : standby_) {  // none should die; one that did is replaced when its slot needs it
    if (!s.proc.running()) continue;
    s.proc.WaitFor(0);
    if (!s.proc.running()) {
      OB_LOG(Warn) << "standby worker for slot " << slot << " exited: " << s.proc.DescribeExit();
    }
  }
  for (auto& w : workers_) {
    if (w->exited) continue;
    int status = w->proc.WaitFor(0);
    if (w->proc.running()) continue;
    w->exited = true;
    relay_->Close(w->store_client);  // replies still on their way are dropped
    std::string desc = w->proc.DescribeExit();
    if (!w->stuck.empty()) desc = w->stuck + " (" + desc + ")";
    OB_LOG(Info) << "worker rank " << w->rank << " exited: " << desc;
    pb::Control m;
    auto* x = m.mutable_worker_exited();
    x->set_rank(w->rank);
    x->set_generation(w->generation);
    bool signaled = desc.rfind("killed by signal", 0) == 0;
    x->set_exit_status(signaled ? -1 : status);
    x->set_signal(signaled ? status - 128 : 0);
    x->set_unix_ms(UnixMs());
    x->set_description(desc);
    Send(m);
  }
  ReapStrangers();  // last: a zombie the loops above reap would hide the rest
}

void Agent::ReapStrangers() {
  if (!subreaper_) return;  // then every child is one it spawned
  for (int i = 0; i < 64; ++i) {
    siginfo_t si{};
    if (::waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid <= 0) return;
    const pid_t pid = si.si_pid;
    auto is = [pid](const cluster::ChildProcess& p) { return p.running() && p.pid() == pid; };
    bool ours = seed_ != nullptr && is(seed_->proc());
    for (const auto& [slot, s] : standby_) ours = ours || is(s.proc);
    for (const auto& w : workers_) ours = ours || is(w->proc);
    for (const auto& w : dying_) ours = ours || is(w->proc);
    if (ours) return;  // its owner reaps it (the seed's at its end of file)
    auto comm = io::ReadFile("/proc/" + std::to_string(pid) + "/comm");  // a zombie keeps its name
    ::waitpid(pid, nullptr, WNOHANG);
    OB_LOG(Info) << "reaped pid " << pid << " (" << (comm.ok() ? io::Trim(*comm) : "?")
                 << "), a process this agent adopted as subreaper ("
                 << (si.si_code == CLD_EXITED ? "exit status " + std::to_string(si.si_status)
                                              : "killed by signal " + std::to_string(si.si_status))
                 << ")";
  }
}

void Agent::CheckDeadlines() {
  const int64_t now = static_cast<int64_t>(uv_now(&loop_));
  for (auto& w : workers_) {
    // Past its last step (the last save, its exit) it is judged by nobody:
    // a run's end is not a start.
    if (w->exited || w->stepped || w->phase == pb::PHASE_FINISHING || !w->stuck.empty() || now <= w->deadline_ms) {
      w->suspect = false;
      continue;
    }
    // Confirmed at the next check, after an I/O poll: if this loop was the
    // one descheduled, the worker's heartbeats wait in its pipe.
    if (!w->suspect) {
      w->suspect = true;
      continue;
    }
    static const char* kPhases[] = {"", " starting", " joining its groups", " training"};
    const int phase = w->phase >= 0 && w->phase <= 3 ? w->phase : 0;
    w->stuck = (w->phase == 0 ? std::string("showed no sign of life since it got its role")
                              : std::string("went silent") + kPhases[phase] + " before its first step") +
               " (stopped, or stuck; no heartbeat for " + std::to_string(now - w->deadline_ms) +
               " ms past its deadline: " + std::to_string(StartSilentMs()) + " ms between heartbeats, " +
               std::to_string(RoleAckMs()) + " ms to the first after its role); killed";
    OB_LOG(Error) << "worker rank " << w->rank << " " << w->stuck;
    w->proc.Kill();
  }
}

// On the way out only (the loop is ending): every worker, current or
// retired, is signalled first, then reaped.
void Agent::KillWorkers() {
  for (auto& w : workers_) {  // all signalled first, then reaped: no serial waits
    if (!w->exited) w->proc.Kill();
  }
  for (auto& w : dying_) w->proc.Kill();
  for (auto& w : workers_) {
    if (w->exited) continue;
    w->proc.Wait();
    w->exited = true;
    relay_->Close(w->store_client);
    OB_LOG(Info) << "worker rank " << w->rank << " killed";
  }
  dying_.clear();  // each reaped as it is destroyed
  pending_.clear();
}

}  // namespace detail

}  // namespace ob::launch
