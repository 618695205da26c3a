#include "ob/launch/master.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <memory>
#include <set>

#include "ob/ckpt/checkpoint.h"
#include "ob/clock.h"
#include "ob/cluster/rsh.h"
#include "ob/io/dir_lock.h"
#include "ob/io/file.h"
#include "ob/io/message.h"
#include "ob/io/records.h"
#include "ob/launch/agent.h"
#include "ob/launch/channel.h"
#include "ob/launch/commit_queue.h"
#include "ob/launch/decision.h"
#include "ob/launch/event_log.h"
#include "ob/launch/master_setup.h"
#include "ob/launch/operator_socket.h"
#include "ob/launch/store_keys.h"
#include "ob/launch/store_relay.h"
#include "ob/launch/store_server.h"
#include "ob/log.h"
#include "ob/model/data.h"
#include "ob/plan/plan_io.h"
#include "ob/plan/recovery.h"

namespace ob::launch {
namespace {

constexpr int kTickMs = 50;        // detection granularity (well under the 1 s bound)
constexpr int kProgressMs = 1000;  // progress line period
constexpr int kDecideMs = 100;     // failures this close together are one event
constexpr int kDrainMs = 300;      // the most time spent flushing on the way out
constexpr int kStallBlameMs = 5000;  // losses this soon after the master's own stall are its fault
constexpr int kAckingGrace = 3;      // x --agent-timeout: a silent agent whose host still ACKs

std::string FormatTime(int64_t unix_ms, const char* fmt) {
  time_t s = static_cast<time_t>(unix_ms / 1000);
  struct tm tm {};
  gmtime_r(&s, &tm);
  char buf[64];
  strftime(buf, sizeof buf, fmt, &tm);
  return buf;
}

std::string Fixed(double v, int digits) {
  char buf[64];
  snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// Creates `path` and its parents (mode 0777 less the umask), the last one
// with `mode` (also less the umask). One that exists is left as it is.
Status MakeDirs(const std::string& path, const std::string& what, mode_t mode = 0777) {
  for (size_t at = 1; at <= path.size(); ++at) {
    if (at == path.size() || path[at] == '/') {
      std::string part = path.substr(0, at);
      if (::mkdir(part.c_str(), at == path.size() ? mode : 0777) != 0 && errno != EEXIST) {
        return Status::IoErr(part + ": cannot create the " + what + ": " + std::strerror(errno));
      }
    }
  }
  return Status::Ok();
}

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
};

struct RankState {
  bool exited = false;
  pb::Metrics last;
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
    agents_.clear();  // kills and reaps what is left of the agents
    uv_walk(&loop_, [](uv_handle_t* h, void*) { if (!uv_is_closing(h)) uv_close(h, nullptr); },
            nullptr);
    for (int i = 0; i < 3; ++i) uv_run(&loop_, UV_RUN_NOWAIT);
    uv_loop_close(&loop_);
    if (metrics_fd_ > STDERR_FILENO) ::close(metrics_fd_);
  }

  Result<int> Run();

 private:
  enum class State { kStarting, kRunning, kStopping, kDone };

  Status Prepare();
  Status StartAgents();
  std::string Admit(const pb::Hello& hello);
  void OnAgentReady(std::shared_ptr<Connection> conn, const pb::Hello& hello);
  void OnAgentMessage(AgentState& a, pb::Control& m);
  void OnAgentClosed(AgentState& a, const std::string& reason);
  void StartWorkers();
  Status LaunchGeneration();
  // `rejoin`: keep its rsh (and so the agent) alive, so that an agent that
  // was only cut off for a moment can come back (agent.h, "Rejoining").
  void HostLost(AgentState& a, const std::string& what, int64_t latency_ms, bool rejoin = false);
  void OnFirstSteps(const pb::Metrics& m);
  void OnCheckpointPart(const pb::Metrics& m);
  // A record for --metrics and for every watcher of the control socket.
  void Publish(const pb::Metrics& m);
  std::string Rollback(const std::string& reason);
  // Reports a finished commit and starts the next queued one; with `wait`,
  // waits for the running one.
  void CommitCheckpoints(bool wait = false);
  // What DecideRecovery needs that does not depend on the event.
  RecoveryFacts Facts();
  // Carries a decision out (decision.h): a new generation, or the stop.
  void Carry(const Decision& d);
  // The newest checkpoint of --ckpt-dir that verifies and is this job's
  // (or any job's with --resume-from-other); those passed over go to
  // events.log and the log.
  Result<ckpt::Verified> UsableCheckpoint(const std::string& dir);
  std::string OtherJob(const pb::Manifest& m) const;
  void CheckpointFailed(int64_t step, const std::string& why);
  void ReapAgents();
  // The status's waiting_for (control.proto).
  std::string WaitingFor();
  void Tick();
  void Progress();
  // A failure was detected: `lost_host` names a host whose agent is gone,
  // "" for a worker that failed on a live host (often only because a peer
  // died under it). Failures within kDecideMs of the first are decided
  // together (two hosts lost at once are one event).
  void Failure(const std::string& what, const std::string& lost_host, int64_t latency_ms);
  void Decide();
  void RequestStop(const std::string& reason);
  void BeginStop(const std::string& reason, Status outcome);
  void FinishStop();
  pb::OperatorResponse OnOperator(const pb::OperatorRequest& req);
  int64_t Now() { return static_cast<int64_t>(uv_now(&loop_)); }
  // Nodes the current instantiation leaves out whose agents are connected.
  std::vector<int> LiveIdle() const {
    std::vector<int> live;
    for (int n : idle_) {
      if (agents_[static_cast<size_t>(n)]->state == AgentState::State::kConnected) live.push_back(n);
    }
    return live;
  }
  AgentState* FindAgent(const std::string& host) {
    for (auto& a : agents_) {
      if (a->host.name == host) return a.get();
    }
    return nullptr;
  }

