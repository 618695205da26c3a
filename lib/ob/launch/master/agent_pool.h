// The master's agents (design/launch.md): one per plan host, started through --rsh
// with the job's secret on their stdin (never argv or environment), their
// connection once they authenticate, the judgement of their silences, and
// the end of their processes. master.cc decides what a lost agent means;
// this keeps the facts.
//
// Silence (Judge): an agent silent for more than --agent-timeout is
// suspect at one tick and judged at the next (if this loop was the one
// descheduled, the agent's heartbeats wait in the socket and are read by
// the I/O poll between ticks). A suspect whose host's kernel still
// acknowledges our heartbeats (TCP_INFO, Connection::peer_ack_age_ms) gets
// up to kAckingGrace × --agent-timeout, with one *suspect* line: the link
// is up again after a flap, or the agent's process is slow.
//
// Thread model: the master's loop calls every method.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <utility>
#include <string>
#include <vector>

#include "ob/cluster/hosts.h"
#include "ob/cluster/rsh.h"
#include "ob/control.pb.h"
#include "ob/launch/wire/channel.h"
#include "ob/launch/master/decision.h"
#include "ob/launch/master/event_log.h"
#include "ob/status.h"

namespace ob::launch {

inline constexpr int kAckingGrace = 3;  // × --agent-timeout: a silent agent whose host still ACKs

struct AgentState {
  enum class State { kStarting, kConnected, kLost, kStopped };
  cluster::Host host;
  std::vector<int> ranks;
  cluster::ChildProcess rsh;
  bool rsh_done = false;
  std::shared_ptr<Connection> conn;
  State state = State::kStarting;
  int node = 0;              // plan node id (index into the plan's hosts)
  bool suspect = false;      // silent too long at the last tick; lost if still so at the next
  bool acking = false;       // silent, but its host's kernel still acknowledges
  std::vector<std::string> unreachable;  // peers its last heartbeat could not reach
  // Our clock minus its host's, from its last heartbeat (give or take the
  // network's latency): its times (a worker's exit) moved onto ours.
  int64_t clock_offset_ms = 0;
  std::string excluded;      // why it was excluded for good ("" = it may come back)
  std::string boot_id;       // its machine, and the UUIDs of its GPUs, as its Hello said
  std::vector<std::string> gpus;
  std::vector<uint64_t> gpu_memory;    // and their total memory and names
  std::vector<std::string> gpu_names;
  std::string device;        // "cuda" or "cpu", as its Hello said
  std::string build;         // its ob-launch, as its Hello said
  // A standby's: when this host's agent first and last asked it to take
  // it (master_follow.cc), in this failover; -1 while it has not.
  int64_t asked_first_ms = -1, asked_last_ms = -1;
  bool connected() const { return state == State::kConnected; }
};

class AgentPool {
 public:
  struct Options {
    std::string rsh;                       // "ssh", "local", "slurm" or a prefix command
    std::string self_exe;                  // "" = /proc/self/exe
    std::vector<std::string> agent_flags;
    double master_timeout_s = 3;           // passed to the agents
    double agent_timeout_s = 1;            // a silence this long is judged
  };
  explicit AgentPool(EventLog* events) : events_(events) {}

  // Starts `SELF --agent --master MASTER --host NAME --master-timeout S` for
  // hosts[i] (node i, ranks host_ranks[i]) and writes the secret to its stdin.
  Status Start(const Options& o, const std::vector<cluster::Host>& hosts,
               const std::vector<std::vector<int>>& host_ranks, const std::string& master,
               const std::string& secret);

  // The same hosts, with agents another master started (a standby master
  // taking over: design/master.md): none is ours to start, reap or kill;
  // each is lost until it connects.
  void Adopt(const Options& o, const std::vector<cluster::Host>& hosts,
             const std::vector<std::vector<int>>& host_ranks);

  std::vector<std::unique_ptr<AgentState>>& all() { return agents_; }
  const std::vector<std::unique_ptr<AgentState>>& all() const { return agents_; }
  AgentState& at(int node) { return *agents_[static_cast<size_t>(node)]; }
  const AgentState& at(int node) const { return *agents_[static_cast<size_t>(node)]; }
  AgentState* Find(const std::string& host);
  const AgentState* Find(const std::string& host) const {
    return const_cast<AgentPool*>(this)->Find(host);
  }
  std::vector<int> Live() const;           // nodes whose agents are connected
  bool AllConnected() const;
  // Hosts not yet authenticated: the first `named`, ", "-separated, and how many more.
  std::string Starting(size_t named) const;
  bool AnyPending() const;                 // an agent neither authenticated nor exited

  void Send(const pb::Control& m);         // to every connected agent
  void Beat();                             // a heartbeat to every connected agent
  // The connected agents with ranks, as StartWorkers.peers: host and the
  // IP address its connection comes from.
  std::vector<pb::PeerHost> Peers() const;
  // Pairs (a < b) of connected nodes one of which reports the other
  // unreachable (peer_probe.h).
  CutReports Cuts() const;
  // Agents whose silence is judged a loss now (above): each with the line
  // that says so and the silence in ms.
  struct Loss {
    AgentState* agent;
    std::string what;
    int64_t silent_ms;
  };
  std::vector<Loss> Judge(int64_t now);
  // Calls `exited(agent, description)` for each agent whose rsh process has
  // exited since the last call.
  void Reap(const std::function<void(AgentState&, const std::string&)>& exited);
  // Cuts a connected agent off: kLost, its connection closed; unless
  // `keep_rsh`, its rsh process killed too (with --rsh slurm, SIGTERM: srun
  // then ends the step cleanly; SIGKILL, which can leave a step behind,
  // only if it has not ended after kTerminateMs, in KillRemaining or Close).
  void Cut(AgentState& a, bool keep_rsh);

  // Stopping: Stop to the connected, end of file on stdin to the rest.
  void Stop(const std::string& reason);
  bool AllExited() const;
  void KillRemaining();                    // after kStopWaitMs
  static constexpr int kTerminateMs = 5000;  // an srun step's time to end on SIGTERM
  void Close();                            // the run is over: stdin and connections closed
  void Report(int64_t now, pb::OperatorResponse* r) const;  // hosts of a status answer

 private:
  Options o_;
  bool gentle_ = false;                    // rsh processes are srun steps (--rsh slurm)
  EventLog* events_;
  uint64_t beats_ = 0;
  std::vector<std::unique_ptr<AgentState>> agents_;
};

}  // namespace ob::launch
