// Host snapshots of a stage's parameters and AdamW state (see snapshot.h).
#include "ob/runtime/snapshot.h"

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>
#include <sstream>
#include <string>
#include <type_traits>

#include "ob/torch_compat.h"

namespace ob::runtime {

namespace {

using CopyJobs = std::vector<std::pair<torch::Tensor, torch::Tensor>>;  // (host, source)

// Lays `into` out for `stage`'s state (reusing its buffers when the names
// and shapes match; pinned when the source lives on CUDA) and returns the
// copies that fill it. Labels `into` invalid (step -2). Sets *cuda when a
// source is on a GPU.
CopyJobs PlanCopies(const model::GptStage& stage, const torch::Tensor& tied,
                    torch::optim::AdamW& optimizer, StageSnapshot* into, bool* cuda) {
  torch::NoGradGuard no_grad;
  into->step = -2;  // invalid until complete: a throw leaves it unusable
  StageSnapshot live = LiveView(stage, tied, optimizer, -2);
  into->first_layer = live.first_layer;
  into->last_layer = live.last_layer;
  into->ranges = live.ranges;
  into->tp = live.tp;
  into->tp_rank = live.tp_rank;
  CopyJobs jobs;
  *cuda = false;
  auto buffer = [&](const torch::Tensor& src, torch::Tensor* buf) {
    if (!buf->defined() || !buf->sizes().equals(src.sizes()) || buf->dtype() != src.dtype()) {
      *buf = torch::empty(src.sizes(),
                          src.options().device(torch::kCPU).pinned_memory(src.is_cuda()));
    }
    *cuda = *cuda || src.is_cuda();
    jobs.emplace_back(*buf, src);
  };
  for (const auto& [key, from] : live.tensors) {
    TensorSnapshot& t = into->tensors[key];
    buffer(from.value, &t.value);
    buffer(from.exp_avg, &t.exp_avg);
    buffer(from.exp_avg_sq, &t.exp_avg_sq);
    t.adam_step = from.adam_step;
  }
  return jobs;
}

}  // namespace

int64_t StageSnapshot::bytes() const {
  int64_t n = 0;
  for (const auto& [name, t] : tensors) {
    n += t.value.nbytes() + t.exp_avg.nbytes() + t.exp_avg_sq.nbytes();
  }
  return n;
}

StageSnapshot LiveView(const model::GptStage& stage, const torch::Tensor& tied,
                       torch::optim::AdamW& optimizer, int64_t step) {
  torch::NoGradGuard no_grad;
  StageSnapshot out;
  out.step = step;
  out.first_layer = stage->first();
  out.last_layer = stage->last();
  if (stage->chunks() > 1) out.ranges = stage->ranges();
  out.tp = stage->tp() ? stage->tp()->size : 1;
  out.tp_rank = stage->tp() ? stage->tp()->rank : 0;
  auto& state = optimizer.state();
  for (const auto& item : stage->named_parameters()) {
    const torch::Tensor& p = item.value();
    TensorSnapshot& t = out.tensors[SnapshotKey(item.key(), p, tied)];
    t.value = p.detach();
    auto it = state.find(compat::OptimizerStateKey(state, p));
    if (it == state.end()) {  // no state yet (before the first update): zeros
      t.exp_avg = torch::zeros_like(t.value);
      t.exp_avg_sq = torch::zeros_like(t.value);
      t.adam_step = 0;
    } else {
      auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
      t.exp_avg = s.exp_avg().detach();
      t.exp_avg_sq = s.exp_avg_sq().detach();
      t.adam_step = s.step();
    }
  }
  return out;
}

void CaptureSnapshot(const model::GptStage& stage, const torch::Tensor& tied,
                     torch::optim::AdamW& optimizer, int64_t step, StageSnapshot* into) {
  bool cuda = false;
  CopyJobs jobs = PlanCopies(stage, tied, optimizer, into, &cuda);
  torch::NoGradGuard no_grad;
  for (auto& [host, src] : jobs) host.copy_(src);
  into->step = step;
}

// The copy thread: one copy at a time. `work` copies (and holds the
// references it copies from until it returns); `then` runs after a
// successful copy.
struct SnapshotCopier::Thread {
  std::mutex mu;
  std::condition_variable cv;
  std::function<void()> work;
  std::function<void()> then;
  bool busy = false, quit = false;
  std::exception_ptr error;
  std::thread thread;