  MasterOptions opt_;
  uv_loop_t loop_;
  Server server_;
  OperatorSocket operator_;
  StoreServer store_;                       // the job's rendezvous store (store_server.h)
  EventLog events_;
  std::string secret_, bind_addr_, run_dir_;
  int bind_port_ = 0;
  LaunchLayout layout_;                     // the current generation's
  std::vector<cluster::Host> hosts_;        // as given
  std::string hosts_name_;
  pb::Plan plan_;                           // the current generation's plan
  plan::LoadedPlan loaded_;                 // the same as the planner sees it
  std::vector<plan::LayerFetch> fetches_;   // the current generation's fetch list
  std::vector<int> idle_;                   // nodes the current instantiation leaves out
  // The recovery in progress: phases for the `recovered` line.
  struct Recovering {
    bool active = false;
    int64_t detect_unix_ms = 0;      // first detection
    int64_t detect_latency_ms = 0;
    int64_t decide_ms = 0;           // first detection to the decision
    int64_t started_unix_ms = 0;     // the new generation was sent to the agents
    int64_t process_start_ms = 0;    // latest worker process start
    double regroup_s = 0, restore_s = 0, first_step_s = 0;  // slowest rank's
    int reported = 0;
    uint64_t first_step = 0;
  } rec_;
  int fruitless_ = 0;                       // recoveries since a generation last completed a step
  // Checkpoints: their commits (with --ckpt-dir), and the checkpoint the
  // next generation starts from.
  std::unique_ptr<CommitQueue> commits_;
  // Checkpoint saves: the newest committed and the newest that failed in
  // this run. A run whose newest save failed does not exit 0.
  int64_t ckpt_good_step_ = -1, ckpt_failed_step_ = -1;
  std::string ckpt_failure_;
  WeightLineage lineage_;                   // where each generation's weights come from
  // Where the layers are (decision.h): the instantiation of the newest
  // generation every rank of which completed a step, and the nodes lost
  // since.
  plan::Instantiation holding_;
  std::set<int> lost_since_holding_;
  int ranks_reported_ = 0;                  // ranks of this generation that completed a step
  pb::JobIdentity job_;                     // recorded in manifests, checked on resume
  io::DirLock run_lock_, ckpt_lock_;
  std::vector<std::string> failures_;       // what was detected, in order
  std::set<std::string> failed_hosts_;
  int64_t decide_deadline_ms_ = -1;
  // The loop's own stalls (SIGSTOP, a starved CPU): the last tick, and a
  // stall longer than --master-timeout, after which every agent has given
  // up on us (then the losses that follow are ours, not the hosts').
  int64_t last_tick_ms_ = -1, stalled_ms_ = 0, stall_seen_ms_ = 0;
  std::vector<std::unique_ptr<AgentState>> agents_;
  std::vector<RankState> ranks_;
  int metrics_fd_ = -1;
  std::unique_ptr<io::RecordWriter> metrics_out_;
  uv_timer_t tick_{}, heartbeat_{}, progress_{}, drain_{};
  uv_signal_t sigchld_{}, sigterm_{}, sigint_{};
  State state_ = State::kStarting;
  Status outcome_;
  int64_t start_ms_ = 0, stop_deadline_ms_ = 0, grace_deadline_ms_ = -1;
  bool stop_requested_ = false, new_metrics_ = false;
  int ranks_done_ = 0;
  uint64_t heartbeat_seq_ = 0, generation_ = 0, last_step_ = 0;
  std::set<std::string> lost_hosts_;        // hosts lost and not back
  // For the closing summary: rank 0's steps, their summed time and last loss.
  uint64_t steps_done_ = 0;
  double step_seconds_sum_ = 0, tokens_sum_ = 0, last_loss_ = 0;
};

Status Master::Prepare() {
  OB_ASSIGN_OR_RETURN(secret_, ReadSecret(opt_.secret_file));
  ::unsetenv("OB_SECRET");  // agents and workers get it on stdin or not at all
  OB_ASSIGN_OR_RETURN(hosts_, LoadLaunchHosts(opt_.hosts_path));
  pb::Plan& plan = plan_;
  OB_RETURN_IF_ERROR(io::LoadMessage(opt_.plan_path, io::kPlanFormatVersion, &plan));
  hosts_name_ = opt_.hosts_path.empty() ? "the Slurm node list" : opt_.hosts_path;
  Result<LaunchLayout> layout = LayOut(plan, hosts_, hosts_name_);
  if (!layout.ok()) return layout.status().WithContext(io::DisplayName(opt_.plan_path));
  layout_ = std::move(layout).value();
  auto loaded = plan::FromProto(plan);
  if (!loaded.ok()) return loaded.status().WithContext(io::DisplayName(opt_.plan_path));
  loaded_ = std::move(loaded).value();
  holding_ = loaded_.instantiation;
  ranks_.resize(layout_.ranks.size());
  OB_RETURN_IF_ERROR(ParseBind(opt_.bind, &bind_addr_, &bind_port_));
  // The run directory is ours alone: a second master there would delete
  // our control socket and interleave its events.log with ours.
  run_dir_ = opt_.run_dir.empty() ? "ob-run-" + FormatTime(UnixMs(), "%Y%m%d-%H%M%S") : opt_.run_dir;
  // Only the job's user enters it: its logs name hosts and carry the
  // losses, its control socket steers the run.
  OB_RETURN_IF_ERROR(MakeDirs(run_dir_, "run directory", 0700));
  OB_ASSIGN_OR_RETURN(run_lock_, io::DirLock::Acquire(run_dir_, "ob-launch, run directory " + run_dir_));
  OB_RETURN_IF_ERROR(events_.Open(run_dir_ + "/events.log"));
  job_.set_seed(opt_.seed);
  job_.set_data(opt_.data);
  job_.set_data_fingerprint(model::DataFingerprint(opt_.data));
  if (!opt_.ckpt_dir.empty()) {
    // So is the checkpoint directory: two jobs saving into one overwrite
    // each other's steps and remove each other's unfinished saves.
    OB_RETURN_IF_ERROR(MakeDirs(opt_.ckpt_dir, "checkpoint directory"));
    OB_ASSIGN_OR_RETURN(ckpt_lock_, io::DirLock::Acquire(opt_.ckpt_dir, "ob-launch, run directory " + run_dir_));
    commits_ = std::make_unique<CommitQueue>(opt_.ckpt_dir, opt_.ckpt_keep,
                                             loaded_.problem.num_layers());
    // Saves a killed run left half-written would mix with ours.
    Result<std::vector<std::string>> removed = ckpt::RemovePartials(opt_.ckpt_dir);
    if (!removed.ok() && removed.status().code() != Code::kNoInput) return removed.status();
    if (removed.ok() && !removed->empty()) {
      OB_LOG(Info) << "removed " << removed->size() << " unfinished checkpoint(s) from " << opt_.ckpt_dir;
    }
  }
  if (!opt_.resume.empty()) {
    // Every checksum, before any host starts: a damaged checkpoint is never
    // half loaded.
    pb::Manifest m;
    std::string from;
    if (opt_.resume == "auto") {
      if (opt_.ckpt_dir.empty()) return Status::Usage("--resume auto needs --ckpt-dir");
      Result<ckpt::Verified> v = UsableCheckpoint(opt_.ckpt_dir);
      if (v.ok()) {
        from = v->path;
        m = v->manifest;
      } else if (v.status().code() != Code::kNoInput) {
        return v.status();  // there are checkpoints, none usable: never a silent fresh start
      } else {
        OB_LOG(Info) << "--resume auto: no checkpoint in " << opt_.ckpt_dir << " yet; starting afresh";
      }
    } else {
      OB_RETURN_IF_ERROR(ckpt::Verify(opt_.resume));
      OB_ASSIGN_OR_RETURN(m, ckpt::LoadManifest(opt_.resume));
      if (const std::string why = OtherJob(m); !why.empty()) return Status::Config(opt_.resume + ": " + why);
      from = opt_.resume;
    }
    if (!from.empty()) {
      if (m.model().SerializeAsString() != plan_.model().SerializeAsString()) {
        return Status::Config(from + ": holds a " + m.model().name() + " model, the plan's is " +
                              plan_.model().name());
      }
      const int64_t step = static_cast<int64_t>(m.step());
      lineage_.RestoreNext({from, step});
      if (opt_.steps > 0 && step + 1 >= opt_.steps) {
        return Status::Usage(from + ": the checkpoint is of step " + std::to_string(step) +
                             " and --steps " + std::to_string(opt_.steps) + " ends at step " +
                             std::to_string(opt_.steps - 1) + ": nothing left to train (raise --steps)");
      }
    }
  }
  if (!opt_.worker_command) return Status::Internal("no worker command");

  if (!opt_.metrics.empty()) {
    if (opt_.metrics == "-") {
      if (io::StdoutIsTerminal()) {
        return Status::Usage("refusing to write binary metrics to a terminal; use --metrics FILE or a pipe");
      }
      metrics_fd_ = STDOUT_FILENO;
    } else {
      metrics_fd_ = ::open(opt_.metrics.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (metrics_fd_ < 0) {
        return Status::IoErr(opt_.metrics + ": cannot write metrics: " + std::strerror(errno));
      }
    }
    metrics_out_ = std::make_unique<io::RecordWriter>(metrics_fd_, io::DisplayName(opt_.metrics, true));
  }
  if (opt_.log_to_run_dir && !log::SetFile(run_dir_ + "/master.log")) {
    return Status::IoErr(run_dir_ + "/master.log: cannot open");
  }
  return Status::Ok();
}

std::string Master::OtherJob(const pb::Manifest& m) const {
  if (opt_.resume_from_other || !m.has_job()) return "";  // (saved before job identities)
  const pb::JobIdentity& j = m.job();
  std::string why;
  if (j.seed() != job_.seed()) {
    why = "seed " + std::to_string(j.seed()) + ", this run's is " + std::to_string(job_.seed());
  } else if (!j.data_fingerprint().empty() && !job_.data_fingerprint().empty() &&
             j.data_fingerprint() != job_.data_fingerprint()) {
    why = "data " + j.data() + " (" + j.data_fingerprint() + "), this run reads " + job_.data() + " (" +
          job_.data_fingerprint() + ")";
  }
  return why.empty() ? "" : "saved by another job (" + why + "); --resume-from-other takes it anyway";
}

Result<ckpt::Verified> Master::UsableCheckpoint(const std::string& dir) {
  Result<ckpt::Verified> v =
      ckpt::NewestVerified(dir, [this](const pb::Manifest& m) { return OtherJob(m); });
  if (v.ok()) {
    for (const std::string& why : v->skipped) {
      events_.Write("skip-checkpoint", why);
      OB_LOG(Warn) << "skipping checkpoint " << why;
    }
  }
  return v;
}

void Master::CheckpointFailed(int64_t step, const std::string& why) {
  if (step > ckpt_failed_step_) {
    ckpt_failed_step_ = step;
    ckpt_failure_ = why;
  }
}

Result<int> Master::Run() {
  OB_RETURN_IF_ERROR(Prepare());
  ::signal(SIGPIPE, SIG_IGN);  // a dead agent's stdin must not kill us
  uv_signal_init(&loop_, &sigchld_);
  uv_signal_start(&sigchld_, [](uv_signal_t* s, int) {
    static_cast<Master*>(s->loop->data)->ReapAgents();
  }, SIGCHLD);
  for (auto [h, sig] : {std::pair{&sigterm_, SIGTERM}, {&sigint_, SIGINT}}) {
    uv_signal_init(&loop_, h);
    uv_signal_start(h, [](uv_signal_t* s, int signum) {
      static_cast<Master*>(s->loop->data)->RequestStop(std::string("got ") + strsignal(signum));
    }, sig);
  }

  Server::Options so;
  so.bind = bind_addr_;
  so.port = bind_port_;
  so.secret = secret_;
  OB_RETURN_IF_ERROR(server_.Listen(
      so, [this](const pb::Hello& h) { return Admit(h); },
      [this](std::shared_ptr<Connection> c, const pb::Hello& h) { OnAgentReady(std::move(c), h); }));
  OB_LOG(Info) << "control channel on " << bind_addr_ << ":" << server_.port() << "; run directory "
               << run_dir_;
  events_.Write("listen", bind_addr_ + ":" + std::to_string(server_.port()));
  Status op = operator_.Listen(run_dir_ + "/control.sock",
                               [this](const pb::OperatorRequest& r) { return OnOperator(r); });
  if (!op.ok()) {
    OB_LOG(Warn) << "no control socket: " << op.message();
  }

  start_ms_ = Now();
  OB_RETURN_IF_ERROR(StartAgents());
  uv_timer_init(&loop_, &tick_);
  uv_timer_init(&loop_, &heartbeat_);
  uv_timer_init(&loop_, &progress_);
  uv_timer_init(&loop_, &drain_);
  uv_timer_start(&tick_, [](uv_timer_t* t) { static_cast<Master*>(t->loop->data)->Tick(); },
                 kTickMs, kTickMs);
  uv_timer_start(&heartbeat_, [](uv_timer_t* t) {
    auto* m = static_cast<Master*>(t->loop->data);
    pb::Control hb;
    hb.mutable_heartbeat()->set_sequence(++m->heartbeat_seq_);
    hb.mutable_heartbeat()->set_unix_ms(UnixMs());
    for (auto& a : m->agents_) {
      if (a->conn) a->conn->Send(hb);
    }
  }, kHeartbeatMs, kHeartbeatMs);
  uv_timer_start(&progress_, [](uv_timer_t* t) { static_cast<Master*>(t->loop->data)->Progress(); },
                 kProgressMs, kProgressMs);
  uv_run(&loop_, UV_RUN_DEFAULT);
  if (state_ != State::kDone) FinishStop();
  while (commits_ && !commits_->idle()) CommitCheckpoints(true);  // the last ones, before we exit
  if (outcome_.ok() && ckpt_failed_step_ > ckpt_good_step_) {
    // Asked to checkpoint, and the newest save failed: the work since the
    // latest good one is not on disk, and the exit status must say so.
    Result<std::string> good = ckpt::Latest(opt_.ckpt_dir);
    const std::string msg = "the checkpoint of step " + std::to_string(ckpt_failed_step_) +
                            " failed (" + ckpt_failure_ + "); the latest good one is " +
                            (good.ok() ? *good : std::string("none"));
    OB_LOG(Error) << msg;
    outcome_ = Status::IoErr(msg);
  }
  events_.Write("done", outcome_.ok() ? "exit 0" : "exit " + std::to_string(outcome_.exit_code()));
  if (!outcome_.ok()) return outcome_;
  return 0;
}

Status Master::StartAgents() {
  std::string self = opt_.self_exe;
  if (self.empty()) {
    char buf[4096];
    ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return Status::Internal("cannot find this program's path in /proc/self/exe");
    self.assign(buf, static_cast<size_t>(n));
  }
  const std::string master = AdvertisedHost(bind_addr_) + ":" + std::to_string(server_.port());
  for (size_t i = 0; i < layout_.hosts.size(); ++i) {
    auto a = std::make_unique<AgentState>();
    a->host = layout_.hosts[i];
    a->ranks = layout_.host_ranks[i];
    a->node = static_cast<int>(i);
    std::vector<std::string> cmd = {self, "--agent", "--master", master, "--host", a->host.name,
                                    "--master-timeout", Fixed(opt_.master_timeout_s, 3)};
    cmd.insert(cmd.end(), opt_.agent_flags.begin(), opt_.agent_flags.end());
    Result<cluster::ChildProcess> child = cluster::SpawnWithPipes(cluster::RshArgv(opt_.rsh, a->host, cmd));
    if (!child.ok()) return child.status().WithContext("host " + a->host.name);
    a->rsh = std::move(child).value();
    const std::string line = secret_ + "\n";
    if (::write(a->rsh.stdin_fd(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      OB_LOG(Warn) << "host " << a->host.name << ": cannot hand the secret to its agent";
    }
    events_.Write("agent-start", "host=" + a->host.name + " pid=" + std::to_string(a->rsh.pid()));
    agents_.push_back(std::move(a));
  }
  OB_LOG(Info) << "started " << agents_.size() << " agent(s) with --rsh " << opt_.rsh
               << "; world size " << layout_.ranks.size();
  if (!layout_.spares.empty()) {
    OB_LOG(Info) << layout_.spares.size() << " host(s) not in the plan stay idle";
  }
  return Status::Ok();
}

std::string Master::Admit(const pb::Hello& hello) {
  AgentState* a = FindAgent(hello.host());
  if (a == nullptr) return "unknown host '" + hello.host() + "'";
  if (state_ == State::kRunning && a->state == AgentState::State::kLost) return "";  // rejoin
  if (a->state != AgentState::State::kStarting) return "host '" + hello.host() + "' already connected";
  if (state_ != State::kStarting) return "the run is not accepting agents now";
  return "";
}

void Master::OnAgentReady(std::shared_ptr<Connection> conn, const pb::Hello& hello) {
  AgentState* a = FindAgent(hello.host());
  const bool rejoin = a != nullptr && state_ == State::kRunning && a->state == AgentState::State::kLost;
  if (a == nullptr || (state_ != State::kStarting && !rejoin)) {
    conn->Close("not accepting agents");
    return;
  }
  a->conn = std::move(conn);
  a->state = AgentState::State::kConnected;
  a->conn->SetHandlers([this, a](Connection&, pb::Control& m) { OnAgentMessage(*a, m); },
                       [this, a](Connection&, const std::string& r) { OnAgentClosed(*a, r); });
  const int64_t ms = Now() - start_ms_;
  OB_LOG(Info) << "agent on host " << a->host.name << " (pid " << hello.pid() << ", "
               << a->conn->peer() << ") authenticated after " << ms << " ms";
  events_.Write(rejoin ? "agent-rejoined" : "agent-connected",
                "host=" + a->host.name + " peer=" + a->conn->peer() + " after_ms=" + std::to_string(ms));
  if (rejoin) {  // added at the next generation, decided with anything else pending
    lost_hosts_.erase(a->host.name);
    if (decide_deadline_ms_ < 0) decide_deadline_ms_ = Now() + kDecideMs;
    return;
  }
  for (auto& x : agents_) {
    if (x->state != AgentState::State::kConnected) return;
  }
  StartWorkers();
}

void Master::StartWorkers() {
  state_ = State::kRunning;
  OB_LOG(Info) << "every agent authenticated in " << Now() - start_ms_ << " ms; starting "
               << layout_.ranks.size() << " worker(s)";
  Status st = LaunchGeneration();
  if (!st.ok()) BeginStop(st.message(), st);
}

// Publishes the next generation (plan_ and fetches_ as they are now) and
// has every live agent replace its workers with that generation's.
Status Master::LaunchGeneration() {
  ++generation_;
  Result<LaunchLayout> layout = LayOut(plan_, hosts_, hosts_name_);
  if (!layout.ok()) return layout.status().WithContext("generation " + std::to_string(generation_));
  layout_ = std::move(layout).value();
  const pb::WeightSource source = lineage_.Next(generation_);
  {
    pb::Generation g;
    g.set_generation(generation_);
    *g.mutable_plan() = plan_;
    *g.mutable_source() = source;
    for (const auto& f : fetches_) {
      auto* x = g.add_fetches();
      x->set_node(static_cast<uint32_t>(f.node));
      x->set_layer(static_cast<uint32_t>(f.layer));
      x->set_from_node(static_cast<uint32_t>(f.from_node));
    }
    OB_RETURN_IF_ERROR(store_.Set(GenerationKey(generation_), g.SerializeAsString())
                           .WithContext("cannot publish generation " + std::to_string(generation_)));
    if (generation_ > 2) store_.ErasePrefix(GenerationKeysPrefix(generation_ - 2));
  }
  if (source.kind() == pb::WeightSource::CHECKPOINT) {
    events_.Write("resume", "generation=" + std::to_string(generation_) + " from " + source.checkpoint());
  }
  ranks_.assign(layout_.ranks.size(), RankState{});
  ranks_reported_ = 0;
  ranks_done_ = 0;
  if (commits_) commits_->ForgetParts();  // parts of earlier generations' workers no longer count
  const int world = static_cast<int>(layout_.ranks.size());
  for (size_t i = 0; i < agents_.size(); ++i) {
    AgentState& a = *agents_[i];
    a.ranks = layout_.host_ranks[i];
    if (a.state != AgentState::State::kConnected || !a.conn) continue;
    pb::Control m;
    auto* sw = m.mutable_start_workers();
    sw->set_generation(generation_);
    for (int r : a.ranks) {
      const RankPlacement& p = layout_.ranks[static_cast<size_t>(r)];
      WorkerContext ctx{r, world, p.local_rank, p.pipeline, p.stage, a.host.name,
                        opt_.plan_path, generation_};
      pb::WorkerSpec spec = opt_.worker_command(ctx);
      spec.set_rank(static_cast<uint32_t>(r));
      spec.set_local_rank(static_cast<uint32_t>(p.local_rank));
      *sw->add_workers() = std::move(spec);
    }
    a.conn->Send(m);
  }
  rec_.started_unix_ms = UnixMs();
  std::string pipes;
  for (const auto& p : loaded_.instantiation.pipelines) pipes += (pipes.empty() ? "" : "+") + std::to_string(p.template_nodes);
  events_.Write("start-workers", "generation=" + std::to_string(generation_) +
                                     " world=" + std::to_string(world) + " pipelines=" + pipes +
                                     " source=" + DescribeSource(source));
  return Status::Ok();
}

void Master::OnAgentMessage(AgentState& a, pb::Control& m) {
  if (state_ == State::kStopping || state_ == State::kDone) return;
  if (m.has_store_request()) return ServeStoreRequest(&store_, a.conn, m.store_request(), Now());
  if (m.has_worker_metrics()) {
    const pb::Metrics& mx = m.worker_metrics().metrics();
    Publish(mx);
    const bool current = mx.generation() == 0 || mx.generation() == generation_;
    if (current && mx.has_checkpoint()) OnCheckpointPart(mx);
    if (current && mx.rank() < ranks_.size()) ranks_[mx.rank()].phase = std::max<int>(mx.phase(), 1);
    if (current && mx.rank() < ranks_.size() && !mx.heartbeat()) {
      if (!ranks_[mx.rank()].have_metrics && ++ranks_reported_ == static_cast<int>(ranks_.size())) {
        lineage_.Stepped();  // every rank holds a snapshot of this lineage past its start
        holding_ = loaded_.instantiation;
        lost_since_holding_.clear();
      }
      ranks_[mx.rank()].last = mx;
      ranks_[mx.rank()].have_metrics = true;
      last_step_ = std::max<uint64_t>(last_step_, mx.step());
      new_metrics_ = true;
      fruitless_ = 0;
      if (mx.rank() == 0) {  // every rank reports the same global loss and throughput
        steps_done_ = std::max<uint64_t>(steps_done_, mx.step() + 1);
        step_seconds_sum_ += mx.step_seconds();
        tokens_sum_ += mx.tokens_per_second() * mx.step_seconds();
        last_loss_ = mx.loss();
      }
      if (mx.process_start_unix_ms() > 0) OnFirstSteps(mx);
    }
    return;
  }
  if (m.has_worker_exited()) {
    const pb::WorkerExited& x = m.worker_exited();
    if (x.generation() != 0 && x.generation() != generation_) return;  // replaced on purpose
    if (x.rank() >= ranks_.size() || ranks_[x.rank()].exited) return;
    ranks_[x.rank()].exited = true;
    const int64_t latency = std::max<int64_t>(0, UnixMs() - x.unix_ms());
    {  // the exit, in the metrics stream too (ob-watch's crash detector)
      pb::Metrics rec;
      rec.set_format_version(io::kMetricsFormatVersion);
      rec.set_host(a.host.name);
      rec.set_rank(x.rank());
      rec.set_generation(x.generation() != 0 ? x.generation() : generation_);
      rec.set_step(ranks_[x.rank()].have_metrics ? ranks_[x.rank()].last.step() : 0);
      rec.set_unix_ms(x.unix_ms());
      rec.mutable_exit()->set_exit_status(x.exit_status());
      rec.mutable_exit()->set_signal(x.signal());
      rec.mutable_exit()->set_description(x.description());
      Publish(rec);
    }
    events_.Write("worker-exit", "rank=" + std::to_string(x.rank()) + " host=" + a.host.name +
                                     " " + x.description() + " latency_ms=" + std::to_string(latency));
    if (x.exit_status() == 0 && x.signal() == 0) {
      OB_LOG(Info) << "worker rank " << x.rank() << " on host " << a.host.name << " finished";
      if (++ranks_done_ == static_cast<int>(ranks_.size())) {
        BeginStop("training finished: every worker exited 0", Status::Ok());
      }
      return;
    }
    Failure("worker rank " + std::to_string(x.rank()) + " on host " + a.host.name + " failed (" +
                x.description() + "), detected in " + std::to_string(latency) + " ms",
            "", latency);
  }
}

void Master::OnAgentClosed(AgentState& a, const std::string& reason) {
  const int64_t silent = Now() - (a.conn ? a.conn->last_receive_ms() : Now());
  if (a.state != AgentState::State::kConnected) return;
  HostLost(a, "lost the agent on host " + a.host.name + " (connection " + reason + "), detected " +
                  std::to_string(silent) + " ms after its last message",
           silent, /*rejoin=*/true);
}

void Master::ReapAgents() {
  for (auto& a : agents_) {
    if (a->rsh_done) continue;
    a->rsh.WaitFor(0);
    if (a->rsh.running()) continue;
    a->rsh_done = true;
    const std::string desc = a->rsh.DescribeExit();
    events_.Write("agent-exit", "host=" + a->host.name + " " + desc);
    if (state_ == State::kStopping || state_ == State::kDone) continue;
    if (a->state == AgentState::State::kStarting) {
      std::string msg = "the agent on host " + a->host.name + " exited before it connected (" +
                        desc + ")";
      events_.Write("detect", msg);
      OB_LOG(Error) << msg;
      BeginStop(msg, Status::Unavailable(msg));
    } else if (a->state == AgentState::State::kConnected) {
      const int64_t silent = a->conn ? Now() - a->conn->last_receive_ms() : 0;
      HostLost(*a, "lost the agent on host " + a->host.name + " (its process " + desc +
                       "), detected " + std::to_string(silent) + " ms after its last message",
               silent);
    }
  }
}

void Master::Tick() {
  const int64_t now = Now();
  if (last_tick_ms_ >= 0 && state_ == State::kRunning &&
      now - last_tick_ms_ > static_cast<int64_t>(opt_.master_timeout_s * 1e3)) {
    stalled_ms_ = now - last_tick_ms_;
    stall_seen_ms_ = now;
    const std::string msg = "the master itself did not run for " + std::to_string(stalled_ms_) +
                            " ms (stopped, or starved of CPU), longer than --master-timeout " +
                            Fixed(opt_.master_timeout_s, 1) + " s";
    events_.Write("detect", msg);
    OB_LOG(Error) << msg;
  }
  last_tick_ms_ = now;
  ReapAgents();
  store_.Sweep(now);  // held GET/WAIT requests past their deadline
  CommitCheckpoints();
  if (state_ == State::kStopping) {
    bool all_gone = true;
    for (auto& a : agents_) all_gone = all_gone && a->rsh_done;
    if (all_gone) return FinishStop();
    if (now >= stop_deadline_ms_) {
      for (auto& a : agents_) {
        if (a->rsh_done) continue;
        OB_LOG(Warn) << "agent on host " << a->host.name << " did not stop in time; killing it";
        events_.Write("kill-agent", "host=" + a->host.name);
        a->rsh.CloseStdin();
        a->rsh.Kill();
        a->rsh.Wait();
        a->rsh_done = true;
      }
      FinishStop();
    }
    return;
  }
  if (state_ == State::kStarting && now - start_ms_ > static_cast<int64_t>(opt_.start_timeout_s * 1e3)) {
    std::string missing;
    for (auto& a : agents_) {
      if (a->state == AgentState::State::kStarting) missing += (missing.empty() ? "" : ", ") + a->host.name;
    }
    std::string msg = "no agent authenticated within " + Fixed(opt_.start_timeout_s, 0) +
                      " s on host(s) " + missing;
    events_.Write("detect", msg);
    OB_LOG(Error) << msg;
    return BeginStop(msg, Status::Unavailable(msg));
  }
  if (state_ == State::kRunning) {
    for (auto& a : agents_) {
      if (a->state != AgentState::State::kConnected || !a->conn) continue;
      const int64_t silent = now - a->conn->last_receive_ms();
      const int64_t limit = static_cast<int64_t>(opt_.agent_timeout_s * 1e3);
      const int64_t ack_age = a->conn->peer_ack_age_ms();
      if (silent <= limit) {
        a->suspect = false;
        a->acking = false;
      } else if (!a->suspect) {
        // Not yet: if this loop was descheduled, the agent's heartbeats wait
        // in the socket, read by the I/O poll that runs before the next tick.
        a->suspect = true;
      } else if (ack_age >= 0 && ack_age < limit && silent < kAckingGrace * limit) {
        // Its host still acknowledges our heartbeats: the link is up (a flap
        // that has passed, TCP retransmitting after it) or the agent's
        // process is slow. Evict only if the silence goes on.
        if (!a->acking) {
          a->acking = true;
          events_.Write("suspect", "host=" + a->host.name + " silent_ms=" + std::to_string(silent) +
                                       " last_ack_ms=" + std::to_string(ack_age));
        }
      } else {
        HostLost(*a, "lost the agent on host " + a->host.name + " (missed heartbeats: silent for " +
                         std::to_string(silent) + " ms)",
                 silent, /*rejoin=*/true);
      }
    }
  }
  if (decide_deadline_ms_ >= 0 && now >= decide_deadline_ms_) return Decide();
  if (grace_deadline_ms_ >= 0 && now >= grace_deadline_ms_) {
    BeginStop("the stop hook did not finish within " + Fixed(opt_.stop_grace_s, 0) + " s", Status::Ok());
  }
}

std::string Master::WaitingFor() {
  if (state_ != State::kRunning) return "";
  if (decide_deadline_ms_ >= 0) return "deciding: gathering the failures detected within " + std::to_string(kDecideMs) + " ms";
  if (!rec_.active) return "";
  // Ranks by the phase they have yet to finish, in rank order.
  static const char* kTodo[] = {"to start", "to read their generation", "to join their groups and restore",
                                "to complete their first step"};
  std::map<int, std::string> todo;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r].exited || ranks_[r].have_metrics) continue;
    std::string& list = todo[std::min(ranks_[r].phase, 3)];
    list += (list.empty() ? "" : ", ") + std::to_string(r);
    for (const auto& a : agents_) {
      if (std::count(a->ranks.begin(), a->ranks.end(), static_cast<int>(r))) list += " on " + a->host.name;
    }
  }
  std::string s = "recovery to generation " + std::to_string(generation_) + " for " +
                  Fixed((UnixMs() - rec_.detect_unix_ms) / 1e3, 1) + " s";
  for (const auto& [phase, ranks] : todo) s += "; rank(s) " + ranks + " " + kTodo[phase];
  return s;
}

void Master::Progress() {
  if (!new_metrics_) return;
  new_metrics_ = false;
  double loss_sum = 0, tokens = 0;
  int losses = 0;
  for (const auto& r : ranks_) {
    if (!r.have_metrics || r.last.step() != last_step_ || !std::isfinite(r.last.loss())) continue;
    loss_sum += r.last.loss();  // every rank reports the global-batch loss
    tokens += r.last.tokens_per_second();  // and the global throughput
    ++losses;
  }
  OB_LOG(Info) << "step " << last_step_ << "  loss "
               << (losses > 0 ? Fixed(loss_sum / losses, 4) : std::string("-")) << "  tokens/s "
               << (losses > 0 ? Fixed(tokens / losses, 0) : std::string("-"));
}

// A host is gone: its connection is closed and, unless `rejoin`, its rsh
// process killed (an ssh session that ends takes a remote agent, and so its
// workers, with it). A silent or disconnected agent keeps its rsh: cut off
// for a moment, it stops its workers and asks to rejoin (agent.h); cut off
// for longer, it stops on its own after --master-timeout. Either way it may
// come back (Admit) and is added at the next generation.
void Master::HostLost(AgentState& a, const std::string& what, int64_t latency_ms, bool rejoin) {
  if (a.state != AgentState::State::kConnected) return;
  a.state = AgentState::State::kLost;
  if (a.conn) {
    a.conn->SetHandlers(nullptr, nullptr);
    a.conn->Close("lost");
    a.conn.reset();
  }
  if (!a.rsh_done && !rejoin) {
    a.rsh.CloseStdin();
    a.rsh.Kill();
  }
  lost_hosts_.insert(a.host.name);
  lost_since_holding_.insert(a.node);
  Failure(what, a.host.name, latency_ms);
}

void Master::Failure(const std::string& what, const std::string& lost_host, int64_t latency_ms) {
  if (state_ == State::kStopping || state_ == State::kDone) return;
  OB_LOG(Error) << what;
  events_.Write("detect", what);
  if (failures_.empty() && !rec_.active) {
    rec_ = Recovering();
    rec_.detect_unix_ms = UnixMs();
    rec_.detect_latency_ms = latency_ms;
  }
  failures_.push_back(what);
  if (!lost_host.empty()) failed_hosts_.insert(lost_host);
  if (decide_deadline_ms_ < 0) decide_deadline_ms_ = Now() + kDecideMs;
}

// Gathers the facts for DecideRecovery (decision.h) and carries its
// decision out.
RecoveryFacts Master::Facts() {
  RecoveryFacts f;
  f.plan = &loaded_;
  f.current = loaded_.instantiation;
  f.holding = holding_;
  f.snapshots = lineage_.has_steps() && !lineage_.restoring();
  for (const auto& a : agents_) {
    if (a->state == AgentState::State::kConnected) f.live.push_back(a->node);
  }
  f.master_timeout_s = opt_.master_timeout_s;
  if (!opt_.ckpt_dir.empty()) {
    // (blocks the loop while it verifies: every worker restarts anyway)
    f.newest_checkpoint = [this]() -> Result<CheckpointRef> {
      OB_ASSIGN_OR_RETURN(ckpt::Verified v, UsableCheckpoint(opt_.ckpt_dir));
      return CheckpointRef{v.path, static_cast<int64_t>(v.manifest.step())};
    };
  }
  return f;
}

void Master::Decide() {
  decide_deadline_ms_ = -1;
  if (state_ != State::kRunning) return;
  RecoveryFacts f = Facts();
  f.lost.assign(lost_since_holding_.begin(), lost_since_holding_.end());
  for (const auto& h : failed_hosts_) f.lost_names += (f.lost_names.empty() ? "" : ", ") + h;
  f.what = failures_.empty() ? "hosts came back" : failures_.front();
  if (failures_.size() > 1) f.what += " (and " + std::to_string(failures_.size() - 1) + " more)";
  failures_.clear();
  failed_hosts_.clear();
  f.fruitless = ++fruitless_;
  // Hosts lost right after our own stall (the agents' timeout ran out while
  // we could not answer) are not the hosts' fault.
  if (stalled_ms_ > 0 && Now() - stall_seen_ms_ < kStallBlameMs) f.stalled_ms = stalled_ms_;
  stalled_ms_ = 0;
  if (!rec_.active && rec_.detect_unix_ms == 0) rec_.detect_unix_ms = UnixMs();
  const Decision d = DecideRecovery(f);
  if (d.kind != Decision::Kind::kStop) {
    OB_LOG(Warn) << f.what << ": " << d.text;
  }
  Carry(d);
}

void Master::Carry(const Decision& d) {
  if (d.kind == Decision::Kind::kStop) {
    events_.Write("decide", d.text);
    OB_LOG(Error) << d.text;
    return BeginStop(d.text, d.stop);
  }
  if (d.kind == Decision::Kind::kCheckpoint) lineage_.RestoreNext(d.checkpoint);
  loaded_.instantiation = d.next;
  fetches_ = d.fetches;
  idle_ = d.idle;
  plan::SetInstantiation(loaded_.problem, loaded_.templates, loaded_.instantiation, &plan_);
  rec_.active = true;
  rec_.decide_ms = UnixMs() - rec_.detect_unix_ms;
  rec_.reported = 0;
  rec_.process_start_ms = 0;
  rec_.regroup_s = rec_.restore_s = rec_.first_step_s = 0;
  events_.Write("decide", "generation=" + std::to_string(generation_ + 1) + " " + d.text);
  Status st = LaunchGeneration();
  if (!st.ok()) BeginStop(st.message(), Status::TempFail(st.message()));
}

// The first step of each rank of a new generation: when all have reported,
// the recovery is complete and its phases go to events.log.
void Master::OnFirstSteps(const pb::Metrics& m) {
  if (!rec_.active || m.generation() != generation_) return;
  rec_.process_start_ms = std::max(rec_.process_start_ms, m.process_start_unix_ms());
  rec_.restore_s = std::max(rec_.restore_s, m.restore_seconds());
  rec_.regroup_s = std::max(rec_.regroup_s, (m.ready_unix_ms() - m.process_start_unix_ms()) / 1e3 -
                                                m.restore_seconds());
  rec_.first_step_s = std::max(rec_.first_step_s, m.step_seconds());
  rec_.first_step = m.step();
  if (++rec_.reported < static_cast<int>(ranks_.size())) return;
  rec_.active = false;
  auto ms = [](double s) { return std::to_string(static_cast<int64_t>(std::llround(s * 1e3))); };
  const int64_t now = UnixMs();
  const std::string line =
      "generation=" + std::to_string(generation_) + " from_step=" +
      std::to_string(static_cast<int64_t>(rec_.first_step) - 1) +
      " detect_ms=" + std::to_string(rec_.detect_latency_ms) +
      " decide_ms=" + std::to_string(rec_.decide_ms) +
      " teardown_ms=" + std::to_string(std::max<int64_t>(0, rec_.process_start_ms - rec_.started_unix_ms)) +
      " regroup_ms=" + ms(rec_.regroup_s) + " copy_ms=" + ms(rec_.restore_s) +
      " first_step_ms=" + ms(rec_.first_step_s) +
      " total_ms=" + std::to_string(now - rec_.detect_unix_ms);
  events_.Write("recovered", line);
  OB_LOG(Info) << "recovered: " << line;
  rec_ = Recovering();
}

void Master::Publish(const pb::Metrics& m) {
  if (metrics_out_) {
    Status st = metrics_out_->Write(m);
    if (!st.ok()) {
      OB_LOG(Error) << st.message() << "; no more metrics are written";
      metrics_out_.reset();
    }
  }
  if (operator_.watchers() > 0) {
    std::string bytes;
    io::AppendRecord(m, &bytes);
    operator_.Broadcast(bytes);
  }
}

// Every worker back to the latest complete checkpoint, on the same
// instantiation (a diverged loss). "" when under way, else why not: then,
// with no checkpoint at all, the run stops (exit 65: the model diverged).
std::string Master::Rollback(const std::string& reason) {
  if (state_ != State::kRunning) return "the run is not running";
  RecoveryFacts f = Facts();
  f.rollback = reason;
  const Decision d = DecideRecovery(f);
  if (d.kind == Decision::Kind::kStop) {
    Carry(d);
    return d.text;
  }
  OB_LOG(Warn) << d.text;
  rec_ = Recovering();
  rec_.detect_unix_ms = UnixMs();
  Carry(d);
  return "";
}

void Master::OnCheckpointPart(const pb::Metrics& m) {
  const pb::CheckpointPart& c = m.checkpoint();
  if (!commits_) return;
  if (c.error().empty()) {
    commits_->Part(c.step(), m.rank(), ranks_.size());
    return CommitCheckpoints();
  }
  CheckpointFailed(static_cast<int64_t>(c.step()), "rank " + std::to_string(m.rank()) + ": " + c.error());
  if (commits_->Failed(c.step())) {
    events_.Write("checkpoint-failed", "step=" + std::to_string(c.step()) + " rank=" +
                                           std::to_string(m.rank()) + " " + c.error());
    OB_LOG(Error) << "checkpoint of step " << c.step() << " failed on rank " << m.rank() << ": "
                  << c.error() << " (training goes on)";
  }
}

void Master::CommitCheckpoints(bool wait) {
  if (!commits_) return;
  auto base = [this](int64_t step) {
    pb::Manifest m;
    m.set_format_version(io::kManifestFormatVersion);
    m.set_step(static_cast<uint64_t>(step));
    *m.mutable_model() = plan_.model();
    m.set_data_seed(opt_.seed);
    m.set_samples_seen(static_cast<uint64_t>(step + 1) * plan_.global_batch());
    m.set_created_unix_ms(UnixMs());
    m.set_plan(plan_.SerializeAsString());
    *m.mutable_job() = job_;
    return m;
  };
  const std::optional<CommitQueue::Outcome> done = commits_->Poll(base, wait);
  if (!done) return;
  const std::string step = std::to_string(done->step);
  if (done->manifest.ok()) {
    ckpt_good_step_ = std::max(ckpt_good_step_, done->step);
    uint64_t bytes = 0;
    for (const auto& f : done->manifest->files()) bytes += f.size();
    events_.Write("checkpoint", "step=" + step + " files=" +
                                    std::to_string(done->manifest->files_size()) +
                                    " bytes=" + std::to_string(bytes) +
                                    " commit_ms=" + std::to_string(done->commit_ms));
    OB_LOG(Info) << "checkpoint of step " << step << " committed (" << (bytes >> 20) << " MiB)";
  } else {
    CheckpointFailed(done->step, done->manifest.status().message());
    events_.Write("checkpoint-failed", "step=" + step + " " + done->manifest.status().message());
    OB_LOG(Error) << "checkpoint of step " << step << ": " << done->manifest.status().message()
                  << " (training goes on)";
  }
}

void Master::RequestStop(const std::string& reason) {
  if (state_ == State::kStopping || state_ == State::kDone) return;
  events_.Write("stop-request", reason);
  if (stop_requested_ || state_ != State::kRunning || !opt_.on_stop_request) {
    return BeginStop(reason, Status::Ok());
  }
  stop_requested_ = true;
  OB_LOG(Info) << reason << ": finishing the step before stopping (again to stop now)";
  grace_deadline_ms_ = Now() + static_cast<int64_t>(opt_.stop_grace_s * 1e3);
  opt_.on_stop_request(reason, [this, reason] { BeginStop(reason, Status::Ok()); });
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
    if (steps_done_ > 0 && step_seconds_sum_ > 0) {
      OB_LOG(Info) << "trained " << steps_done_ << " steps: final loss " << Fixed(last_loss_, 4)
                   << ", " << Fixed(tokens_sum_ / step_seconds_sum_, 0) << " tokens/s";
    }
  }
  events_.Write("stop", reason);
  pb::Control m;
  m.mutable_stop()->set_reason(reason);
  for (auto& a : agents_) {
    if (a->conn && a->state == AgentState::State::kConnected) {
      a->conn->Send(m);
    } else {
      a->rsh.CloseStdin();  // not connected: end of file is how it learns
    }
  }
  server_.Close();
}

