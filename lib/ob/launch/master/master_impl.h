// The master's private parts (master.h): the class that master.cc (the
// loop, the agents, generations and recoveries) and master_operator.cc (the
// control socket's requests and the status) implement. Nothing else
// includes it.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ob/control.pb.h"
#include "ob/io/dir_lock.h"
#include "ob/launch/master/agent_pool.h"
#include "ob/launch/wire/channel.h"
#include "ob/launch/master/ckpt_keeper.h"
#include "ob/launch/master/decision.h"
#include "ob/launch/master/event_log.h"
#include "ob/launch/master/hang_watch.h"
#include "ob/launch/master/master.h"
#include "ob/launch/master/master_setup.h"
#include "ob/launch/master/metrics_sink.h"
#include "ob/launch/master/operator_socket.h"
#include "ob/launch/master/recovery_clock.h"
#include "ob/launch/wire/stall_grace.h"
#include "ob/launch/wire/store_server.h"
#include "ob/plan/plan_io.h"
#include "ob/plan/recovery.h"

namespace ob::launch::detail {

constexpr int kTickMs = 50;        // detection granularity (well under the 1 s bound)
constexpr int kProgressMs = 1000;  // progress line period
constexpr int kDecideMs = 100;     // failures this close together are one event
constexpr size_t kHostsNamed = 8;  // in a message about many hosts, the rest are counted (io::NameSome)
constexpr int kStallBlameMs = 5000;  // losses this soon after the master's own stall are its fault

struct RankState {
  bool exited = false;
  uint64_t last_step = 0;
  bool have_metrics = false;
  int phase = 0;  // pb::WorkerPhase of its last record of this generation (0: none yet)
};

class Master {
 public:
  explicit Master(const MasterOptions& o) : opt_(o), server_(&loop_), operator_(&loop_) {
    uv_loop_init(&loop_);
    loop_.data = this;
  }
  ~Master() {
    server_.Close();
    operator_.Close();
    agents_.all().clear();  // kills and reaps what is left of the agents
    uv_walk(&loop_, [](uv_handle_t* h, void*) { if (!uv_is_closing(h)) uv_close(h, nullptr); },
            nullptr);
    for (int i = 0; i < 3; ++i) uv_run(&loop_, UV_RUN_NOWAIT);
    uv_loop_close(&loop_);
  }

  Result<int> Run();

 private:
  // kFollowing: this process is the standby master (master_standby.cc).
  enum class State { kStarting, kRunning, kStopping, kDone, kFollowing };

