// The master's life (design: launch): it prepares (hosts, plan, run
// directory, checkpoints), listens, starts the agents, runs its loop until
// the run stops, and says how it ended. Its other parts: master_agents.cc
// (the agents' connections and messages), master_generations.cc (workers'
// generations, failures and recoveries), master_stop.cc (stopping, saving).
#include "ob/launch/master/master_impl.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <utility>

#include "ob/clock.h"
#include "ob/cluster/slurm.h"
#include "ob/io/file.h"
#include "ob/io/text.h"
#include "ob/launch/wire/store_keys.h"
#include "ob/log.h"
#include "ob/runtime/topology.h"

namespace ob::launch {

namespace {

using io::Fixed;

std::string FormatTime(int64_t unix_ms, const char* fmt) {
  time_t s = static_cast<time_t>(unix_ms / 1000);
  struct tm tm {};
  gmtime_r(&s, &tm);
  char buf[64];
  strftime(buf, sizeof buf, fmt, &tm);
  return buf;
}

}  // namespace

namespace detail {

Status Master::Prepare() {
  const bool standby = !opt_.standby_of.empty();
  if (standby) {
    secret_ = opt_.secret;
  } else {
    OB_ASSIGN_OR_RETURN(secret_, ReadSecret(opt_.secret_file));
  }
  ::unsetenv("OB_SECRET");  // agents and workers get it on stdin or not at all
  if (opt_.rsh == "slurm" && (std::getenv("SLURM_JOB_ID") == nullptr || *std::getenv("SLURM_JOB_ID") == '\0')) {
    return Status::Usage("--rsh slurm starts agents as steps of a Slurm job, and SLURM_JOB_ID is not set: run "
                         "ob-launch inside sbatch or salloc");
  }
  OB_ASSIGN_OR_RETURN(hosts_, LoadLaunchHosts(opt_.hosts_path));
  plan_ = opt_.plan;
  const pb::Plan& plan = plan_;
  hosts_name_ = opt_.hosts_path.empty() ? "the Slurm node list" : opt_.hosts_path;
  auto loaded = plan::FromProto(plan);
  if (!loaded.ok()) return loaded.status().WithContext(io::DisplayName(opt_.plan_path));
  loaded_ = std::move(loaded).value();
  // A plan the workers cannot run is refused here, before any host starts.
  if (loaded_.problem.shards > 1) {
    return Status::Config(io::DisplayName(opt_.plan_path) + ": the plan shards the optimizer state in " +
                          std::to_string(loaded_.problem.shards) +
                          " (ob-plan --shard-optimizer), which ob-launch does not run yet (issue 69): plan with "
                          "--shard-optimizer off");
  }
  OB_RETURN_IF_ERROR(runtime::CheckRunnable(loaded_.templates, loaded_.instantiation,
                                            loaded_.problem.microbatch_size,
                                            model::GptConfig::FromProto(plan.model()))
                         .WithContext(io::DisplayName(opt_.plan_path)));
  // Then where its ranks go (a stage's tensor-parallel ranks count
  // against its host's slots).
  Result<LaunchLayout> layout = LayOut(plan, hosts_, hosts_name_);
  if (!layout.ok()) return layout.status().WithContext(io::DisplayName(opt_.plan_path));
  layout_ = std::move(layout).value();
  holding_ = loaded_.instantiation;
  ranks_.resize(layout_.ranks.size());
  {
    HangOptions h;
    h.timeout_ms = static_cast<int64_t>(opt_.hang_timeout_s * 1e3);
    h.first_step_timeout_ms = std::max<int64_t>(30000, 10 * h.timeout_ms);
    hang_ = HangWatch(h);
  }
  if (standby) {  // where this host meets the master (main.cc); never the master's --bind
    bind_addr_ = opt_.bind;
    bind_port_ = 0;
  } else if (opt_.bind == "auto") {
    OB_ASSIGN_OR_RETURN(bind_addr_, AutoBindAddress(hosts_, opt_.rsh));
    bind_port_ = 0;
  } else {
    OB_RETURN_IF_ERROR(ParseBind(opt_.bind, &bind_addr_, &bind_port_));
  }
  // The run directory is ours alone: a second master there would delete
  // our control socket and interleave its events.log with ours.
  run_dir_ = opt_.run_dir.empty() ? "ob-run-" + FormatTime(UnixMs(), "%Y%m%d-%H%M%S") : opt_.run_dir;
  // Only the job's user enters it: its logs name hosts and carry the
  // losses, its control socket steers the run.
  OB_RETURN_IF_ERROR(io::MakeDirs(run_dir_, "run directory", 0700));
  OB_RETURN_IF_ERROR(io::CheckOwnDirectory(run_dir_, "run directory (--run-dir)"));
  OB_ASSIGN_OR_RETURN(run_lock_, io::DirLock::Acquire(run_dir_, "ob-launch, run directory " + run_dir_));
  OB_RETURN_IF_ERROR(events_.Open(run_dir_ + "/events.log"));
  // The run's id (Metrics.run): 16 hex digits, so that two runs, on one
  // host or many, never share one.
  OB_ASSIGN_OR_RETURN(run_id_, io::RandomHex(8));
  if (standby) {  // its checkpoints and --metrics wait for a takeover (master_follow.cc)
    events_.Write("standby-master", "host=" + opt_.standby_host + " pid=" + std::to_string(::getpid()) +
                                        " of " + opt_.standby_of);
    OB_RETURN_IF_ERROR(metrics_.Open(run_dir_ + "/metrics.pb"));
    metrics_.set_total_steps(opt_.steps);
    if (opt_.log_to_run_dir && !log::SetFile(run_dir_ + "/master.log")) {
      return Status::IoErr(run_dir_ + "/master.log: cannot open");
    }
    if (!opt_.worker_command) return Status::Internal("no worker command");
    return Status::Ok();
  }
  events_.Write("run", "id=" + run_id_ + " pid=" + std::to_string(::getpid()));
  metrics_.set_run(run_id_);
  OB_RETURN_IF_ERROR(ckpt_.Open({opt_.ckpt_dir, opt_.ckpt_keep, opt_.resume, opt_.resume_from_other, opt_.steps,
                                 opt_.seed, opt_.data, opt_.data_sum, opt_.eval_split,
                                 "ob-launch, run directory " + run_dir_, opt_.optimizer,
                                 /*predecessor_may_hold=*/false},
                                &plan_, loaded_.problem.num_layers(), &events_));
  if (ckpt_.trained()) return Status::Ok();  // Run says so; no host, no --metrics file
  ckpt_.set_unchecked([this] { return CopiesOfData(false); });
  if (!ckpt_.resume().path.empty()) lineage_.RestoreNext(ckpt_.resume());
  for (const std::string& change : ckpt_.optimizer_changes()) {
    events_.Write("resume-change", change);
    OB_LOG(Warn) << "resuming with another optimizer setting than the checkpoint's: " << change;
  }
  if (!opt_.worker_command) return Status::Internal("no worker command");

  OB_RETURN_IF_ERROR(metrics_.Open(opt_.metrics));
  metrics_.set_total_steps(opt_.steps);
  if (opt_.log_to_run_dir && !log::SetFile(run_dir_ + "/master.log")) {
    return Status::IoErr(run_dir_ + "/master.log: cannot open");
  }
  if (opt_.rsh == "slurm") {
    // By default Slurm ends the whole job once a node of it stops
    // answering: a node failure would undo every recovery ob makes.
    const std::string job = std::getenv("SLURM_JOB_ID");
    const cluster::NodeFailPolicy p = cluster::ReadNodeFailPolicy(job);
    if (p.kind != cluster::NodeFailPolicy::Kind::kKeepsJob) {
      OB_LOG(Warn) << cluster::NodeFailWarning(p, job);
    }
  }
  return Status::Ok();
}

Result<int> Master::Run() {
  OB_RETURN_IF_ERROR(Prepare());
  if (ckpt_.trained()) {
    const std::string line = "--resume auto: " + ckpt_.resume().path + " is of step " +
                             std::to_string(ckpt_.resume().step) + ", the last of --steps " +
                             std::to_string(opt_.steps) + ": the job is trained; nothing to do";
    OB_LOG(Info) << line;
    events_.Write("done", "exit 0: " + line);
    return 0;
  }
  InstallSignals();
  Server::Options so;
  so.bind = bind_addr_;
  so.port = bind_port_;
  so.secret = secret_;
  OB_RETURN_IF_ERROR(server_.Listen(
      so, [this](const pb::Hello& h) { return Admit(h); },
      [this](std::shared_ptr<Connection> c, const pb::Hello& h) { OnAgentReady(std::move(c), h); }));
  OB_LOG(Info) << "control channel on " << bind_addr_ << ":" << server_.port() << "; run " << run_id_
               << ", run directory " << run_dir_;
  events_.Write("listen", bind_addr_ + ":" + std::to_string(server_.port()));
  Status op = operator_.Listen(run_dir_ + "/control.sock",
                               [this](const pb::OperatorRequest& r) { return OnOperator(r); });
  if (!op.ok()) {
    OB_LOG(Warn) << "no control socket: " << op.message();
  }

  start_ms_ = Now();
  if (!opt_.standby_of.empty()) {  // the standby: the master's agents, adopted at a takeover
    AgentPool::Options ao;
    ao.rsh = opt_.rsh;
    ao.master_timeout_s = opt_.master_timeout_s;
    ao.agent_timeout_s = opt_.agent_timeout_s;
    agents_.Adopt(ao, layout_.hosts, layout_.host_ranks);
    state_ = State::kFollowing;
    Follow();
  } else {
    OB_RETURN_IF_ERROR(StartAgents());
    master_host_ = ChooseMasterHost();
    // A takeover needs a majority of the hosts: with two, the survivor
    // alone is none.
    standby_wanted_ = opt_.standby_master != "off" && (opt_.standby_master != "auto" || hosts_.size() >= 3);
    store_.OnChange([this](const std::string& key, const std::string* value) {
      if (!standby_.conn || !standby_synced_) return;  // it gets the whole store when it connects
      pb::StoreEntry& e = *delta_.add_store();
      e.set_key(key);
      if (value == nullptr) {
        e.set_erased(true);
      } else {
        e.set_value(*value);
      }
    });
    events_.OnLine([this](const std::string& line) {
      if (standby_.conn && standby_synced_) delta_.add_events(line);
    });
    if (standby_wanted_) StartStandby();
  }
  uv_timer_init(&loop_, &tick_);
  uv_timer_init(&loop_, &heartbeat_);
  uv_timer_init(&loop_, &progress_);
  uv_timer_init(&loop_, &drain_);
  uv_timer_start(&tick_, [](uv_timer_t* t) { static_cast<Master*>(t->loop->data)->Tick(); },
                 kTickMs, kTickMs);
  uv_timer_start(&heartbeat_, [](uv_timer_t* t) {
    auto* m = static_cast<Master*>(t->loop->data);
    m->agents_.Beat();
    pb::Control hb;  // the standby and its master hear each other too
    hb.mutable_heartbeat()->set_unix_ms(UnixMs());
    if (m->standby_.conn) m->standby_.conn->Send(hb);
    if (m->leader_) m->leader_->Send(hb);
  }, kHeartbeatMs, kHeartbeatMs);
  uv_timer_start(&progress_, [](uv_timer_t* t) { static_cast<Master*>(t->loop->data)->Progress(); },
                 kProgressMs, kProgressMs);
  uv_run(&loop_, UV_RUN_DEFAULT);
  if (state_ != State::kDone) FinishStop();
  Conclude();
  events_.Write("done", outcome_.ok() ? "exit 0" : "exit " + std::to_string(outcome_.exit_code()));
  if (const std::string lost = events_.lost(); !lost.empty()) {
    OB_LOG(Warn) << lost;
  }
  // A run that outlived its batch host under Slurm: the batch step is gone
  // with that host and would hold the allocation; the job ends here.
  if (takeover_ms_ >= 0 && opt_.rsh == "slurm") {
    const char* job = std::getenv("SLURM_JOB_ID");
    if (job != nullptr && *job != '\0') {
      OB_LOG(Info) << "the batch host is gone: ending job " << job << " (scancel); the run ended with exit "
                   << (outcome_.ok() ? 0 : outcome_.exit_code());
      if (!cluster::EndJob(job)) {
        OB_LOG(Warn) << "scancel " << job << " failed: the job may hold its nodes";
      }
    }
  }
  if (!outcome_.ok()) return outcome_;
  return 0;
}

// SIGCHLD reaps agents; SIGTERM, SIGINT, SIGUSR1 and SIGHUP stop the run.
void Master::InstallSignals() {
  ::signal(SIGPIPE, SIG_IGN);  // a dead agent's stdin must not kill us
  uv_signal_init(&loop_, &sigchld_);
  uv_signal_start(&sigchld_, [](uv_signal_t* s, int) {
    static_cast<Master*>(s->loop->data)->ReapAgents();
  }, SIGCHLD);
  // SIGHUP (the terminal or ssh session that started us is gone) stops as
  // SIGTERM does, saving with --ckpt-dir (it killed the master, the steps
  // since the last checkpoint lost); unless it was ignored when we started
  // (nohup): a run told to outlive its terminal does.
  struct sigaction hup {};
  const bool hup_ignored = ::sigaction(SIGHUP, nullptr, &hup) == 0 && hup.sa_handler == SIG_IGN;
  for (auto [h, sig] : {std::pair{&sigterm_, SIGTERM}, {&sigint_, SIGINT}, {&sigusr1_, SIGUSR1}, {&sighup_, SIGHUP}}) {
    if (sig == SIGHUP && hup_ignored) continue;
    uv_signal_init(&loop_, h);
    uv_signal_start(h, [](uv_signal_t* s, int signum) {
      static_cast<Master*>(s->loop->data)->RequestStop(std::string("got ") + strsignal(signum));
    }, sig);
  }
}

// The verdict on the work kept, once the loop has ended: checkpoints
// committed, refuted or missing, and a loss that went bad, each turn an
// outcome of success into a failure.
void Master::Conclude() {
  ckpt_.Finish();  // the last commits, before we exit
  // Checkpoints trained on a host's copy of the data while it was compared,
  // which then differed, must not be resumed from (they are kept).
  if (const std::vector<int64_t> refuted = ckpt_.RefuteTrainedOn(CopiesOfData(true)); !refuted.empty()) {
    std::vector<std::string> steps;
    for (int64_t st : refuted) steps.push_back(std::to_string(st));
    OB_LOG(Error) << "refuted the checkpoint" << (steps.size() == 1 ? " of step " : "s of steps ")
                  << io::NameSome(steps, 8) << " in " << opt_.ckpt_dir
                  << ": they trained on a host's copy of --data whose bytes are not the job's (REFUTED in each; "
                     "--resume auto passes over them)";
  }
  if (outcome_.ok() && !ckpt_.Verdict().ok()) {
    outcome_ = ckpt_.Verdict();
    OB_LOG(Error) << outcome_.message();
  }
  // With --ckpt-dir the workers save their last step: a run that trained
  // to the end (every worker exited 0) without that checkpoint committed
  // has not kept what it trained. (A stop keeps its own checkpoint's step.)
  if (outcome_.ok() && ckpt_.enabled() && !ranks_.empty() && ranks_done_ == static_cast<int>(ranks_.size())) {
    if (const std::string lost = Unsaved(); !lost.empty()) {
      outcome_ = Status::IoErr("the run ended without its last checkpoint: " + lost + " (--ckpt-dir " + opt_.ckpt_dir + ")");
      OB_LOG(Error) << outcome_.message();
    }
  }
  if (outcome_.ok() && !metrics_.LossVerdict().ok()) {  // never report success for unusable weights
    outcome_ = metrics_.LossVerdict();
    OB_LOG(Error) << outcome_.message();
  }
}

void Master::Tick() {
  if (state_ == State::kFollowing) return FollowTick();
  const int64_t now = Now();
  const int64_t stall = grace_.Tick(now);  // 0 unless we did not run for StallGrace::kStallMs
  if (state_ == State::kRunning && grace_.gap_ms() > static_cast<int64_t>(opt_.master_timeout_s * 1e3)) {
    stalled_ms_ = grace_.gap_ms();
    stall_seen_ms_ = now;
    const std::string msg = "the master itself did not run for " + std::to_string(stalled_ms_) +
                            " ms (stopped, or starved of CPU), longer than --master-timeout " +
                            Fixed(opt_.master_timeout_s, 1) + " s";
    events_.Write("detect", msg);
    OB_LOG(Error) << msg;
  } else if (stall > 0 && !grace_.MayJudge(now) && state_ == State::kRunning) {
    events_.Write("stall", "the master did not run for " + std::to_string(stall) + " ms; hearing everyone out for " +
                               std::to_string(StallGrace::kGraceMs) + " ms before it judges silence");
  }
  ReapAgents();
  CheckStandby();
  store_.Sweep(now);  // held GET/WAIT requests past their deadline
  if (std::optional<std::string> data = store_.Get(InputKey("--data"))) {  // for the manifests
    ckpt_.LearnDataFingerprint(data->substr(0, data->find('\n')));
  }
  if (std::optional<std::string> sum = store_.Get(InputSumKey("--data"))) {
    ckpt_.LearnDataSum(sum->substr(0, sum->find('\n')));
  }
  ckpt_.Poll();
  if (state_ == State::kStopping) {
    if (agents_.AllExited()) return FinishStop();
    if (now >= stop_deadline_ms_) {
      agents_.KillRemaining();
      FinishStop();
    }
    return;
  }
  CheckFailedStarts();  // the last agent still starting may have connected since
  if (state_ == State::kStarting && now - start_ms_ > static_cast<int64_t>(opt_.start_timeout_s * 1e3)) {
    std::string msg = "no agent authenticated within " + Fixed(opt_.start_timeout_s, 0) +
                      " s on host(s) " + agents_.Starting(kHostsNamed);
    if (!failed_starts_.empty()) msg += "; exited: " + FailedStartsText();
    events_.Write("detect", msg);
    OB_LOG(Error) << msg;
    return BeginStop(msg, Status::Unavailable(msg));
  }
  if (state_ == State::kRunning && grace_.MayJudge(now)) {
    for (const AgentPool::Loss& x : agents_.Judge(now)) HostLost(*x.agent, x.what, x.silent_ms, Lost::kCutOff);
    if (decide_deadline_ms_ < 0) CheckPartition();
    if (decide_deadline_ms_ < 0) CheckHang();
  } else {
    hang_suspect_ = false;
  }
  if (Fenced()) return;
  if (decide_deadline_ms_ >= 0 && now >= decide_deadline_ms_) return Decide();
  CheckStopCheckpoint(now);
}

void Master::Progress() {
  if (state_ == State::kFollowing) return;
  const std::string line = metrics_.Progress();
  if (!line.empty()) {
    OB_LOG(Info) << line;
  }
}

}  // namespace detail

Result<int> RunMaster(const MasterOptions& options) {
  detail::Master master(options);
  return master.Run();
}

}  // namespace ob::launch
