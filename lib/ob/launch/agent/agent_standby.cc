// An agent's standby workers (agent.h, "Standbys"): one per slot, LibTorch
// loaded, forked from the standby seed (standby_seed.h) once it has loaded,
// by exec before that or once it failed.
#include "ob/launch/agent/agent_impl.h"

#include <signal.h>
#include <unistd.h>

#include "ob/clock.h"
#include "ob/log.h"

namespace ob::launch {
namespace detail {

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

}  // namespace detail

}  // namespace ob::launch