  Status Prepare();
  // The standby master (design/master.md; master_standby.cc, master_follow.cc).
  // The master's side: the standby started on a host of its own, fed every
  // change, replaced when lost; a master cut off from both the standby and
  // enough hosts that the standby may take over stops (fenced).
  std::string ChooseMasterHost() const;
  std::string ChooseStandbyHost() const;
  void StartStandby();
  void OnStandbyReady(std::shared_ptr<Connection> conn, const pb::Hello& hello);
  void StandbyLost(const std::string& why);
  void CheckStandby();
  void SyncStandby();
  pb::MasterSync StateSync() const;
  void TellStandby(AgentState* only);
  // The hosts this master hears, and the fewest the standby needs for a
  // takeover out of `base` members: a strict majority.
  static size_t Quorum(size_t base) { return base / 2 + 1; }
  bool Fenced();
  bool QuorumInDoubt();
  bool Coming(const AgentState& a, int64_t now) const;
  // Whether the standby was heard within `within_ms`; how many agents are
  // connected and (within_ms >= 0) were heard within it.
  bool StandbyHeard(int64_t within_ms);
  size_t HostsHeard(int64_t within_ms);
  // The standby's side: following the master, then taking over.
  Result<int> RunStandby();
  void Follow();
  void OnLeaderMessage(pb::Control& m);
  void LeaderLost(const std::string& why);
  void ApplySync(const pb::MasterSync& s);
  void FollowTick();
  // The standby stops without taking over: `msg` in events.log and the
  // log; exit 75 (TempFail) when `failed`, else 0.
  void StandbyStops(const std::string& msg, bool failed);
  void TakeOver();
  Status StartAgents();
  std::string Admit(const pb::Hello& hello);
  void OnAgentReady(std::shared_ptr<Connection> conn, const pb::Hello& hello);
  void OnAgentMessage(AgentState& a, pb::Control& m);
  void OnWorkerMetrics(const pb::Metrics& mx);
  void OnRefusal(AgentState& a, const pb::Refusal& r);
  void OnWorkerExited(AgentState& a, const pb::WorkerExited& x);
  void OnAgentClosed(AgentState& a, const std::string& reason);
  void StartWorkers();
  Status LaunchGeneration();
  // How a host was lost: its agent is gone (its rsh exited: it may be
  // started again by hand); cut off (silent, or its connection broke: its
  // rsh is kept, so that an agent cut off for a moment rejoins, agent.h);
  // excluded (a partition, an operator: its rsh is killed and it is not
  // admitted again).
  enum class Lost { kGone, kCutOff, kExcluded };
  void HostLost(AgentState& a, const std::string& what, int64_t latency_ms, Lost how);
  std::string Rollback(const std::string& reason);
  // What DecideRecovery needs that does not depend on the event.
  RecoveryFacts Facts();
  // Carries a decision out (decision.h): a new generation, or the stop.
  void Carry(const Decision& d);
  void ReapAgents();
  void CheckPartition();
  // A rank whose training loop stopped making progress (hang_watch.h).
  void CheckHang();
  // The status's waiting_for (control.proto).
  std::string WaitingFor();
  void InstallSignals();
  void Conclude();
  void Tick();
  void Progress();
  // A failure was detected: `lost_host` names a host whose agent is gone,
  // "" for a worker that failed on a live host (often only because a peer
  // died under it). Failures within kDecideMs of the first are decided
  // together (two hosts lost at once are one event).
  void Failure(const std::string& what, const std::string& lost_host, int64_t latency_ms);
  void Decide();
  void RequestStop(const std::string& reason);
  // The outcome of a stop that saves nothing more (no --ckpt-dir, a second
  // signal, a stop during a recovery): kTempFail naming the steps trained
  // since the newest checkpoint, committed or resumed from, which are lost;
  // Ok when there are none.
  Status StopWithoutSaving(const std::string& reason) const;
  // The steps trained since the newest checkpoint, committed or resumed
  // from: "steps A-B, trained since …, are not on disk"; "" when none.
  std::string Unsaved() const;
  // The hosts' copies of --data read whole in the background (inputs.h
  // ContentCheck) and not yet found to be the job's, from their claims in
  // the store; with `differing`, only those found to differ.
  std::vector<pb::UncheckedCopy> CopiesOfData(bool differing) const;
  // The unchecked copies of the checkpoints this run restored from: their
  // weights came through those bytes, so every checkpoint descended from
  // them lists them too, until this run finds them the job's.
  std::vector<pb::UncheckedCopy> inherited_unchecked_;
  void BeginStop(const std::string& reason, Status outcome);
  // "" when the plan was priced for the kind of device the run ran on; else
  // what it was priced for and what ran ("h100 (NVIDIA H100 ...), not this
  // run's cpu"), for the closing line (MetricsSink::Summary).
  std::string PricedForAnother() const;
  void FinishStop();
  std::string Exclude(const pb::OperatorRequest& req);
  pb::OperatorResponse OnOperator(const pb::OperatorRequest& req);
  int64_t Now() { return static_cast<int64_t>(uv_now(&loop_)); }
  // Nodes the current instantiation leaves out whose agents are connected.
  std::vector<int> LiveIdle() const {
    std::vector<int> live;
    for (int n : idle_) {
      if (agents_.at(n).connected()) live.push_back(n);
    }
    return live;
  }

