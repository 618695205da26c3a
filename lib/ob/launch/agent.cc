#include "ob/launch/agent.h"

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "ob/clock.h"
#include "ob/cluster/rsh.h"
#include "ob/io/file.h"
#include "ob/io/records.h"
#include "ob/io/text.h"
#include "ob/launch/channel.h"
#include "ob/launch/devices.h"
#include "ob/launch/peer_probe.h"
#include "ob/launch/stall_grace.h"
#include "ob/launch/standby_seed.h"
#include "ob/launch/store_relay.h"
#include "ob/log.h"

extern char** environ;

namespace ob::launch {
namespace {

constexpr int kWatchdogMs = 50;          // how often the agent checks the master and workers
constexpr int kSecretWaitMs = 30000;     // the master writes the secret right after starting us
constexpr int kDrainMs = 300;            // the most time spent flushing on the way out
// A replaced worker that has not died this long after its SIGKILL (a CUDA
// process tearing its context down, a process in uninterruptible sleep)
// no longer holds its slot's successor back.
constexpr int kRetireWaitMs = 10000;
// The longest the loop waits for the standby seed's answer to a fork
// (milliseconds of work, but on a loaded machine); past it the seed counts
// as failed.
constexpr int kSeedAnswerMs = 2000;
// Where a worker finds what its agent passes it (cluster::SpawnWithPipes).
constexpr int kSnapshotFd = cluster::kPassedFd;  // $OB_SNAPSHOT_FD
constexpr int kStoreFd = cluster::kPassedFd + 1;  // $OB_STORE_FD

// The first line of `fd`, read a byte at a time so nothing after it is
// consumed. Empty on end of file, timeout or error.
std::string ReadSecretLine(int fd) {
  std::string line;
  while (line.size() < 4096) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, kSecretWaitMs) <= 0) return "";
    char c;
    ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (c == '\n') return line;
    line += c;
  }
  return line;
}

struct Worker {
  uint32_t rank = 0;
  uint32_t slot = 0;          // local rank: its snapshot arena, its GPU
  uint64_t generation = 0;
  int64_t killed_ms = -1;     // replaced: when it was sent SIGKILL (loop clock)
  cluster::ChildProcess proc;
  uv_pipe_t* out = nullptr;   // its stdout; closed by the loop
  uint64_t store_client = 0;  // its end of the store relay
  std::string buf;            // undecoded metrics bytes
  bool junk = false;          // its stdout stopped being a record stream
  bool exited = false;
  // Its deadlines before the first step (agent.h), on the loop's clock.
  int64_t deadline_ms = 0;    // for the next sign of life
  int64_t heard_ms = -1;      // its last record before its first step
  bool stepped = false;       // a step record came: no more deadlines
  bool suspect = false;       // past the deadline at the last check
  int phase = 0;              // pb::WorkerPhase of its last record
  std::string stuck;          // why it was killed for missing one
};

// A standby worker (agent.h), and its end of the store relay.
struct Standby {
  cluster::ChildProcess proc;
  uint64_t store_client = 0;
  int64_t spawned_ms = 0;     // on the loop's clock
  bool forked = false;        // from the seed, not by exec
};

class Agent {
 public:
  explicit Agent(const AgentOptions& o) : opt_(o) {
    uv_loop_init(&loop_);
    loop_.data = this;
    relay_ = std::make_unique<StoreRelay>(&loop_, [this](const pb::Control& m) { Send(m); });
  }
  ~Agent() {
    conn_.reset();
    relay_.reset();  // its handles are closed while the loop can still free them
    uv_walk(&loop_, [](uv_handle_t* h, void*) { if (!uv_is_closing(h)) uv_close(h, nullptr); },
            nullptr);
    for (int i = 0; i < 3; ++i) uv_run(&loop_, UV_RUN_NOWAIT);
    uv_loop_close(&loop_);
  }

  int Run();

