// How an agent starts a generation's workers (agent.h): the replaced ones
// retired first, each new one in its slot (from a standby where one waits),
// with its GPU, its share of the cores, its snapshot arena and its end of
// the store relay.
#include "ob/launch/agent/agent_impl.h"

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "ob/clock.h"
#include "ob/io/file.h"
#include "ob/launch/agent/host.h"
#include "ob/log.h"

extern char** environ;

namespace ob::launch {

namespace {

const char* Getenv(const char* var) { return std::getenv(var); }

}  // namespace

namespace detail {

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

std::map<std::string, std::string> Agent::ThreadEnv(int sharing) const {
  std::map<std::string, std::string> env;
  for (const ThreadSetting& s : ThreadSettings(ThreadsPerWorker(UsableCores(), sharing), Getenv)) {
    if (s.origin != ThreadSetting::kInherited) env[s.var] = s.value;
  }
  return env;
}

void Agent::SetThreads(std::vector<pb::WorkerSpec>* specs) {
  if (specs->empty()) return;
  const int cores = UsableCores();
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
  if (const char* t = std::getenv("OB_TEST_NCCL_HOSTS"); t != nullptr && std::string(t) == "1") {
    if (!said_test_nccl_hosts_) {
      said_test_nccl_hosts_ = true;
      OB_LOG(Warn) << "OB_TEST_NCCL_HOSTS=1 (for tests): to NCCL each worker of " << opt_.host
                   << " is a host of its own (NCCL_HOSTID " << opt_.host << "/SLOT), over sockets on loopback";
    }
    for (auto& [var, value] : TestNcclHostEnv(opt_.host, slot, Getenv)) {
      const std::string prefix = var + "=";
      env.erase(std::remove_if(env.begin(), env.end(), [&](const std::string& kv) { return kv.rfind(prefix, 0) == 0; }),
                env.end());
      env.push_back(prefix + value);
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

void Agent::CloseOutputs() {
  for (auto& w : workers_) {
    if (w->out != nullptr && !uv_is_closing(reinterpret_cast<uv_handle_t*>(w->out))) {
      w->out->data = nullptr;
      uv_close(reinterpret_cast<uv_handle_t*>(w->out), [](uv_handle_t* h) { free(h); });
    }
    w->out = nullptr;
  }
}

}  // namespace detail

}  // namespace ob::launch
