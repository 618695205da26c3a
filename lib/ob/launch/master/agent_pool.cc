#include "ob/launch/master/agent_pool.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "ob/clock.h"
#include "ob/io/text.h"
#include "ob/log.h"

namespace ob::launch {

Status AgentPool::Start(const Options& o, const std::vector<cluster::Host>& hosts,
                        const std::vector<std::vector<int>>& host_ranks, const std::string& master,
                        const std::string& secret) {
  o_ = o;
  gentle_ = o.rsh == "slurm";
  std::string self = o.self_exe;
  if (self.empty()) {
    char buf[4096];
    ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return Status::Internal("cannot find this program's path in /proc/self/exe");
    self.assign(buf, static_cast<size_t>(n));
  }
  char timeout[32];
  snprintf(timeout, sizeof timeout, "%.3f", o.master_timeout_s);
  for (size_t i = 0; i < hosts.size(); ++i) {
    auto a = std::make_unique<AgentState>();
    a->host = hosts[i];
    a->ranks = host_ranks[i];
    a->node = static_cast<int>(i);
    std::vector<std::string> cmd = {self, "--agent", "--master", master, "--host", a->host.name,
                                    "--master-timeout", timeout};
    cmd.insert(cmd.end(), o.agent_flags.begin(), o.agent_flags.end());
    if (o.rsh == "local") {  // every agent on this machine: its cores are shared by all the workers
      size_t world = 0;
      for (const auto& r : host_ranks) world += r.size();
      cmd.insert(cmd.end(), {"--cpu-share", std::to_string(world)});
    }
    Result<cluster::ChildProcess> child = cluster::SpawnWithPipes(cluster::RshArgv(o.rsh, a->host, cmd));
    if (!child.ok()) return child.status().WithContext("host " + a->host.name);
    a->rsh = std::move(child).value();
    const std::string line = secret + "\n";
    events_->Write("agent-start", "host=" + a->host.name + " pid=" + std::to_string(a->rsh.pid()));
    // (An rsh that exited at once: its exit, which names the host, is the
    // message; a warning each said the same again, at 1,024 hosts a screen.)
    if (::write(a->rsh.stdin_fd(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      const std::string why = std::strerror(errno);
      events_->Write("agent-secret", "host=" + a->host.name + " not handed: " + why);
      OB_LOG(Debug) << "host " << a->host.name << ": cannot hand the secret to its agent: " << why;
    }
    agents_.push_back(std::move(a));
  }
  return Status::Ok();
}

void AgentPool::Adopt(const Options& o, const std::vector<cluster::Host>& hosts,
                      const std::vector<std::vector<int>>& host_ranks) {
  o_ = o;
  gentle_ = o.rsh == "slurm";
  agents_.clear();
  for (size_t i = 0; i < hosts.size(); ++i) {
    auto a = std::make_unique<AgentState>();
    a->host = hosts[i];
    a->ranks = host_ranks[i];
    a->node = static_cast<int>(i);
    a->state = AgentState::State::kLost;
    a->rsh_done = true;  // not ours: nothing to reap
    agents_.push_back(std::move(a));
  }
}

AgentState* AgentPool::Find(const std::string& host) {
  for (auto& a : agents_) {
    if (a->host.name == host) return a.get();
  }
  return nullptr;
}

std::vector<int> AgentPool::Live() const {
  std::vector<int> live;
  for (const auto& a : agents_) {
    if (a->connected()) live.push_back(a->node);
  }
  return live;
}

bool AgentPool::AllConnected() const {
  for (const auto& a : agents_) {
    if (!a->connected()) return false;
  }
  return true;
}

std::string AgentPool::Starting(size_t named) const {
  std::vector<std::string> hosts;
  for (const auto& a : agents_) {
    if (a->state == AgentState::State::kStarting) hosts.push_back(a->host.name);
  }
  return io::NameSome(hosts, named);
}

bool AgentPool::AnyPending() const {
  for (const auto& a : agents_) {
    if (a->state == AgentState::State::kStarting && !a->rsh_done) return true;
  }
  return false;
}

void AgentPool::Send(const pb::Control& m) {
  for (auto& a : agents_) {
    if (a->conn && a->connected()) a->conn->Send(m);
  }
}

void AgentPool::Beat() {
  pb::Control hb;
  hb.mutable_heartbeat()->set_sequence(++beats_);
  hb.mutable_heartbeat()->set_unix_ms(UnixMs());
  Send(hb);
}

std::vector<pb::PeerHost> AgentPool::Peers() const {
  std::vector<pb::PeerHost> out;
  for (const auto& a : agents_) {
    if (!a->connected() || !a->conn || a->ranks.empty()) continue;
    std::string ip = a->conn->peer();  // "1.2.3.4:5" or "[::1]:5"
    ip = ip.substr(0, ip.rfind(':'));
    if (ip.size() >= 2 && ip.front() == '[') ip = ip.substr(1, ip.size() - 2);
    pb::PeerHost p;
    p.set_host(a->host.name);
    p.set_address(ip);
    out.push_back(std::move(p));
  }
  return out;
}

CutReports AgentPool::Cuts() const {
  CutReports out;
  for (const auto& a : agents_) {
    if (!a->connected()) continue;
    std::set<std::pair<int, int>> mine;
    size_t peers = 0;  // what it probes: the other hosts of the generation (Peers)
    for (const auto& b : agents_) {
      if (b->node == a->node || !b->connected()) continue;
      if (b->conn && !b->ranks.empty()) ++peers;
      for (const std::string& h : a->unreachable) {
        if (b->host.name == h) mine.insert({std::min(a->node, b->node), std::max(a->node, b->node)});
      }
    }
    auto& into = peers > 0 && mine.size() >= peers ? out.whole : out.partial;
    into.insert(mine.begin(), mine.end());
  }
  return out;
}

std::vector<AgentPool::Loss> AgentPool::Judge(int64_t now) {
  std::vector<Loss> lost;
  const int64_t limit = static_cast<int64_t>(o_.agent_timeout_s * 1e3);
  for (auto& a : agents_) {
    if (!a->connected() || !a->conn) continue;
    const int64_t silent = now - a->conn->last_receive_ms();
    const int64_t ack_age = a->conn->peer_ack_age_ms();
    if (silent <= limit) {
      a->suspect = false;
      a->acking = false;
    } else if (!a->suspect) {
      a->suspect = true;  // judged at the next tick, after an I/O poll
    } else if (ack_age >= 0 && ack_age < limit && silent < kAckingGrace * limit) {
      if (!a->acking) {
        a->acking = true;
        events_->Write("suspect", "host=" + a->host.name + " silent_ms=" + std::to_string(silent) +
                                      " last_ack_ms=" + std::to_string(ack_age));
      }
    } else {
      lost.push_back({a.get(),
                      "lost the agent on host " + a->host.name + " (missed heartbeats: silent for " +
                          std::to_string(silent) + " ms)",
                      silent});
    }
  }
  return lost;
}

void AgentPool::Reap(const std::function<void(AgentState&, const std::string&)>& exited) {
  for (auto& a : agents_) {
    if (a->rsh_done) continue;
    a->rsh.WaitFor(0);
    if (a->rsh.running()) continue;
    a->rsh_done = true;
    const std::string desc = a->rsh.DescribeExit();
    events_->Write("agent-exit", "host=" + a->host.name + " " + desc);
    exited(*a, desc);
  }
}

void AgentPool::Cut(AgentState& a, bool keep_rsh) {
  a.state = AgentState::State::kLost;
  if (a.conn) {
    a.conn->SetHandlers(nullptr, nullptr);
    a.conn->Close("lost");
    a.conn.reset();
  }
  if (!a.rsh_done && !keep_rsh) {
    a.rsh.CloseStdin();
    if (gentle_) {
      a.rsh.Terminate();  // srun ends its step; Close kills what is left
    } else {
      a.rsh.Kill();
    }
  }
}

void AgentPool::Stop(const std::string& reason) {
  pb::Control m;
  m.mutable_stop()->set_reason(reason);
  for (auto& a : agents_) {
    if (a->conn && a->connected()) {
      a->conn->Send(m);
    } else {
      a->rsh.CloseStdin();  // not connected: end of file is how it learns
    }
  }
}

bool AgentPool::AllExited() const {
  for (const auto& a : agents_) {
    if (!a->rsh_done) return false;
  }
  return true;
}

void AgentPool::KillRemaining() {
  if (gentle_) {  // srun steps: SIGTERM ends each cleanly; SIGKILL only after kTerminateMs
    for (auto& a : agents_) {
      if (a->rsh_done) continue;
      OB_LOG(Warn) << "agent on host " << a->host.name << " did not stop in time; ending its step";
      events_->Write("terminate-agent", "host=" + a->host.name);
      a->rsh.CloseStdin();
      a->rsh.Terminate();
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTerminateMs);
    for (auto& a : agents_) {
      if (a->rsh_done) continue;
      const double left = std::chrono::duration<double>(until - std::chrono::steady_clock::now()).count();
      if (a->rsh.WaitFor(std::max(0.0, left)) >= 0) a->rsh_done = true;
    }
  }
  for (auto& a : agents_) {
    if (a->rsh_done) continue;
    OB_LOG(Warn) << "agent on host " << a->host.name << " did not stop in time; killing it";
    events_->Write("kill-agent", "host=" + a->host.name);
    a->rsh.CloseStdin();
    a->rsh.Kill();
    a->rsh.Wait();
    a->rsh_done = true;
  }
}

void AgentPool::Close() {
  for (auto& a : agents_) {
    a->rsh.CloseStdin();
    if (gentle_ && !a->rsh_done) {  // an srun step still there (a lost host): ask it to end first
      a->rsh.Terminate();
      if (a->rsh.WaitFor(kTerminateMs / 1e3) >= 0) a->rsh_done = true;
    }
    if (a->conn) {
      a->conn->SetHandlers(nullptr, nullptr);
      a->conn->Close("run over");
    }
  }
}

void AgentPool::Report(int64_t now, pb::OperatorResponse* r) const {
  static const char* kStates[] = {"starting", "connected", "lost", "stopped"};
  for (const auto& a : agents_) {
    auto* h = r->add_hosts();
    h->set_host(a->host.name);
    h->set_state(kStates[static_cast<int>(a->state)]);
    for (int x : a->ranks) h->add_ranks(static_cast<uint32_t>(x));
    h->set_last_heard_ms_ago(a->conn ? now - a->conn->last_receive_ms() : -1);
  }
}

}  // namespace ob::launch