 private:
  void OnConnected(Result<std::shared_ptr<Connection>> r);
  // The master closed our connection while it still holds our stdin: it
  // evicted us (agent.h, "Rejoining").
  void Detach(const std::string& reason);
  void Reconnect();
  void OnMessage(pb::Control& m);
  void StartWorkers(const pb::StartWorkers& sw);
  void StartWorker(const pb::WorkerSpec& spec);
  // Replaced workers: SIGKILLed now, reaped by ReapWorkers as they die
  // (never waited for on the loop), not reported (the master asked).
  void Retire();
  // Starts the pending workers whose slot no replaced worker still holds.
  void StartPending();
  void ReapWorkers();
  // As a child subreaper the agent inherits every orphan below it: a
  // standby whose fork answer came too late, a daemon a worker command
  // left. Reaps those that died and are none of its known children; stops
  // at a known one (waitid shows one zombie at a time), which its owner
  // reaps.
  void ReapStrangers();
  void CheckDeadlines();
  void OnWorkerOutput(Worker* w, const char* data, size_t n);
  void KillWorkers();
  void CloseOutputs();
  int ArenaFd(uint32_t local_rank);
  // Whether this host's workers run on CUDA (AgentOptions::device, gpus).
  bool cuda() const {
    auto d = ParseDevice(opt_.device);
    return d.ok() && ResolveDevice(*d, opt_.gpus) == DeviceKind::kCuda;
  }
  // OMP_NUM_THREADS and the like for `workers` workers (agent.h), added to
  // each spec unless our environment sets them.
  void SetThreads(std::vector<pb::WorkerSpec>* specs);
  // The thread variables (devices.h) a worker here gets when `sharing`
  // workers share the host's cores, leaving out those the user set.
  std::map<std::string, std::string> ThreadEnv(int sharing) const;
  std::vector<std::string> WorkerEnv(const pb::WorkerSpec* spec, uint32_t slot);
  // Forks `argv` with the slot's snapshot arena and a new store endpoint
  // (a standby, without `spec`, from the seed when it is ready); sets
  // *store_client to the endpoint's id, and *forked (if given) to whether
  // the seed forked it.
  Result<cluster::ChildProcess> Spawn(const std::vector<std::string>& argv,
                                      const pb::WorkerSpec* spec, uint32_t slot,
                                      uint64_t* store_client, bool* forked = nullptr);
  void SpawnStandby(uint32_t slot);
  // Whether `spec`'s worker starts as a standby (a waiting one, or one
  // forked from the seed for it): always with spare standbys; without
  // (AgentOptions::spare_standbys), when it runs the worker program.
  bool StartsAsStandby(const pb::WorkerSpec& spec) const;
  // The standby seed (standby_seed.h): started with the first standby;
  // OnSeedOutput sees it loaded (or dead); SeedFailed gives it up for
  // good, and standbys start by exec from then on. SeedSettled starts
  // what waited for it (never from inside StartPending: it calls it).
  void StartSeed();
  void OnSeedOutput();
  void SeedFailed(const std::string& why);
  void StopSeed();  // its poll closed, it killed and reaped
  void SeedSettled();
  void Shutdown(int code, const std::string& why);
  void Send(const pb::Control& m) {
    if (conn_) conn_->Send(m);
  }

  AgentOptions opt_;
  std::string secret_;
  uv_loop_t loop_;
  uv_timer_t heartbeat_{}, watchdog_{}, drain_{};
  uv_signal_t sigchld_{}, sigterm_{}, sigint_{}, sighup_{};
  uv_pipe_t stdin_{};
  bool stdin_open_ = false;
  std::shared_ptr<Connection> conn_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::unique_ptr<Worker>> dying_;   // retired, not reaped yet
  std::vector<pb::WorkerSpec> pending_;          // this generation's, waiting for their slot
  // Per local worker slot: the memfd its workers keep their snapshots in
  // (runtime/snapshot_arena.h). It outlives every worker, so a restarted
  // one finds its predecessor's state; it dies with the agent.
  std::map<uint32_t, int> arenas_;
  std::map<uint32_t, Standby> standby_;  // per slot, waiting for a role
  enum class Seed { kNone, kLoading, kReady, kFailed };
  Seed seed_state_ = Seed::kNone;
  std::unique_ptr<StandbySeed> seed_;
  uv_poll_t seed_poll_{};         // on the seed's stdout, while it lives
  bool subreaper_ = false;        // PR_SET_CHILD_SUBREAPER, for the seed's standbys
  int64_t seed_started_ms_ = 0;   // on the loop's clock
  // What this host has shown (agent.h, "Deadlines"): how long its seed took
  // to load LibTorch, and the longest interval between two records of a
  // worker before its first step.
  int64_t seed_load_ms_ = 0;
  int64_t start_gap_ms_ = 0;
  int64_t RoleAckMs() const { return std::max<int64_t>(kRoleAckMs, kLoadsOfSilence * seed_load_ms_); }
  int64_t StartSilentMs() const {
    return std::max<int64_t>({kStartSilentMs, kLoadsOfSilence * seed_load_ms_, kGapsOfStartSilence * start_gap_ms_});
  }
  std::vector<uint32_t> seed_wanted_;  // slots whose standby waits for the seed
  // How many workers shared the cores at the last start (a standby starts
  // with the threads it would get: LibTorch's and BLAS's pools are sized
  // when they first run, and a pool sized for the whole machine makes the
  // first step after a recovery several times slower).
  int last_sharing_ = 0;
  // Workers' and standbys' store requests, to the master and back.
  std::unique_ptr<StoreRelay> relay_;
  uint64_t generation_ = 0;
  uint64_t sequence_ = 0;
  bool master_suspect_ = false;  // the master was silent too long at the last watchdog tick
  StallGrace stalls_;            // our own, at the watchdog's ticks (stall_grace.h)
  int exit_code_ = -1;
  std::string master_host_;
  int master_port_ = 0;
  int64_t rejoin_until_ms_ = -1;  // detached: asking to rejoin until then (loop clock)
  std::unique_ptr<PeerProbe> probe_;  // this generation's peers (peer_probe.h), once we have some
  uv_timer_t retry_{};
};

