#include "ob/launch/master_impl.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <optional>
#include <utility>

#include "ob/clock.h"
#include "ob/cluster/slurm.h"
#include "ob/io/file.h"
#include "ob/io/text.h"
#include "ob/launch/agent.h"
#include "ob/launch/devices.h"
#include "ob/launch/store_keys.h"
#include "ob/launch/store_relay.h"
#include "ob/model/data.h"
#include "ob/log.h"
#include "ob/runtime/topology.h"

namespace ob::launch {
namespace {

using io::Fixed;
using io::NameSome;

std::string FormatTime(int64_t unix_ms, const char* fmt) {
  time_t s = static_cast<time_t>(unix_ms / 1000);
  struct tm tm {};
  gmtime_r(&s, &tm);
  char buf[64];
  strftime(buf, sizeof buf, fmt, &tm);
  return buf;
}

// The most GPU memory a stage of any of the plan's templates needs (what
// a host may be given after a recovery).
uint64_t LargestStageBytes(const pb::Plan& plan) {
  uint64_t most = 0;
  for (const auto& t : plan.templates()) {
    for (const auto& s : t.stages()) most = std::max(most, s.memory_bytes());
  }
  return most;
}

}  // namespace

namespace detail {

Status Master::Prepare() {
  OB_ASSIGN_OR_RETURN(secret_, ReadSecret(opt_.secret_file));
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
  if (opt_.bind == "auto") {
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
  events_.Write("run", "id=" + run_id_ + " pid=" + std::to_string(::getpid()));
  metrics_.set_run(run_id_);
  OB_RETURN_IF_ERROR(ckpt_.Open({opt_.ckpt_dir, opt_.ckpt_keep, opt_.resume, opt_.resume_from_other, opt_.steps,
                                 opt_.seed, opt_.data, opt_.data_sum, opt_.eval_split,
                                 "ob-launch, run directory " + run_dir_, opt_.optimizer},
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
    if (p.kind != cluster::NodeFailPolicy::Kind::kKeepsJob) OB_LOG(Warn) << cluster::NodeFailWarning(p, job);
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
  OB_RETURN_IF_ERROR(StartAgents());
  uv_timer_init(&loop_, &tick_);
  uv_timer_init(&loop_, &heartbeat_);
  uv_timer_init(&loop_, &progress_);
  uv_timer_init(&loop_, &drain_);
  uv_timer_start(&tick_, [](uv_timer_t* t) { static_cast<Master*>(t->loop->data)->Tick(); },
                 kTickMs, kTickMs);
  uv_timer_start(&heartbeat_, [](uv_timer_t* t) { static_cast<Master*>(t->loop->data)->agents_.Beat(); },
                 kHeartbeatMs, kHeartbeatMs);
  uv_timer_start(&progress_, [](uv_timer_t* t) { static_cast<Master*>(t->loop->data)->Progress(); },
                 kProgressMs, kProgressMs);
  uv_run(&loop_, UV_RUN_DEFAULT);
  if (state_ != State::kDone) FinishStop();
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
  events_.Write("done", outcome_.ok() ? "exit 0" : "exit " + std::to_string(outcome_.exit_code()));
  if (const std::string lost = events_.lost(); !lost.empty()) {
    OB_LOG(Warn) << lost;
  }
  if (!outcome_.ok()) return outcome_;
  return 0;
}

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
  AgentState* a = agents_.Find(hello.host());
  if (a == nullptr) return "unknown host '" + hello.host() + "'";
  if (!a->excluded.empty()) return "host '" + hello.host() + "' was excluded: " + a->excluded;
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
  AgentState* a = agents_.Find(hello.host());
  const bool rejoin = a != nullptr && state_ == State::kRunning && a->state == AgentState::State::kLost;
  if (a == nullptr || (state_ != State::kStarting && !rejoin)) {
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
  events_.Write(rejoin ? "agent-rejoined" : "agent-connected",
                "host=" + a->host.name + " peer=" + a->conn->peer() + " after_ms=" + std::to_string(ms));
  if (rejoin) {  // added at the next generation, decided with anything else pending
    lost_hosts_.erase(a->host.name);
    if (decide_deadline_ms_ < 0) decide_deadline_ms_ = Now() + kDecideMs;
    return;
  }
  if (agents_.AllConnected()) StartWorkers();
}

void Master::StartWorkers() {
  std::vector<MachineOf> machines;
  for (const auto& a : agents_.all()) {
    machines.push_back(
        {a->host.name, a->boot_id, a->gpus, a->host.slots, a->device, a->build, a->gpu_memory, a->gpu_names});
  }
  if (Status one = CheckOneBuild(machines, opt_.build); !one.ok()) return BeginStop(one.message(), one);
  if (Status one = CheckOneDevice(machines); !one.ok()) return BeginStop(one.message(), one);
  // Every stage the plan may put on a host fits its GPUs: else each
  // generation would run out of memory at its first step.
  if (Status one = CheckGpuMemory(machines, LargestStageBytes(plan_), plan_.gpu_memory_bytes()); !one.ok()) {
    return BeginStop(one.message(), one);
  }
  // Hosts that are one machine (a name listed twice under two spellings,
  // containers of one node): workers sharing a GPU would fail in NCCL or
  // run out of its memory, so that is refused; the rest is said. Every
  // --rsh local host is this machine, by design.
  if (opt_.rsh != "local") {
    Result<std::vector<std::string>> said = CheckMachines(machines);
    if (!said.ok()) return BeginStop(said.status().message(), said.status());
    for (const std::string& w : *said) {
      OB_LOG(Warn) << w;
      events_.Write("one-machine", w);
    }
  }
  // The files the job reads, as this machine reads them, or, for --data
  // it cannot read, as the checkpoint resumed from recorded it (inputs.h):
  // every worker compares its own fingerprint, and its sum over every byte
  // where it read its copy whole. Store key -> (value, whose reading).
  std::vector<std::pair<std::string, std::pair<std::string, std::string>>> inputs = {
      {InputKey("--data"), ckpt_.ExpectedData()}, {InputSumKey("--data"), ckpt_.ExpectedDataSum()}};
  if (!opt_.eval_data.empty() && opt_.eval_data != "synthetic") {
    inputs.push_back({InputKey("--eval-data"), {model::DataFingerprint(opt_.eval_data), "the master"}});
    inputs.push_back({InputSumKey("--eval-data"), {opt_.eval_data_sum, "the master"}});
  }
  // And which file on this machine it read whole (a worker reading that
  // very file has nothing to compare).
  if (!opt_.data_sum.empty() && !opt_.data_identity.empty()) {
    if (Status st = store_.Set(InputFileKey("--data"), InputFileValue(BootId(), opt_.data_identity)); !st.ok()) {
      return BeginStop(st.message(), st);
    }
  }
  for (const auto& [key, expected] : inputs) {
    if (expected.first.empty()) continue;
    Status st = store_.Set(key, InputValue(expected.first, expected.second));
    if (!st.ok()) return BeginStop(st.message(), st);
  }
  // And the checkpoint directory, as its lock file says (inputs.h).
  if (!ckpt_.lock_line().empty()) {
    if (Status st = store_.Set(CheckpointDirKey(), ckpt_.lock_line()); !st.ok()) return BeginStop(st.message(), st);
  }
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
  // What each stage of this instantiation is predicted to hold, in its
  // template's recomputation mode (a smaller template may recompute more).
  events_.Write("memory", "generation=" + std::to_string(generation_) + " " +
                              plan::MemoryCheckText(loaded_.problem, loaded_.templates, loaded_.instantiation));
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
    if (Result<pb::Manifest> m = ckpt::LoadManifest(source.checkpoint()); m.ok()) {
      for (const pb::UncheckedCopy& u : m->unchecked()) {
        const bool known = std::any_of(inherited_unchecked_.begin(), inherited_unchecked_.end(),
                                       [&](const pb::UncheckedCopy& x) { return SameCopy(x, u); });
        if (!known) inherited_unchecked_.push_back(u);
      }
    }
  }
  ranks_.assign(layout_.ranks.size(), RankState{});
  hang_.Reset(layout_.ranks.size(), /*recovery=*/generation_ > 1);
  hang_suspect_ = false;
  metrics_.NewGeneration();
  ranks_reported_ = 0;
  ranks_done_ = 0;
  ckpt_.NewGeneration();
  const int world = static_cast<int>(layout_.ranks.size());
  for (size_t i = 0; i < agents_.all().size(); ++i) agents_.all()[i]->ranks = layout_.host_ranks[i];
  const std::vector<pb::PeerHost> peers = agents_.Peers();
  for (auto& x : agents_.all()) {
    AgentState& a = *x;
    a.unreachable.clear();
    if (a.state != AgentState::State::kConnected || !a.conn) continue;
    pb::Control m;
    auto* sw = m.mutable_start_workers();
    sw->set_generation(generation_);
    for (const auto& p : peers) {
      if (p.host() != a.host.name) *sw->add_peers() = p;
    }
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
  rec_.Started();
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
  if (m.has_heartbeat()) {
    a.unreachable.assign(m.heartbeat().unreachable().begin(), m.heartbeat().unreachable().end());
    if (m.heartbeat().unix_ms() > 0) a.clock_offset_ms = UnixMs() - m.heartbeat().unix_ms();
    return;
  }
  if (m.has_worker_metrics()) {
    const pb::Metrics& mx = m.worker_metrics().metrics();
    metrics_.Publish(mx);
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
    return;
  }
  if (m.has_refusal()) {
    const pb::Refusal& r = m.refusal();
    if (r.generation() != generation_) return;
    const std::string msg = "host " + a.host.name + " refused generation " + std::to_string(r.generation()) +
                            ": " + log::Printable(r.reason(), 512);
    events_.Write("refused", msg);
    OB_LOG(Error) << msg;
    const int code = r.exit_code() > 0 ? r.exit_code() : static_cast<int>(Code::kConfig);
    return BeginStop(msg, Status(static_cast<Code>(code), msg));
  }
  if (m.has_worker_exited()) {
    const pb::WorkerExited& x = m.worker_exited();
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

void Master::Tick() {
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
  if (decide_deadline_ms_ >= 0 && now >= decide_deadline_ms_) return Decide();
  CheckStopCheckpoint(now);
}

void Master::Progress() {
  const std::string line = metrics_.Progress();
  if (!line.empty()) {
    OB_LOG(Info) << line;
  }
}

// Hosts that report peers they cannot reach (peer_probe.h): the side that
// cannot reach the majority is excluded (decision.h), for good (its agent
// would rejoin into the same partition).
void Master::CheckPartition() {
  const CutReports reported = agents_.Cuts();
  if (reported.partial.empty() && reported.whole.empty()) partition_said_.clear();
  const std::optional<std::set<std::pair<int, int>>> settled = cut_settle_.Update(reported, Now());
  if (!settled) return;
  const std::set<std::pair<int, int>>& cuts = *settled;
  const PartitionVerdict v = PartitionExclusions(agents_.Live(), cuts);
  std::string pairs;
  for (const auto& [x, y] : cuts) {
    pairs += (pairs.empty() ? "" : ", ") + agents_.at(x).host.name + "-" + agents_.at(y).host.name;
  }
  if (v.exclude.empty()) {
    if (partition_said_ != pairs + v.why) events_.Write("partition", "cut " + pairs + ": " + v.why + "; nobody excluded");
    partition_said_ = pairs + v.why;
    return;
  }
  events_.Write("partition", "cut " + pairs + ": " + v.why);
  for (int n : v.exclude) {
    AgentState& a = agents_.at(n);
    HostLost(a, "host " + a.host.name + " cannot reach the others' majority (unreachable pairs: " + pairs +
                    "); excluding it",
             0, Lost::kExcluded);
  }
}

// Judged only while every agent is heard from (a starved or cut-off agent
// holds its workers' records back: that is the agent pool's to judge), and
// confirmed at the next tick, after an I/O poll (a master that did not run
// for a while must read what waits in its sockets first).
void Master::CheckHang() {
  for (const auto& a : agents_.all()) {
    if (a->connected() && a->conn && !a->ranks.empty() &&
        Now() - a->conn->last_receive_ms() > 2 * kHeartbeatMs) {
      hang_suspect_ = false;
      return;
    }
  }
  std::optional<HangWatch::Verdict> v = hang_.Check(Now(), /*peek=*/!hang_suspect_);
  if (!v || !hang_suspect_) {
    hang_suspect_ = v.has_value();
    return;
  }
  hang_suspect_ = false;
  std::string what;
  for (const HangWatch::Named& n : v->ranks) {
    const std::string& host = layout_.hosts[static_cast<size_t>(layout_.ranks[n.rank].host)].name;
    const std::string line = "worker rank " + std::to_string(n.rank) + " on host " + host + " hung: " + n.why;
    events_.Write("worker-hang", "rank=" + std::to_string(n.rank) + " host=" + host +
                                     " step=" + std::to_string(n.step) +
                                     " stalled_ms=" + std::to_string(n.stalled_ms) +
                                     " deadline_ms=" + std::to_string(n.deadline_ms) +
                                     " still_ms=" + std::to_string(v->still_ms));
    metrics_.Hung(host, n, generation_, line);
    what += (what.empty() ? "" : "; ") + line;
  }
  Failure(what + "; tearing generation " + std::to_string(generation_) + " down", "", v->stalled_ms);
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

void Master::Failure(const std::string& what, const std::string& lost_host, int64_t latency_ms) {
  if (state_ == State::kStopping || state_ == State::kDone) return;
  OB_LOG(Error) << what;
  events_.Write("detect", what);
  rec_.Detected(latency_ms);
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
  f.live = agents_.Live();
  f.master_timeout_s = opt_.master_timeout_s;
  // (blocks the loop while it verifies: every worker restarts anyway)
  if (ckpt_.enabled()) f.newest_checkpoint = [this] { return ckpt_.Newest(); };
  return f;
}

void Master::Decide() {
  decide_deadline_ms_ = -1;
  if (state_ != State::kRunning) return;
  RecoveryFacts f = Facts();
  f.lost.assign(lost_since_holding_.begin(), lost_since_holding_.end());
  f.lost_names = NameSome({failed_hosts_.begin(), failed_hosts_.end()}, kHostsNamed);
  f.what = failures_.empty() ? "hosts came back" : failures_.front();
  if (failures_.size() > 1) f.what += " (and " + std::to_string(failures_.size() - 1) + " more)";
  failures_.clear();
  failed_hosts_.clear();
  f.fruitless = ++fruitless_;
  // Hosts lost right after our own stall (the agents' timeout ran out while
  // we could not answer) are not the hosts' fault.
  if (stalled_ms_ > 0 && Now() - stall_seen_ms_ < kStallBlameMs) f.stalled_ms = stalled_ms_;
  stalled_ms_ = 0;
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
  rec_.Decided();
  events_.Write("decide", "generation=" + std::to_string(generation_ + 1) + " " + d.text);
  Status st = LaunchGeneration();
  if (!st.ok()) BeginStop(st.message(), Status::TempFail(st.message()));
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
  Carry(d);
  return "";
}

void Master::RequestStop(const std::string& reason) {
  if (state_ == State::kStopping || state_ == State::kDone) return;
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

Result<int> RunMaster(const MasterOptions& options) {
  detail::Master master(options);
  return master.Run();
}

}  // namespace ob::launch