  MasterOptions opt_;
  uv_loop_t loop_;
  Server server_;
  OperatorSocket operator_;
  StoreServer store_;                       // the job's rendezvous store (store_server.h)
  EventLog events_;
  std::string secret_, bind_addr_, run_dir_;
  std::string run_id_;                      // this run's (Metrics.run): 16 hex digits, new each start
  int bind_port_ = 0;
  LaunchLayout layout_;                     // the current generation's
  std::vector<cluster::Host> hosts_;        // as given
  std::string hosts_name_;
  pb::Plan plan_;                           // the current generation's plan
  plan::LoadedPlan loaded_;                 // the same as the planner sees it
  std::vector<plan::LayerFetch> fetches_;   // the current generation's fetch list
  std::vector<int> idle_;                   // nodes the current instantiation leaves out
  RecoveryClock rec_;                       // the recovery in progress (recovery_clock.h)
  int fruitless_ = 0;                       // recoveries since a generation last completed a step
  CheckpointKeeper ckpt_;                   // --ckpt-dir and --resume (ckpt_keeper.h)
  WeightLineage lineage_;                   // where each generation's weights come from
  // Where the layers are (decision.h): the instantiation of the newest
  // generation every rank of which completed a step, and the nodes lost
  // since.
  plan::Instantiation holding_;
  std::set<int> lost_since_holding_;
  int ranks_reported_ = 0;                  // ranks of this generation that completed a step
  io::DirLock run_lock_;
  std::vector<std::string> failures_;       // what was detected, in order
  std::set<std::string> failed_hosts_;
  int64_t decide_deadline_ms_ = -1;
  // The loop's own stalls (SIGSTOP, a starved CPU), at its ticks: any past
  // StallGrace::kStallMs, after which the agents and workers are heard out
  // for a moment before their silence is judged (stall_grace.h); and one
  // longer than --master-timeout, after which every agent has given up on
  // us (then the losses that follow are ours, not the hosts').
  StallGrace grace_;
  int64_t stalled_ms_ = 0, stall_seen_ms_ = 0;
  AgentPool agents_{&events_};
  std::vector<RankState> ranks_;
  HangWatch hang_;                          // the current generation's progress
  bool hang_suspect_ = false;               // a verdict at the last tick, confirmed after an I/O poll
  MetricsSink metrics_{&operator_};         // --metrics, watchers, progress (metrics_sink.h)
  uv_timer_t tick_{}, heartbeat_{}, progress_{}, drain_{};
  uv_signal_t sigchld_{}, sigterm_{}, sigint_{}, sigusr1_{}, sighup_{};
  State state_ = State::kStarting;
  Status outcome_;
  int64_t start_ms_ = 0, stop_deadline_ms_ = 0, grace_deadline_ms_ = -1;
  // Agents that exited before they connected. The run stops once no other
  // agent is still starting, naming them all (an unreachable host each,
  // with ssh), not only the first to give up.
  struct FailedStart {
    std::string host, what;  // what: "exit status 255"
  };
  std::vector<FailedStart> failed_starts_;
  void CheckFailedStarts();
  std::string FailedStartsText() const;  // "HOST (WHAT), HOST (WHAT)"
  static std::string ExitedBeforeConnecting(const FailedStart& f);  // one host's line
  bool stop_requested_ = false;
  // A stop request's checkpoint: the step every worker saves after, and the
  // generation asked (a recovery meanwhile asks its successor again).
  int64_t stop_ckpt_step_ = -1;
  uint64_t stop_ckpt_generation_ = 0;
  std::string stop_reason_;
  // Every worker of the current generation saves after step K, a step none
  // has reached yet (workers are at most one step apart): K, or kUsage when
  // the run ends before K, or the store's error.
  Result<int64_t> AskCheckpoint(const std::string& reason);
  void AskStopCheckpoint();
  void CheckStopCheckpoint(int64_t now);
  int ranks_done_ = 0;
  uint64_t generation_ = 0;
  std::set<std::string> lost_hosts_;        // hosts lost and not back
  std::string partition_said_;              // the inconclusive partition last logged
  CutSettle cut_settle_;                    // cuts are judged once their reports settle

  // The standby master (design/master.md).
  uint64_t term_ = 1;                       // bumped at each takeover
  std::string master_host_;                 // the host this master runs on ("" unknown)
  struct StandbyLink {
    std::string host;                       // "" : none
    cluster::ChildProcess rsh;
    bool rsh_done = true;
    std::shared_ptr<Connection> conn;
    std::string address;                    // where it listens, ADDR:PORT
    bool suspect = false;
    int starts = 0;                         // how many were started
  } standby_;
  bool standby_wanted_ = false;             // the run has a standby (not off, hosts enough)
  bool standby_synced_ = false;             // the standby got the full state since it connected
  pb::MasterSync delta_;                    // changes not yet sent to it
  std::string last_state_;                  // the state fields last sent, serialized
  uint64_t synced_plan_generation_ = 0;
  size_t quorum_base_ = 0;                  // members when the standby was last heard
  std::vector<std::shared_ptr<Connection>> standby_fetches_;  // standbys fetching their start
  int64_t standby_retry_ms_ = -1;           // when to start a replacement
  // The standby's own: the master it follows, and what it learned.
  std::shared_ptr<Connection> leader_;
  bool leader_lost_ = false;
  int64_t leader_lost_ms_ = 0;
  int64_t leader_heard_ms_ = 0;            // when it was last heard
  bool probing_ = false;                    // asking whether the lost master answers
  int64_t next_probe_ms_ = 0;
  // Since when the lost master's address has refused our probes (nothing
  // listens there: its process is gone); -1 while it has not.
  int64_t leader_refused_ms_ = -1;
  std::string leader_lost_why_;
  bool leader_suspect_ = false;
  std::string followed_host_;               // the master's host
  std::vector<std::string> followed_members_;  // the hosts it heard at its last sync
  std::string takeover_waits_for_;          // the members a takeover waits for, as last said
  int64_t takeover_ms_ = -1;
};

}  // namespace ob::launch::detail