int Agent::Run() {
  std::string& host = master_host_;
  int& port = master_port_;
  Status st = SplitHostPort(opt_.master, "--master", &host, &port);
  if (!st.ok()) {
    OB_LOG(Error) << st.message();
    return static_cast<int>(Code::kUsage);
  }
  secret_ = ReadSecretLine(opt_.secret_fd);
  if (secret_.empty()) {
    OB_LOG(Error) << "no secret on stdin: the master writes it there when it starts an agent";
    return static_cast<int>(Code::kConfig);
  }
  ::unsetenv("OB_SECRET");  // workers never see a secret
  ::signal(SIGPIPE, SIG_IGN);  // a standby that died must not take us with it
  // Standbys forked from the seed are its grandchildren; its middle
  // process exits at once, and they become ours to reap.
  if (opt_.standby_exe.empty() || !opt_.standby_seed) {
    seed_state_ = Seed::kFailed;  // none to fork from
  } else if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    OB_LOG(Warn) << "not a child subreaper (" << io::Errno() << "): standbys start by exec";
    seed_state_ = Seed::kFailed;
  } else {
    subreaper_ = true;
  }

  // Signals before anything can fork, so no exit goes unseen.
  uv_signal_init(&loop_, &sigchld_);
  sigchld_.data = this;
  uv_signal_start(&sigchld_, [](uv_signal_t* s, int) { static_cast<Agent*>(s->data)->ReapWorkers(); },
                  SIGCHLD);
  for (auto [h, sig] : {std::pair{&sigterm_, SIGTERM}, {&sigint_, SIGINT}, {&sighup_, SIGHUP}}) {
    uv_signal_init(&loop_, h);
    h->data = this;
    uv_signal_start(h, [](uv_signal_t* s, int signum) {
      static_cast<Agent*>(s->data)->Shutdown(128 + signum, std::string("got ") + strsignal(signum));
    }, sig);
  }
  // End of file on stdin: the master (or its ssh) is gone. A stdin that is
  // not a pipe or socket (a file, when started by hand) is not watched.
  uv_pipe_init(&loop_, &stdin_, 0);
  stdin_.data = this;
  if (uv_guess_handle(opt_.secret_fd) == UV_NAMED_PIPE && uv_pipe_open(&stdin_, opt_.secret_fd) == 0) {
    stdin_open_ = true;
    uv_read_start(reinterpret_cast<uv_stream_t*>(&stdin_),
                  [](uv_handle_t*, size_t, uv_buf_t* b) {
                    static char scratch[256];
                    *b = uv_buf_init(scratch, sizeof scratch);
                  },
                  [](uv_stream_t* s, ssize_t n, const uv_buf_t*) {
                    if (n >= 0) return;  // later lines are ignored
                    static_cast<Agent*>(s->data)->Shutdown(
                        static_cast<int>(Code::kTempFail), "stdin closed: the master is gone");
                  });
  }
  uv_timer_init(&loop_, &heartbeat_);
  uv_timer_init(&loop_, &watchdog_);
  uv_timer_init(&loop_, &drain_);
  uv_timer_init(&loop_, &retry_);
  heartbeat_.data = watchdog_.data = drain_.data = retry_.data = this;
  Reconnect();
  uv_run(&loop_, UV_RUN_DEFAULT);
  KillWorkers();  // in case the loop ended some other way
  return exit_code_ < 0 ? 0 : exit_code_;
}

void Agent::Reconnect() {
  pb::Hello hello;
  hello.set_host(opt_.host);
  hello.set_pid(static_cast<uint32_t>(::getpid()));
  hello.set_boot_id(BootId());
  for (const std::string& id : opt_.gpu_ids) hello.add_gpus(id);
  for (uint64_t bytes : opt_.gpu_memory) hello.add_gpu_memory_bytes(bytes);
  for (const std::string& name : opt_.gpu_names) hello.add_gpu_names(name);
  hello.set_device(cuda() ? "cuda" : "cpu");
  hello.set_build(opt_.build);
  Connect(&loop_, master_host_, master_port_, opt_.connect_timeout_ms, secret_, hello,
          [this](Result<std::shared_ptr<Connection>> r) { OnConnected(std::move(r)); });
}

void Agent::Detach(const std::string& reason) {
  if (exit_code_ >= 0) return;
  if (!stdin_open_ || rejoin_until_ms_ >= 0) {
    return Shutdown(static_cast<int>(Code::kTempFail), "lost the master: " + reason);
  }
  OB_LOG(Warn) << "lost the master (" << reason << "): stopping generation " << generation_
               << "'s workers and asking to rejoin";
  pending_.clear();
  Retire();
  if (probe_) probe_->SetPeers({});
  uv_timer_stop(&heartbeat_);
  conn_->SetHandlers(nullptr, nullptr);
  conn_.reset();
  rejoin_until_ms_ = static_cast<int64_t>(uv_now(&loop_)) + kRejoinMs;
  Reconnect();
}

