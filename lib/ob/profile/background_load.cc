// --concurrency's load processes and the contention curve (see
// background_load.h).
#include "ob/profile/background_load.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <new>
#include <thread>

#include <torch/torch.h>

#include "ob/launch/worker/blas.h"
#include "ob/model/gpt.h"
#include "ob/profile/measure_chain.h"

namespace ob::profile::detail {

Status BackgroundLoad::Start(const model::GptConfig& c, const MeasureOptions& o, int s, int processes) {
  int stop[2], ready[2];
  if (::pipe2(stop, O_CLOEXEC) != 0 || ::pipe2(ready, O_CLOEXEC) != 0)
    return Status::Unavailable("--concurrency: cannot make a pipe");
  // Each one's count of layers trained, in memory all of them share.
  counts_bytes_ = sizeof(std::atomic<uint64_t>) * static_cast<size_t>(processes);
  void* shared = ::mmap(nullptr, counts_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return Status::Unavailable("--concurrency: cannot map shared memory");
  counts_ = static_cast<std::atomic<uint64_t>*>(shared);
  for (int i = 0; i < processes; ++i) new (&counts_[i]) std::atomic<uint64_t>(0);
  stop_fd_ = stop[1];
  for (int i = 1; i <= processes; ++i) {
    const pid_t pid = ::fork();
    if (pid < 0) return Status::Unavailable("--concurrency: cannot fork");
    if (pid == 0) {
      ::close(stop[1]);
      ::close(ready[0]);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      Train(c, o, s, i, stop[0], ready[1], &counts_[i - 1]);
      ::_exit(0);
    }
    pids_.push_back(pid);
  }
  ::close(stop[0]);
  ::close(ready[1]);
  // Each says it has run its first pass; then every timing is under load.
  int got = 0;
  while (got < processes) {
    pollfd p{ready[0], POLLIN, 0};
    if (::poll(&p, 1, 120000) <= 0) break;
    char buf[16];
    const ssize_t n = ::read(ready[0], buf, sizeof buf);
    if (n <= 0) break;
    got += static_cast<int>(n);
  }
  ::close(ready[0]);
  if (got < processes) return Status::Unavailable("--concurrency: a load process did not start");
  return Status::Ok();
}

void BackgroundLoad::Run(int n) {
  for (size_t i = 0; i < pids_.size(); ++i) ::kill(pids_[i], static_cast<int>(i) < n ? SIGCONT : SIGSTOP);
}

uint64_t BackgroundLoad::BlocksTrained() const {
  uint64_t sum = 0;
  for (size_t i = 0; i < pids_.size(); ++i) sum += counts_[i].load(std::memory_order_relaxed);
  return sum;
}

void BackgroundLoad::Stop() {
  if (stop_fd_ >= 0) ::close(stop_fd_);
  stop_fd_ = -1;
  for (pid_t pid : pids_) {
    ::kill(pid, SIGCONT);  // a stopped one must run to see the pipe closed
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
  pids_.clear();
  if (counts_ != nullptr) ::munmap(counts_, counts_bytes_);
  counts_ = nullptr;
}

void BackgroundLoad::Train(const model::GptConfig& c, const MeasureOptions& o, int s, int which, int stop_fd,
                           int ready_fd, std::atomic<uint64_t>* count) {
  try {
    if (o.threads > 0) {
      torch::set_num_threads(o.threads);
      launch::SetBlasThreads(o.threads, o.threads);
    }
    torch::manual_seed(o.seed + static_cast<uint64_t>(which));
    const torch::Device dev(torch::kCPU);
    std::vector<model::PlannerLayer> layers;
    for (int i = 0; i < c.num_layers(); ++i) layers.push_back(model::MakeLayer(c, i, o.seed));
    const int b = o.microbatches.front();
    bool said = false;
    for (;;) {
      for (auto& layer : layers) {
        pollfd p{stop_fd, POLLIN, 0};
        if (::poll(&p, 1, 0) != 0) return;  // closed: the timing is over
        LayerInputs in = MakeInputs(c, layer->kind(), b, s, dev);
        torch::Tensor out = layer->forward(in.input, in.targets);
        if (layer->kind() == pb::LAYER_HEAD) out.backward();
        else out.backward(torch::randn_like(out));
        // Blocks only: each the same work, so a count is a measure of it
        // (the embedding and the head take a fraction of a block).
        if (layer->kind() == pb::LAYER_BLOCK) count->fetch_add(1, std::memory_order_relaxed);
      }
      if (!said) said = ::write(ready_fd, "r", 1) == 1;
    }
  } catch (const std::exception&) {
  }
}

std::vector<double> MeasureContention(const MeasureOptions& o, BackgroundLoad& load) {
  const int n = o.concurrency;
  constexpr int kBlocks = 4;
  // A window lasts until the k running have trained 16 blocks each (a
  // count's error, a block a process, is then within 1/16), at least 160
  // ms and at most 5 s: a window of 160 ms alone saw 0 or 1 blocks of a
  // GPT-2-sized model and gave curves below 1, a process computing faster
  // because another computes beside it.
  constexpr uint64_t kEach = 16;
  const auto settle = std::chrono::milliseconds(40), least = std::chrono::milliseconds(160),
             most = std::chrono::milliseconds(5000), poll = std::chrono::milliseconds(20);
  std::vector<double> layers(n, 0), seconds(n, 0);
  for (int r = 0; r < kBlocks; ++r) {
    for (int k = 1; k <= n; ++k) {
      load.Run(k);
      std::this_thread::sleep_for(settle);
      const uint64_t before = load.BlocksTrained();
      const auto t0 = Clock::now();
      std::this_thread::sleep_for(least);
      while (load.BlocksTrained() - before < kEach * static_cast<uint64_t>(k) && Clock::now() - t0 < most)
        std::this_thread::sleep_for(poll);
      layers[k - 1] += static_cast<double>(load.BlocksTrained() - before);
      seconds[k - 1] += Seconds(t0);
    }
  }
  std::vector<double> out(n, 1.0);
  const double alone = seconds[0] > 0 ? layers[0] / seconds[0] : 0;  // blocks per second
  for (int k = 2; k <= n; ++k) {
    const double rate = seconds[k - 1] > 0 ? layers[k - 1] / seconds[k - 1] : 0;
    // Never below 1: k processes do not each compute faster than one alone.
    out[k - 1] = alone > 0 && rate > 0 ? std::max(1.0, k * alone / rate) : 1.0;
  }
  return out;
}

}  // namespace ob::profile::detail