void Master::FinishStop() {
  if (state_ == State::kDone) return;
  state_ = State::kDone;
  for (auto& a : agents_) {
    a->rsh.CloseStdin();
    if (a->conn) {
      a->conn->SetHandlers(nullptr, nullptr);
      a->conn->Close("run over");
    }
  }
  server_.Close();
  operator_.Close();
  for (uv_handle_t* h : {reinterpret_cast<uv_handle_t*>(&tick_), reinterpret_cast<uv_handle_t*>(&heartbeat_),
                         reinterpret_cast<uv_handle_t*>(&progress_), reinterpret_cast<uv_handle_t*>(&sigchld_),
                         reinterpret_cast<uv_handle_t*>(&sigterm_), reinterpret_cast<uv_handle_t*>(&sigint_)}) {
    if (h->loop == &loop_ && !uv_is_closing(h)) uv_close(h, nullptr);
  }
  if (drain_.loop == &loop_) {
    uv_timer_start(&drain_, [](uv_timer_t* t) { uv_stop(t->loop); }, kDrainMs, 0);
    uv_unref(reinterpret_cast<uv_handle_t*>(&drain_));
  }
}

pb::OperatorResponse Master::OnOperator(const pb::OperatorRequest& req) {
  pb::OperatorResponse r;
  r.set_ok(true);
  switch (req.command()) {
    case pb::OPERATOR_STOP:
      RequestStop(req.reason());
      break;
    case pb::OPERATOR_STATUS:
      break;
    case pb::OPERATOR_CHECKPOINT_NOW: {
      // Every worker saves after step K, a step none has reached yet
      // (workers are at most one step apart).
      if (opt_.ckpt_dir.empty()) {
        r.set_ok(false);
        r.set_error("no --ckpt-dir: nowhere to save");
        return r;
      }
      const int64_t k = static_cast<int64_t>(last_step_) + 2;
      if (opt_.steps > 0 && k > opt_.steps - 1) {
        r.set_ok(false);
        r.set_error("too late: the run ends at step " + std::to_string(opt_.steps - 1) +
                    ", before step " + std::to_string(k) + ", the first no worker may have begun");
        return r;
      }
      Status st = store_.Set(CheckpointNowKey(generation_), std::to_string(k));
      if (!st.ok()) {
        r.set_ok(false);
        r.set_error(st.message());
        return r;
      }
      events_.Write("checkpoint-request", "step=" + std::to_string(k) + " " + req.reason());
      break;
    }
    case pb::OPERATOR_EXCLUDE_HOST:
    case pb::OPERATOR_DRAIN: {
      // Both take the host out now: the survivors resume from the last step
      // every one of them completed, so nothing is lost by not waiting.
      AgentState* a = FindAgent(req.host());
      if (a == nullptr || a->state != AgentState::State::kConnected || state_ != State::kRunning) {
        r.set_ok(false);
        r.set_error(a == nullptr ? "no host '" + req.host() + "' in this run"
                                 : "host '" + req.host() + "' is not running workers");
        return r;
      }
      std::string reason = req.reason();
      if (req.slowdown() > 0) {
        // A slow host, not a failed one: out only if the plan runs faster
        // without it than with it at that speed.
        if (decide_deadline_ms_ >= 0 || rec_.active) {
          r.set_ok(false);
          r.set_error("kept " + req.host() + ": a recovery is in progress");
          return r;
        }
        const plan::Exclusion x =
            plan::WeighExclusion(loaded_.problem, loaded_.templates, loaded_.instantiation,
                                 a->node, req.slowdown(), LiveIdle());
        if (!x.pays) {
          events_.Write("keep", "host=" + req.host() + " " + x.reason + "; " + reason);
          OB_LOG(Warn) << "kept slow host " << req.host() << ": " << x.reason;
          r.set_ok(false);
          r.set_error("kept " + req.host() + ": " + x.reason);
          return r;
        }
        reason += " (" + x.reason + ")";
      }
      const char* verb = req.command() == pb::OPERATOR_DRAIN ? "drained" : "excluded";
      events_.Write("exclude", "host=" + req.host() + " " + reason);
      HostLost(*a, std::string("host ") + req.host() + " " + verb + ": " + reason, 0);
      break;
    }
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
  r.set_step(last_step_);
  r.set_world_size(static_cast<uint32_t>(ranks_.size()));
  r.set_workers_running(static_cast<uint32_t>(state_ == State::kRunning ? ranks_.size() - ranks_done_ : 0));
  r.set_uptime_seconds((Now() - start_ms_) / 1e3);
  r.set_waiting_for(WaitingFor());
  static const char* kAgentStates[] = {"starting", "connected", "lost", "stopped"};
  for (auto& a : agents_) {
    auto* h = r.add_hosts();
    h->set_host(a->host.name);
    h->set_state(kAgentStates[static_cast<int>(a->state)]);
    for (int x : a->ranks) h->add_ranks(static_cast<uint32_t>(x));
    h->set_last_heard_ms_ago(a->conn ? Now() - a->conn->last_receive_ms() : -1);
  }
  return r;
}

}  // namespace

Result<int> RunMaster(const MasterOptions& options) {
  Master master(options);
  return master.Run();
}

}  // namespace ob::launch