void Agent::OnConnected(Result<std::shared_ptr<Connection>> r) {
  if (exit_code_ >= 0) return;
  if (!r.ok() && rejoin_until_ms_ >= 0 && r.status().code() != Code::kConfig &&
      static_cast<int64_t>(uv_now(&loop_)) + kRejoinRetryMs < rejoin_until_ms_) {
    uv_timer_start(&retry_, [](uv_timer_t* t) { static_cast<Agent*>(t->data)->Reconnect(); },
                   kRejoinRetryMs, 0);
    return;
  }
  if (!r.ok()) {
    std::string why = r.status().message();
    // Which address it tried is in the message; the usual cause is a
    // master listening where this host cannot reach it.
    if (why.rfind("cannot connect", 0) == 0) {
      why += " (the master listens on its --bind; if this host reaches its machine at another address, "
             "give ob-launch --bind ADDR)";
    }
    return Shutdown(r.status().code() == Code::kConfig ? static_cast<int>(Code::kConfig)
                                                       : static_cast<int>(Code::kUnavailable),
                    why);
  }
  conn_ = std::move(r).value();
  OB_LOG(Info) << (rejoin_until_ms_ >= 0 ? "rejoined" : "connected to") << " the master at "
               << conn_->peer();
  rejoin_until_ms_ = -1;
  master_suspect_ = false;
  if (opt_.spare_standbys) {
    SpawnStandby(0);  // loading while the master waits for the other agents
  } else if (seed_state_ == Seed::kNone) {
    StartSeed();  // the same, for the workers to fork from
  }
  conn_->SetHandlers([this](Connection&, pb::Control& m) { OnMessage(m); },
                     [this](Connection&, const std::string& reason) { Detach(reason); });
  uv_timer_start(&heartbeat_, [](uv_timer_t* t) {
    auto* a = static_cast<Agent*>(t->data);
    pb::Control m;
    m.mutable_heartbeat()->set_sequence(++a->sequence_);
    m.mutable_heartbeat()->set_unix_ms(UnixMs());
    if (a->probe_) {
      for (const std::string& h : a->probe_->Unreachable()) m.mutable_heartbeat()->add_unreachable(h);
    }
    a->Send(m);
  }, 0, kHeartbeatMs);
  uv_timer_start(&watchdog_, [](uv_timer_t* t) {
    auto* a = static_cast<Agent*>(t->data);
    a->ReapWorkers();  // a backstop for a coalesced SIGCHLD
    if (a->seed_state_ == Seed::kLoading &&
        static_cast<int64_t>(uv_now(&a->loop_)) - a->seed_started_ms_ > kColdStartMs) {
      a->SeedFailed("not loaded after " + std::to_string(kColdStartMs / 1000) + " s");
      a->SeedSettled();
    }
    a->StartPending();  // a replaced worker past kRetireWaitMs
    a->CheckDeadlines();
    const int64_t now = static_cast<int64_t>(uv_now(&a->loop_));
    const int64_t stalled_ms = a->stalls_.Tick(now);
    if (!a->conn_) return;
    if (!a->stalls_.MayJudge(now)) {
      if (stalled_ms > 0) {
        OB_LOG(Warn) << "this agent did not run for " << stalled_ms << " ms; hearing the master out for "
                     << StallGrace::kGraceMs << " ms before it judges its silence";
      }
      a->master_suspect_ = false;
      return;
    }
    double silent_s = (now - a->conn_->last_receive_ms()) / 1e3;
    // Confirmed at the next tick, after an I/O poll: a loop that was
    // descheduled must read what waits in the socket before it judges.
    const bool silent = silent_s > a->opt_.master_timeout_s;
    const bool confirmed = silent && a->master_suspect_;
    a->master_suspect_ = silent;
    if (confirmed) {
      char text[64];
      snprintf(text, sizeof text, "%.1f s", silent_s);
      a->Shutdown(static_cast<int>(Code::kTempFail),
                  std::string("the master has been silent for ") + text);
    }
  }, kWatchdogMs, kWatchdogMs);
}

void Agent::OnMessage(pb::Control& m) {
  switch (m.kind_case()) {
    case pb::Control::kHeartbeat: break;  // the connection noted the time
    case pb::Control::kStartWorkers: StartWorkers(m.start_workers()); break;
    case pb::Control::kStoreReply: relay_->Deliver(m.store_reply()); break;
    case pb::Control::kStop: Shutdown(0, "told to stop: " + m.stop().reason()); break;
    default: OB_LOG(Debug) << "ignoring control message " << m.kind_case(); break;
  }
}

// A new generation replaces the old one's workers: they are killed (and not
// reported: the master asked for it) before the new ones start.
void Agent::StartWorkers(const pb::StartWorkers& sw) {
  if (sw.generation() <= generation_) {
    OB_LOG(Warn) << "ignoring workers of generation " << sw.generation() << ": already at "
                 << generation_;
    return;
  }
  pending_.clear();  // an older generation's, never started
  Retire();
  generation_ = sw.generation();
  if (cuda()) {
    Status st = CheckGpus(opt_.host, sw.workers_size(), opt_.gpus);
    if (!st.ok()) {
      OB_LOG(Error) << "refusing generation " << sw.generation() << ": " << st.message();
      pb::Control m;
      m.mutable_refusal()->set_generation(sw.generation());
      m.mutable_refusal()->set_reason(st.message());
      m.mutable_refusal()->set_exit_code(st.exit_code());
      Send(m);
      return;
    }
  }
  std::vector<Peer> peers;
  for (const auto& p : sw.peers()) peers.push_back({p.host(), p.address()});
  if (!peers.empty() && !probe_ && opt_.probe_port > 0) probe_ = std::make_unique<PeerProbe>(opt_.probe_port);
  if (probe_) probe_->SetPeers(std::move(peers));
  OB_LOG(Info) << "starting " << sw.workers_size() << " worker(s), generation " << sw.generation();
  pending_.assign(sw.workers().begin(), sw.workers().end());
  SetThreads(&pending_);
  StartPending();
}