  Thread() {
    thread = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu);
      for (;;) {
        cv.wait(lock, [this] { return quit || busy; });
        if (quit) return;
        auto todo = std::move(work);
        auto done = std::move(then);
        lock.unlock();
        std::exception_ptr failed;
        try {
          torch::NoGradGuard no_grad;
          todo();
          todo = nullptr;  // drop the references before saying done
          if (done) done();
        } catch (...) {
          failed = std::current_exception();
        }
        todo = nullptr;
        lock.lock();
        error = failed;
        busy = false;
        cv.notify_all();
      }
    });
  }
  ~Thread() {
    {
      std::lock_guard<std::mutex> lock(mu);
      quit = true;
    }
    cv.notify_all();
    thread.join();
  }
  void Run(std::function<void()> w, std::function<void()> t) {
    std::lock_guard<std::mutex> lock(mu);
    work = std::move(w);
    then = std::move(t);
    error = nullptr;
    busy = true;
    cv.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [this] { return !busy; });
    if (error) std::rethrow_exception(error);
  }
};

SnapshotCopier::SnapshotCopier() = default;

SnapshotCopier::~SnapshotCopier() {
  try {
    Wait();
  } catch (...) {
    // The snapshot stays invalid; nothing else to do in a destructor.
  }
}

void SnapshotCopier::Start(const model::GptStage& stage, const torch::Tensor& tied,
                           torch::optim::AdamW& optimizer, int64_t step, StageSnapshot* into,
                           std::function<void(const StageSnapshot&)> on_copied) {
  Wait();
  bool cuda = false;
  CopyJobs jobs = PlanCopies(stage, tied, optimizer, into, &cuda);
  into_ = into;
  std::function<void()> work;
  if (cuda) {
    // The copies wait for the update queued so far; the copy thread
    // queues them on a side stream and waits for them there. Queuing them
    // here cost the training thread one call a tensor (876 a gpt2-medium
    // step, 7 ms of 250 on an H200), and a copy into memory not yet
    // page-locked (an arena slot being locked) blocks its caller for the
    // whole transfer.
    const torch::Device device = stage->parameters().front().device();
    work = [jobs = std::move(jobs), device, mark = compat::MarkCurrentStream(device)] {
      compat::CopyOnSideStream(jobs, device, *mark)->Wait();
    };
  } else {
    work = [jobs = std::move(jobs)] {
      for (auto& [host, src] : jobs) host.copy_(src);
    };
  }
  if (!thread_) thread_ = std::make_unique<Thread>();
  // The label and the callback on the copy thread, once every byte is in
  // place; the training thread reads `into` only after Wait.
  thread_->Run(std::move(work), [into, step, cb = std::move(on_copied)] {
    into->step = step;
    if (cb) cb(*into);
  });
}

StageSnapshot* SnapshotCopier::Wait() {
  if (into_ == nullptr) return nullptr;
  StageSnapshot* done = into_;
  into_ = nullptr;
  thread_->Wait();  // labelled there
  return done;
}

void SetAdamState(torch::optim::AdamW& optimizer, const torch::Tensor& p,
                  const TensorSnapshot& snap) {
  auto& state = optimizer.state();
  const auto key = compat::OptimizerStateKey(state, p);
  state.erase(key);
  if (snap.adam_step == 0) return;
  auto s = std::make_unique<torch::optim::AdamWParamState>();
  s->step(snap.adam_step);
  s->exp_avg(snap.exp_avg.to(p.device(), /*non_blocking=*/false, /*copy=*/true));
  s->exp_avg_sq(snap.exp_avg_sq.to(p.device(), /*non_blocking=*/false, /*copy=*/true));
  state[key] = std::move(s);
}

}  // namespace ob::runtime