namespace {
// The least CPU quota of our cgroups (devices.h), 0 when none is set or
// none can be read. Read once: a quota is the container's, fixed for the
// agent's life.
int CgroupCpus() {
  static const int cpus = [] {
    auto cgroup = io::ReadFile("/proc/self/cgroup");
    auto mounts = io::ReadFile("/proc/self/mountinfo");
    if (!cgroup.ok() || !mounts.ok()) return 0;
    int least = 0;
    for (const CgroupDir& d : CpuCgroupDirs(*cgroup, *mounts)) {
      int n = 0;
      if (d.v2) {
        auto max = io::ReadFile(d.path + "/cpu.max");
        if (max.ok()) n = QuotaCpus(*max);
      } else {
        auto quota = io::ReadFile(d.path + "/cpu.cfs_quota_us");
        auto period = io::ReadFile(d.path + "/cpu.cfs_period_us");
        if (quota.ok() && period.ok()) n = QuotaCpus(*quota, *period);
      }
      if (n > 0 && (least == 0 || n < least)) least = n;
    }
    return least;
  }();
  return cpus;
}

// The cores a worker's share is cut from: our affinity mask, or fewer
// where a CPU quota allows fewer.
int Cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int mask = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                                 : static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  const int quota = CgroupCpus();
  return quota > 0 ? std::min(mask, quota) : mask;
}
const char* Getenv(const char* var) { return std::getenv(var); }
}  // namespace

std::map<std::string, std::string> Agent::ThreadEnv(int sharing) const {
  std::map<std::string, std::string> env;
  for (const ThreadSetting& s : ThreadSettings(ThreadsPerWorker(Cores(), sharing), Getenv)) {
    if (s.origin != ThreadSetting::kInherited) env[s.var] = s.value;
  }
  return env;
}

void Agent::SetThreads(std::vector<pb::WorkerSpec>* specs) {
  if (specs->empty()) return;
  const int cores = Cores();
  const int sharing = std::max(static_cast<int>(specs->size()), opt_.cpu_share);
  last_sharing_ = sharing;
  std::string said;
  for (const ThreadSetting& s : ThreadSettings(ThreadsPerWorker(cores, sharing), Getenv)) {
    said += (said.empty() ? "" : ", ") + s.var + "=" + s.value;
    if (s.origin == ThreadSetting::kInherited) {
      said += " (from the environment)";
      continue;
    }
    if (s.origin == ThreadSetting::kFollowsOmp) said += " (as OMP_NUM_THREADS)";
    for (auto& spec : *specs) (*spec.mutable_env())[s.var] = s.value;
  }
  const int quota = CgroupCpus();
  OB_LOG(Info) << specs->size() << " worker(s) here, " << sharing << " sharing " << cores << " core(s)"
               << (quota > 0 && quota == cores ? " (the CPU quota of its cgroup)" : "") << ", "
               << (cuda() ? "cuda" : "cpu") << ": " << said;
}

void Agent::Retire() {
  const int64_t now = static_cast<int64_t>(uv_now(&loop_));
  CloseOutputs();
  for (auto& w : workers_) {
    if (w->exited) continue;
    w->proc.Kill();
    w->killed_ms = now;
    relay_->Close(w->store_client);  // its requests still on their way are dropped
    dying_.push_back(std::move(w));
  }
  workers_.clear();
  ReapWorkers();  // those already gone
}

// A slot's new worker waits for the old one to die (its GPU memory, its
// snapshot arena), on the loop: SIGCHLD or the watchdog brings it here.
void Agent::StartPending() {
  if (pending_.empty() || exit_code_ >= 0) return;
  const int64_t now = static_cast<int64_t>(uv_now(&loop_));
  std::vector<pb::WorkerSpec> still;
  std::vector<uint32_t> started;
  for (auto& spec : pending_) {
    const Worker* old = nullptr;
    for (const auto& d : dying_) {
      if (d->slot == spec.local_rank()) old = d.get();
    }
    if (old != nullptr && now - old->killed_ms < kRetireWaitMs) {
      still.push_back(std::move(spec));
      continue;
    }
    if (seed_state_ == Seed::kLoading && standby_.count(spec.local_rank()) == 0 && StartsAsStandby(spec)) {
      still.push_back(std::move(spec));  // the seed's fork is nearer than a load of its own
      continue;
    }
    if (old != nullptr) {
      OB_LOG(Warn) << "generation " << old->generation << "'s worker rank " << old->rank << " (pid "
                   << old->proc.pid() << ") has not died " << now - old->killed_ms
                   << " ms after SIGKILL; starting rank " << spec.rank() << " in its slot anyway";
    }
    StartWorker(spec);
    started.push_back(spec.local_rank());
  }
  pending_ = std::move(still);
  if (opt_.spare_standbys) {
    for (uint32_t slot : started) SpawnStandby(slot);
  }
}

bool Agent::StartsAsStandby(const pb::WorkerSpec& spec) const {
  if (opt_.spare_standbys) return true;  // whatever it runs, a standby takes it
  if (opt_.standby_exe.empty() || spec.argv_size() == 0) return false;
  // The standby runs a spec of this program in its own process, and execs
  // any other (a test's stand-in, which would then have a standby's 3 s to
  // answer: kRoleAckMs).
  char a[PATH_MAX], b[PATH_MAX];
  return ::realpath(spec.argv(0).c_str(), a) != nullptr && ::realpath(opt_.standby_exe.c_str(), b) != nullptr &&
         std::strcmp(a, b) == 0;
}

// The environment of a worker in `slot`: ours without the secret, the
// spec's variables, and the slot's snapshot arena. OB_INJECT comes only
// from the spec (ob-launch --inject): one left in a shell's environment
// from a test would inject faults into a real run.
std::vector<std::string> Agent::WorkerEnv(const pb::WorkerSpec* spec, uint32_t slot) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    std::string key = kv.substr(0, kv.find('='));
    if (key == "OB_SECRET" || key == "OB_SNAPSHOT_FD" || key == "OB_STORE_FD" || key == "OB_DEVICE" ||
        key == "OB_INJECT" ||
        (key == "CUDA_VISIBLE_DEVICES" && cuda()) ||
        (spec != nullptr && spec->env().count(key) > 0)) {
      continue;
    }
    env.push_back(std::move(kv));
  }
  if (spec != nullptr) {
    for (const auto& [k, v] : spec->env()) env.push_back(k + "=" + v);
  } else {
    env.push_back("OB_HOST=" + opt_.host);  // so tools that look for our workers find it
    for (const auto& [k, v] : ThreadEnv(std::max({1, last_sharing_, opt_.cpu_share}))) env.push_back(k + "=" + v);
  }
  const bool on_cuda = cuda();
  env.push_back(std::string("OB_DEVICE=") + (on_cuda ? "cuda" : "cpu"));
  if (on_cuda) {
    const char* given = std::getenv("CUDA_VISIBLE_DEVICES");
    const std::string list = given != nullptr ? given : "";
    Result<std::string> gpu = VisibleDeviceFor(static_cast<int>(slot), given != nullptr ? &list : nullptr);
    if (gpu.ok()) {
      env.push_back("CUDA_VISIBLE_DEVICES=" + *gpu);
    } else {  // more slots than listed GPUs: refused at StartWorkers; a standby sees none
      env.push_back("CUDA_VISIBLE_DEVICES=");
    }
  }
  if (ArenaFd(slot) >= 0) env.push_back("OB_SNAPSHOT_FD=" + std::to_string(kSnapshotFd));
  env.push_back("OB_STORE_FD=" + std::to_string(kStoreFd));
  // Gloo listens where this host faces the master, unless told otherwise.
  const char* gloo = std::getenv("OB_GLOO_ADDR");
  if ((gloo == nullptr || *gloo == '\0') && conn_ && !conn_->local_ip().empty()) {
    env.push_back("OB_GLOO_ADDR=" + conn_->local_ip());
  }
  return env;
}

Result<cluster::ChildProcess> Agent::Spawn(const std::vector<std::string>& argv,
                                           const pb::WorkerSpec* spec, uint32_t slot,
                                           uint64_t* store_client, bool* forked) {
  OB_ASSIGN_OR_RETURN(StoreRelay::Endpoint ep, relay_->Open());
  std::vector<std::string> env = WorkerEnv(spec, slot);
  Result<cluster::ChildProcess> child = Status::Unavailable("no seed");
  if (spec == nullptr && seed_state_ == Seed::kReady) {  // a standby
    child = seed_->Fork(env, {ArenaFd(slot), ep.child_fd}, kSeedAnswerMs);
    if (!child.ok()) SeedFailed(child.status().message());
  }
  if (forked != nullptr) *forked = child.ok();
  if (!child.ok()) child = cluster::SpawnWithPipes(argv, &env, {ArenaFd(slot), ep.child_fd});
  if (!child.ok()) {
    relay_->Close(ep.client);
    return child;
  }
  relay_->Spawned(ep.client);
  *store_client = ep.client;
  return child;
}

void Agent::SpawnStandby(uint32_t slot) {
  if (opt_.standby_exe.empty() || exit_code_ >= 0) return;
  auto it = standby_.find(slot);
  if (it != standby_.end()) {
    it->second.proc.WaitFor(0);
    if (it->second.proc.running()) return;
    relay_->Close(it->second.store_client);
    standby_.erase(it);
  }
  if (seed_state_ == Seed::kNone) StartSeed();
  if (seed_state_ == Seed::kLoading) {
    if (std::find(seed_wanted_.begin(), seed_wanted_.end(), slot) == seed_wanted_.end()) {
      seed_wanted_.push_back(slot);
    }
    return;
  }
  Standby s;
  Result<cluster::ChildProcess> child =
      Spawn({opt_.standby_exe, "--standby-worker"}, nullptr, slot, &s.store_client, &s.forked);
  if (!child.ok()) {
    OB_LOG(Warn) << "no standby worker: " << child.status().message();
    return;
  }
  s.proc = std::move(child).value();
  s.spawned_ms = static_cast<int64_t>(uv_now(&loop_));
  standby_.emplace(slot, std::move(s));
}

void Agent::StartSeed() {
  Result<StandbySeed> seed = StandbySeed::Start(opt_.standby_exe, WorkerEnv(nullptr, 0));
  if (!seed.ok()) {
    SeedFailed(seed.status().message());
    return;
  }
  seed_ = std::make_unique<StandbySeed>(std::move(seed).value());
  seed_state_ = Seed::kLoading;
  seed_started_ms_ = static_cast<int64_t>(uv_now(&loop_));
  uv_poll_init(&loop_, &seed_poll_, seed_->ready_fd());
  seed_poll_.data = this;
  uv_poll_start(&seed_poll_, UV_READABLE, [](uv_poll_t* p, int, int) {
    static_cast<Agent*>(p->data)->OnSeedOutput();
  });
}

void Agent::OnSeedOutput() {
  char c;
  ssize_t n = ::read(seed_->ready_fd(), &c, 1);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n == 1 && seed_state_ == Seed::kLoading) {
    seed_state_ = Seed::kReady;
    seed_load_ms_ = static_cast<int64_t>(uv_now(&loop_)) - seed_started_ms_;
    OB_LOG(Info) << "standby seed loaded in " << seed_load_ms_
                 << " ms, pid " << seed_->pid() << ": standbys fork from it";
    SeedSettled();
    return;
  }
  if (n == 1) return;  // it says nothing more; only its end matters
  std::string exited = seed_->Exited(0.2);  // at end of file it is exiting
  SeedFailed("it exited (" + (exited.empty() ? std::string("closed its stdout") : exited) + ")");
  SeedSettled();
}

void Agent::SeedFailed(const std::string& why) {
  if (seed_state_ == Seed::kFailed) return;
  const bool had = seed_ != nullptr;
  if (had) {
    OB_LOG(Warn) << "standby seed: " << why << "; standbys start by exec";
    StopSeed();
  } else {
    OB_LOG(Warn) << "no standby seed: " << why << "; standbys start by exec";
  }
  seed_state_ = Seed::kFailed;
}

void Agent::StopSeed() {
  uv_poll_stop(&seed_poll_);
  if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(&seed_poll_))) {
    uv_close(reinterpret_cast<uv_handle_t*>(&seed_poll_), nullptr);
  }
  seed_->Stop();
}

void Agent::SeedSettled() {
  std::vector<uint32_t> wanted = std::move(seed_wanted_);
  seed_wanted_.clear();
  for (uint32_t slot : wanted) SpawnStandby(slot);
  StartPending();
}

int Agent::ArenaFd(uint32_t local_rank) {
  auto it = arenas_.find(local_rank);
  if (it != arenas_.end()) return it->second;
  const std::string name = "ob-snapshot-" + std::to_string(local_rank);
  int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) {
    OB_LOG(Warn) << "no shared snapshot memory (" << std::strerror(errno)
                 << "): a restarted worker must get its state from peers";
  }
  arenas_[local_rank] = fd;
  return fd;
}

void Agent::CloseOutputs() {
  for (auto& w : workers_) {
    if (w->out != nullptr && !uv_is_closing(reinterpret_cast<uv_handle_t*>(w->out))) {
      w->out->data = nullptr;
      uv_close(reinterpret_cast<uv_handle_t*>(w->out), [](uv_handle_t* h) { free(h); });
    }
    w->out = nullptr;
  }
}

void Agent::StartWorker(const pb::WorkerSpec& spec) {
  std::vector<std::string> argv(spec.argv().begin(), spec.argv().end());
  auto w = std::make_unique<Worker>();
  w->rank = spec.rank();
  w->slot = spec.local_rank();
  w->generation = generation_;
  Result<cluster::ChildProcess> child = Status::Config("empty worker command");
  const int64_t now = static_cast<int64_t>(uv_now(&loop_));
  w->deadline_ms = now + kColdStartMs;
  if (seed_state_ == Seed::kReady && standby_.count(spec.local_rank()) == 0 && StartsAsStandby(spec)) {
    SpawnStandby(spec.local_rank());
  }
  auto standby = standby_.find(spec.local_rank());
  const char* how = "by exec";
  if (standby != standby_.end()) {  // hand the spec to the waiting process
    cluster::ChildProcess proc = std::move(standby->second.proc);
    const uint64_t store_client = standby->second.store_client;
    const bool forked = standby->second.forked;
    // A standby that has loaded said so on its stdout (main.cc's
    // RunStandby): it gets the role deadline; one still loading, its cold start.
    int64_t deadline = std::max(now + RoleAckMs(), standby->second.spawned_ms + kColdStartMs);
    standby_.erase(standby);
    pollfd ready{proc.stdout_fd(), POLLIN, 0};
    if (::poll(&ready, 1, 0) == 1 && (ready.revents & POLLIN)) {
      char discard[512];
      if (::read(proc.stdout_fd(), discard, sizeof discard) > 0) deadline = now + RoleAckMs();
    }
    proc.WaitFor(0);
    const std::string bytes = spec.SerializeAsString();
    if (proc.running() &&
        ::write(proc.stdin_fd(), bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size())) {
      proc.CloseStdin();
      child = std::move(proc);
      how = forked ? "forked from the seed" : "a standby started by exec";
      w->store_client = store_client;
      w->deadline_ms = deadline;
    } else {
      relay_->Close(store_client);
    }
  }
  if (!child.ok() && !argv.empty()) {
    child = Spawn(argv, &spec, spec.local_rank(), &w->store_client);
  }
  if (!child.ok()) {
    OB_LOG(Error) << "worker rank " << spec.rank() << ": " << child.status().message();
    pb::Control m;
    auto* x = m.mutable_worker_exited();
    x->set_rank(spec.rank());
    x->set_generation(generation_);
    x->set_exit_status(127);
    x->set_unix_ms(UnixMs());
    x->set_description(child.status().message());
    Send(m);
    return;
  }
  w->proc = std::move(child).value();
  OB_LOG(Info) << "worker rank " << w->rank << " started, pid " << w->proc.pid() << ", " << how;
  // The loop gets its own descriptor for the stdout pipe; ChildProcess keeps
  // (and closes) the original.
  int fd = ::dup(w->proc.stdout_fd());
  w->out = static_cast<uv_pipe_t*>(calloc(1, sizeof(uv_pipe_t)));
  uv_pipe_init(&loop_, w->out, 0);
  w->out->data = w.get();
  if (fd < 0 || uv_pipe_open(w->out, fd) != 0) {
    OB_LOG(Warn) << "worker rank " << w->rank << ": cannot watch its stdout";
    if (fd >= 0) ::close(fd);
  } else {
    uv_read_start(reinterpret_cast<uv_stream_t*>(w->out),
                  [](uv_handle_t*, size_t suggested, uv_buf_t* b) {
                    b->base = static_cast<char*>(malloc(suggested));
                    b->len = b->base ? suggested : 0;
                  },
                  [](uv_stream_t* s, ssize_t n, const uv_buf_t* b) {
                    auto* w = static_cast<Worker*>(s->data);
                    if (n > 0 && w != nullptr) {
                      auto* agent = static_cast<Agent*>(s->loop->data);
                      agent->OnWorkerOutput(w, b->base, static_cast<size_t>(n));
                    } else if (n < 0) {
                      uv_read_stop(s);
                    }
                    free(b->base);
                  });
  }
  workers_.push_back(std::move(w));
}

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
        if (!metrics->heartbeat()) w->stepped = true;
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

void Agent::Shutdown(int code, const std::string& why) {
  if (exit_code_ >= 0) return;
  exit_code_ = code;
  if (code == 0) {
    OB_LOG(Info) << "stopping: " << why;
  } else {
    OB_LOG(Warn) << "stopping: " << why;
  }
  KillWorkers();
  CloseOutputs();
  for (auto& [slot, s] : standby_) relay_->Close(s.store_client);
  standby_.clear();  // killed and reaped
  if (seed_ != nullptr) {
    StopSeed();
  }
  seed_wanted_.clear();
  uv_timer_stop(&heartbeat_);
  uv_timer_stop(&watchdog_);
  uv_timer_stop(&retry_);
  if (conn_) {
    conn_->SetHandlers(nullptr, nullptr);
    conn_->Close(why);
    conn_.reset();
  }
  for (uv_handle_t* h : {reinterpret_cast<uv_handle_t*>(&heartbeat_),
                         reinterpret_cast<uv_handle_t*>(&watchdog_),
                         reinterpret_cast<uv_handle_t*>(&retry_),
                         reinterpret_cast<uv_handle_t*>(&sigchld_),
                         reinterpret_cast<uv_handle_t*>(&sigterm_),
                         reinterpret_cast<uv_handle_t*>(&sigint_),
                         reinterpret_cast<uv_handle_t*>(&sighup_),
                         reinterpret_cast<uv_handle_t*>(&stdin_)}) {
    if (!uv_is_closing(h)) uv_close(h, nullptr);
  }
  // Give queued frames a moment to go out, but never wait on a stuck peer.
  uv_timer_start(&drain_, [](uv_timer_t* t) { uv_stop(t->loop); }, kDrainMs, 0);
  uv_unref(reinterpret_cast<uv_handle_t*>(&drain_));
}

}  // namespace

int RunAgent(const AgentOptions& options) {
  Agent agent(options);
  return agent.Run();
}

}  // namespace ob::launch
