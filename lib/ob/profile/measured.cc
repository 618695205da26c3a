// Shapes: embed takes token ids [b, s] (int64) and gives [b, s, h]; a block
// maps [b, s, h] to [b, s, h]; the head takes [b, s, h] and targets [b, s]
// and gives the scalar mean cross-entropy loss.
#include "ob/profile/measured.h"

#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <thread>

#include <torch/torch.h>

#include "ob/build_info.h"
#include "ob/launch/worker/blas.h"
#include "ob/model/gpt.h"
#include "ob/model/train.h"
#include "ob/profile/analytic.h"
#include "ob/profile/collective.h"
#include "ob/profile/profile.h"
#include "ob/torch_compat.h"

namespace ob::profile {
namespace {

using Clock = std::chrono::steady_clock;

struct Samples {
  std::vector<double> v;
  double Median() const {
    auto s = v;
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  }
  double Mean() const {
    double sum = 0;
    for (double x : v) sum += x;
    return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
  }
  // On a GPU the median (event-timed, the repeats barely differ); on the
  // CPU the mean: its timings are skewed right by preemption, interrupts
  // and page faults, which a run pays as often as the repeats did (the
  // mean of gpt-tiny's layers is 4-7% above their median on this
  // project's 2-vCPU machine, 50 repeats), and under --concurrency a short
  // operation is preempted in some repeats and not in others, where the
  // median would pick one of the two.
  double Typical(const MeasureOptions& o) const {
    return o.concurrency > 1 || o.device.rfind("cuda", 0) != 0 ? Mean() : Median();
  }
  // (max − min) / median: how far the samples spread.
  double Spread() const {
    auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    double m = Median();
    return m > 0 ? (*hi - *lo) / m : 0.0;
  }
};

// Bytes of memory currently in use on `dev`: the CUDA caching allocator's
// count, or on CPU glibc's in-use heap (all arenas) plus mmapped blocks,
// which is where LibTorch's CPU allocator gets its memory.
int64_t InUseBytes(const torch::Device& dev) {
  if (dev.is_cuda()) return compat::CudaAllocatedBytes(dev.index());
  struct mallinfo2 mi = mallinfo2();
  return static_cast<int64_t>(mi.uordblks + mi.hblkhd);
}

uint64_t TensorBytes(const torch::Tensor& t) {
  return static_cast<uint64_t>(t.numel()) * t.element_size();
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// "model name" from /proc/cpuinfo, or the machine type.
std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos)
      return line.substr(line.find(':') + 2);
  }
  return "cpu";
}

struct LayerInputs {
  torch::Tensor input;    // ids for embed, activations otherwise
  torch::Tensor targets;  // ids (used by the head only)
};

LayerInputs MakeInputs(const model::GptConfig& c, pb::LayerKind kind, int b, int s,
                       const torch::Device& dev) {
  auto ids = torch::TensorOptions().dtype(torch::kInt64).device(dev);
  LayerInputs in;
  in.targets = torch::randint(c.vocab_size, {b, s}, ids);
  if (kind == pb::LAYER_EMBED) {
    in.input = torch::randint(c.vocab_size, {b, s}, ids);
  } else {
    in.input = torch::randn({b, s, c.n_embd}, torch::TensorOptions().device(dev)).requires_grad_(true);
  }
  return in;
}

// Runs warm-ups and timed repetitions of a step's pass through every layer
// (embed to head) at one micro-batch size: the forwards in order, each layer's output the
// next one's input, then the backwards in reverse, each fed the gradient
// the layer after it computed, timing every layer's forward and backward
// on its own, and counts the bytes each forward leaves alive. Chained, as
// a stage runs them, because a layer timed alone in a loop keeps its
// weights and gradients in the caches between repeats, where in a step the
// other layers have evicted them: gpt-tiny's layers timed alone summed to
// 0.80-0.88 of what a worker computing them in one stage measured on this
// project's CPU (issue 14).
std::vector<pb::LayerCost> MeasureChain(const model::GptConfig& c, std::vector<model::PlannerLayer>& layers,
                                        int b, int s, const torch::Device& dev, const MeasureOptions& o) {
  const size_t n = layers.size();
  std::vector<Samples> fwd(n), bwd(n);
  std::vector<int64_t> activation(n, -1);
  std::vector<uint64_t> output_bytes(n, 0);
  // Under bf16 the layers read their weights' compute copies, as a
  // worker's do (model/compute_copies.h): made once a step outside the
  // layers' times, and not in their activation bytes (parameter_bytes
  // counts them).
  std::unique_ptr<model::ComputeCopies> copies;
  if (o.bf16) copies = model::MakeComputeCopies(layers, torch::kBFloat16);
  for (int k = 0; k < o.warmup + o.repeats; ++k) {
    LayerInputs first = MakeInputs(c, layers.front()->kind(), b, s, dev);
    if (copies) copies->Refresh();
    model::ComputeCopies::Scope use_copies(copies.get());
    // Gradients accumulate from the first micro-batch on, as in a step of
    // several: the timed backwards add into the previous ones.
    if (k == 0)
      for (auto& layer : layers)
        for (auto& p : layer->parameters()) p.mutable_grad() = torch::Tensor();
    std::vector<torch::Tensor> inputs(n), outputs(n);
    // Each layer timed by the device (CUDA events; the host's clock on the
    // CPU), with no synchronisation between layers: a worker queues a
    // whole micro-batch, so its GPU runs layer after layer while the host
    // launches ahead. A synchronisation around every layer, as here before,
    // timed the launches of each layer's kernels as well and made
    // gpt2-medium's step on an H200 look 2.1x longer than it ran. (The
    // allocator's byte count needs none: it is kept on the host.)
    std::vector<std::unique_ptr<compat::DeviceTimer>> ft(n), bt(n);
    compat::Synchronize(dev);
    for (size_t i = 0; i < n; ++i) {
      inputs[i] = i == 0 ? first.input : outputs[i - 1].detach().requires_grad_(true);
      const int64_t before = InUseBytes(dev);
      ft[i] = std::make_unique<compat::DeviceTimer>(dev);
      ft[i]->Start();
      {
        compat::AutocastGuard autocast(dev, o.bf16);
        outputs[i] = layers[i]->forward(inputs[i], first.targets);
      }
      ft[i]->Stop();
      if (activation[i] < 0 && k >= o.warmup) {
        output_bytes[i] = TensorBytes(outputs[i]);
        activation[i] = std::max<int64_t>(0, InUseBytes(dev) - before - static_cast<int64_t>(output_bytes[i]));
      }
    }
    for (size_t i = n; i-- > 0;) {
      bt[i] = std::make_unique<compat::DeviceTimer>(dev);
      bt[i]->Start();
      if (i + 1 < n) outputs[i].backward(inputs[i + 1].grad());
      else outputs[i].backward();  // the head's output is the loss
      bt[i]->Stop();
      outputs[i] = torch::Tensor();  // its graph is spent; free it as a step does
    }
    if (k >= o.warmup) {
      for (size_t i = 0; i < n; ++i) {
        fwd[i].v.push_back(ft[i]->Seconds());
        bwd[i].v.push_back(bt[i]->Seconds());
      }
    }
  }
  std::vector<pb::LayerCost> costs(n);
  for (size_t i = 0; i < n; ++i) {
    costs[i].set_microbatch(b);
    costs[i].set_forward_seconds(fwd[i].Typical(o));
    costs[i].set_backward_seconds(bwd[i].Typical(o));
    costs[i].set_forward_spread(fwd[i].Spread());
    costs[i].set_backward_spread(bwd[i].Spread());
    costs[i].set_activation_bytes(static_cast<uint64_t>(activation[i]));
    costs[i].set_output_bytes(output_bytes[i]);
  }
  return costs;
}

// Optimizer state measured, not assumed: AdamW steps on the layer's
// gradients, then the bytes of every state tensor they created. Each timed
// step also takes the gradients' norms (one multi-tensor kernel, read by
// the host), as the workers do before clipping (stage_worker.cc);
// *update_seconds gets the median.
uint64_t OptimizerStateBytes(model::PlannerLayer& layer, const torch::Device& dev,
                             const MeasureOptions& o, double* update_seconds) {
  std::vector<torch::Tensor> params;
  for (auto& p : layer->parameters()) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    params.push_back(p);
  }
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-4));
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> saved;
    for (auto& p : params) saved.push_back(p.detach().clone());
    Samples t;
    std::vector<torch::Tensor> snapshot;  // CPU: one row each for weight, exp_avg, exp_avg_sq
    for (int k = 0; k < o.warmup + o.repeats; ++k) {
      compat::Synchronize(dev);
      const auto t0 = Clock::now();
      std::vector<torch::Tensor> grads;
      for (auto& p : params) grads.push_back(p.grad());
      (void)torch::stack(at::_foreach_norm(grads, 2)).to(torch::kDouble).cpu();
      model::OptimizerStep(opt);  // as the workers: fused on CUDA
      if (!dev.is_cuda()) {
        // The host snapshot: each step the workers copy the weights and
        // both moments into their arena (runtime/snapshot_arena.h), on a
        // thread of their own that on the CPU shares the cores with the
        // training (on a GPU, a copy engine does it off the critical path).
        if (snapshot.empty()) {
          for (auto& p : params) snapshot.push_back(torch::empty({3, p.numel()}));
        }
        for (size_t i = 0; i < params.size(); ++i) {
          const auto& st = static_cast<const torch::optim::AdamWParamState&>(
              *opt.state().at(compat::OptimizerStateKey(opt.state(), params[i])));
          snapshot[i][0].copy_(params[i].reshape(-1));
          snapshot[i][1].copy_(st.exp_avg().reshape(-1));
          snapshot[i][2].copy_(st.exp_avg_sq().reshape(-1));
        }
      }
      compat::Synchronize(dev);
      if (k >= o.warmup) t.v.push_back(Seconds(t0));
    }
    *update_seconds = t.Typical(o);
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(saved[i]);  // leave weights as built
  }
  uint64_t state = 0;
  for (const auto& kv : opt.state()) {
    const auto& st = static_cast<const torch::optim::AdamWParamState&>(*kv.second);
    state += TensorBytes(st.exp_avg()) + TensorBytes(st.exp_avg_sq());
    if (st.max_exp_avg_sq().defined()) state += TensorBytes(st.max_exp_avg_sq());
  }
  return state;
}

// A "KEY: N kB" line of a /proc file, in bytes (0 when unreadable).
uint64_t ProcBytes(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::strtoull(line.c_str() + key.size() + 1, nullptr, 10) * 1024;
  }
  return 0;
}

// VmRSS of this process, bytes (0 when unreadable).
uint64_t ResidentBytes() { return ProcBytes("/proc/self/status", "VmRSS"); }

// MemAvailable, bytes (0 when unreadable).
uint64_t AvailableHostBytes() { return ProcBytes("/proc/meminfo", "MemAvailable"); }

// Measuring holds every layer's weights and gradients and a micro-batch's
// activations at once: refused before any is made when even that (the
// analytic model's count, a lower bound: no AdamW state, no workspace)
// exceeds the memory here, which LibTorch's allocator reported as an
// internal error ("enforce fail at alloc_cpu.cpp"), or the kernel's OOM
// killer ended. kUnavailable naming both sizes.
Status CheckMemoryFor(const model::GptConfig& c, const MeasureOptions& o, int seq_len, const torch::Device& dev) {
  AnalyticOptions a;
  OB_ASSIGN_OR_RETURN(a.gpu, FindGpu("h100"));  // the bytes do not depend on the GPU
  a.microbatches = {o.microbatches.empty() ? 1 : *std::max_element(o.microbatches.begin(), o.microbatches.end())};
  a.seq_len = seq_len;
  a.fp32 = !o.bf16;
  a.max_group = 1;
  OB_ASSIGN_OR_RETURN(pb::Profile model, AnalyticProfile(c, a));
  uint64_t need = 0;
  for (const auto& l : model.layers()) {
    need += l.parameter_bytes() + l.gradient_bytes();
    if (l.costs_size() > 0) need += l.costs(0).activation_bytes();
  }
  const uint64_t have = dev.is_cuda() ? compat::CudaTotalMemory(dev.index()) : AvailableHostBytes();
  if (have == 0 || need <= have) return Status::Ok();
  auto gib = [](uint64_t b) { return std::to_string(static_cast<int64_t>(std::ceil(b / double(1ull << 30)))) + " GiB"; };
  return Status::Unavailable(
      "measuring " + c.name + " needs at least " + gib(need) + " (every layer's weights and gradients, and the "
      "activations of a micro-batch of " + std::to_string(a.microbatches[0]) + " x " + std::to_string(seq_len) +
      "), more than the " + gib(have) + (dev.is_cuda() ? " of the GPU" : " of memory available here") +
      ": model it with --analytic --gpu NAME, or measure a smaller model");
}

// --concurrency: processes that train the model's layers (forward and
// backward of each in turn, in a loop) while this one times them, so that
// the times are those of a worker sharing the machine's cores with others.
// All are forked once, before this process runs any torch op (a child of a
// process whose OpenMP pool exists is not promised a working one by
// libgomp, and Gloo's threads are not copied); while G ranks time an
// all-reduce, Run(W − G) keeps that many training and stops the rest
// (SIGSTOP). They exit when the pipe they watch closes: on Stop, or when
// this process dies.
class BackgroundLoad {
 public:
  ~BackgroundLoad() { Stop(); }

  // `processes` of them; each has said it ran its first pass on return.
  Status Start(const model::GptConfig& c, const MeasureOptions& o, int s, int processes) {
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

  // The first n keep training; the others wait, stopped.
  void Run(int n) {
    for (size_t i = 0; i < pids_.size(); ++i) ::kill(pids_[i], static_cast<int>(i) < n ? SIGCONT : SIGSTOP);
  }

  int processes() const { return static_cast<int>(pids_.size()); }

  // Layers trained so far by all of them together.
  uint64_t LayersTrained() const {
    uint64_t sum = 0;
    for (size_t i = 0; i < pids_.size(); ++i) sum += counts_[i].load(std::memory_order_relaxed);
    return sum;
  }

  void Stop() {
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

 private:
  static void Train(const model::GptConfig& c, const MeasureOptions& o, int s, int which, int stop_fd,
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
          count->fetch_add(1, std::memory_order_relaxed);
        }
        if (!said) said = ::write(ready_fd, "r", 1) == 1;
      }
    } catch (const std::exception&) {
    }
  }

  std::vector<pid_t> pids_;
  int stop_fd_ = -1;
  std::atomic<uint64_t>* counts_ = nullptr;
  size_t counts_bytes_ = 0;
};

// --concurrency N: how much slower a process trains with k processes
// training at once than alone, k = 1..N, from the load's throughput: with
// k of the load running (and this process asleep), the layers they train
// per second, over k times what one alone trains. Throughput, not one
// process's own time, because the cores are shared unevenly: with 3
// processes on 2 cores, the one a core has to itself runs at full speed
// for as long as the kernel leaves it there, and which one that is is luck.
// The k are taken in turn, kBlocks times over, so that a drift of the
// machine's speed falls on all of them alike. Under a pipeline's schedule
// the workers of a local cluster do not all compute at once (they wait for
// their neighbours), and ob-plan --local replays the schedule at the speed
// this curve gives for the number computing at each moment (schedule.h).
// REQUIRES: load.processes() >= N.
std::vector<double> MeasureContention(const MeasureOptions& o, BackgroundLoad& load) {
  const int n = o.concurrency;
  constexpr int kBlocks = 4;
  const auto settle = std::chrono::milliseconds(40), window = std::chrono::milliseconds(160);
  std::vector<double> layers(n, 0), seconds(n, 0);
  for (int r = 0; r < kBlocks; ++r) {
    for (int k = 1; k <= n; ++k) {
      load.Run(k);
      std::this_thread::sleep_for(settle);
      const uint64_t before = load.LayersTrained();
      const auto t0 = Clock::now();
      std::this_thread::sleep_for(window);
      layers[k - 1] += static_cast<double>(load.LayersTrained() - before);
      seconds[k - 1] += Seconds(t0);
    }
  }
  std::vector<double> out(n, 1.0);
  const double alone = seconds[0] > 0 ? layers[0] / seconds[0] : 0;  // layers per second
  for (int k = 2; k <= n; ++k) {
    const double rate = seconds[k - 1] > 0 ? layers[k - 1] / seconds[k - 1] : 0;
    out[k - 1] = alone > 0 && rate > 0 ? k * alone / rate : 1.0;
  }
  return out;
}

}  // namespace

Result<pb::Profile> MeasureProfile(const model::GptConfig& c, const MeasureOptions& o) {
  if (o.warmup < 0 || o.repeats < 1) return Status::Config("--warmup must be >= 0 and --repeats >= 1");
  if (o.max_group < 0) return Status::Config("--allreduce-max must be >= 1");
  OB_ASSIGN_OR_RETURN(pb::Profile p, NewLayerProfile(c, pb::PROFILE_MEASURED,
                                                     o.bf16 ? "bfloat16" : "float32", o.seq_len,
                                                     o.microbatches));
  const int s = static_cast<int>(p.sequence_length());
  torch::Device dev(torch::kCPU);
  try {
    dev = torch::Device(o.device);
  } catch (const std::exception&) {
    return Status::Config("unknown device '" + o.device + "' (use cpu or cuda[:N])");
  }
  if (dev.is_cuda()) {
#ifndef OB_WITH_CUDA
    return Status::Config("this ob was built without CUDA (LibTorch " OB_TORCH_VERSION " CPU); use --device cpu");
#endif
    if (compat::CudaDeviceCount() == 0) return Status::Unavailable("--device cuda: no CUDA device visible");
    if (!dev.has_index()) dev = torch::Device(torch::kCUDA, 0);
  }
  if (o.concurrency < 1) return Status::Config("--concurrency must be >= 1");
  OB_RETURN_IF_ERROR(CheckMemoryFor(c, o, s, dev));
  if (o.concurrency > 1 && dev.is_cuda())
    return Status::Config("--concurrency is for workers sharing CPU cores; on CUDA each worker has its GPU");
  // N − 1 train beside this process while it times the layers; one more
  // stands by (stopped) for the contention curve's k = N.
  BackgroundLoad load;
  if (o.concurrency > 1) {
    OB_RETURN_IF_ERROR(load.Start(c, o, s, o.concurrency));
    load.Run(o.concurrency - 1);
  }
  // --threads for the BLAS too: a profile "with one thread" whose OpenBLAS
  // kept a pool of every core ran its products 20-30% faster than the
  // one-thread workers it was to predict, and made a --concurrency load
  // twice too heavy.
  if (o.threads > 0) {
    torch::set_num_threads(o.threads);
    launch::SetBlasThreads(o.threads, o.threads);
  }
  torch::manual_seed(o.seed);
  uint64_t process_bytes = 0;
  if (!dev.is_cuda()) {
    // What a worker holds before its stage: the runtime's code and pools,
    // a Gloo group, one small op run.
    (void)TimeAllReduce({4096}, 1, "cpu", 0, 1);
    (void)torch::ones({64, 64}).matmul(torch::ones({64, 64})).sum().item<float>();
    process_bytes = ResidentBytes();
  }
  // Unset, the all-reduce groups go up to this node's GPUs (a one-GPU
  // machine times the group of one alone), or to 4 ranks on the CPU.
  const int max_group = o.max_group > 0 ? o.max_group : dev.is_cuda() ? compat::CudaDeviceCount() : 4;

  auto* d = p.mutable_device();
  d->set_kind(dev.is_cuda() ? "cuda" : "cpu");
  d->set_name(dev.is_cuda() ? compat::CudaDeviceName(dev.index())
                            : CpuModelName() + ", " + std::to_string(torch::get_num_threads()) +
                                  " threads");
  d->set_threads(torch::get_num_threads());
  d->set_concurrency(static_cast<uint32_t>(o.concurrency));
  d->set_process_bytes(process_bytes);
  d->set_devices_per_node(dev.is_cuda() ? compat::CudaDeviceCount() : 1);
  if (dev.is_cuda()) d->set_memory_bytes(compat::CudaTotalMemory(dev.index()));
  else d->set_memory_bytes(static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE));
  // The dense peak of the profile's dtype, for MFU, where the GPU's is
  // published (gpus.h).
  if (auto gpu = GpuForDevice(d->name()); dev.is_cuda() && gpu.ok()) d->set_peak_tflops(DensePeakTflops(*gpu, !o.bf16));
  p.set_warmup(o.warmup);
  p.set_repeats(o.repeats);
  p.set_torch_version(compat::TorchVersion());

  std::vector<model::PlannerLayer> layers;
  for (int i = 0; i < c.num_layers(); ++i) {
    model::PlannerLayer layer = model::MakeLayer(c, i, o.seed);
    layer->to(dev);
    auto* l = p.add_layers();
    l->set_index(i);
    l->set_kind(layer->kind());
    l->set_name(layer->name());
    uint64_t count = 0, bytes = 0;
    for (const auto& t : layer->parameters()) {
      count += static_cast<uint64_t>(t.numel());
      bytes += TensorBytes(t);
    }
    l->set_parameter_count(count);
    if (layer->kind() == pb::LAYER_HEAD)
      l->set_tied_parameter_count(static_cast<uint64_t>(c.vocab_size) * c.n_embd);
    // The fp32 weights, and under bf16 their compute copies (2 bytes each).
    l->set_parameter_bytes(bytes + (o.bf16 ? 2 * count : 0));
    l->set_gradient_bytes(bytes);  // fp32 gradients, one per weight
    layers.push_back(std::move(layer));
  }
  // The chain ties the head to the embed's token table, as a stage holding
  // both does (model/gpt.h); the layers above keep the head's own copy,
  // which its bytes count for stages without the embed.
  std::vector<model::PlannerLayer> chain = layers;
  if (chain.size() >= 2 && chain.back()->kind() == pb::LAYER_HEAD) {
    auto* embed = dynamic_cast<model::EmbedLayerImpl*>(chain.front().get());
    if (embed != nullptr) {
      chain.back() = std::make_shared<model::HeadLayerImpl>(c, o.seed, embed->token_table());
      chain.back()->to(dev);
    }
  }
  for (int b : o.microbatches) {
    const auto t0 = Clock::now();
    std::vector<pb::LayerCost> costs = MeasureChain(c, chain, b, s, dev, o);
    // The blocks again in each recomputation mode (model/recompute.h): what
    // they keep, and what their backward takes beyond none's. A full
    // block's backward runs its forward again: where the difference is
    // lost in the noise, that forward's own time stands for it.
    for (model::Recompute r : {model::Recompute::kSelective, model::Recompute::kFull}) {
      for (auto& layer : chain) layer->set_recompute(r);
      const std::vector<pb::LayerCost> again = MeasureChain(c, chain, b, s, dev, o);
      for (int i = 0; i < c.num_layers(); ++i) {
        if (chain[static_cast<size_t>(i)]->kind() != pb::LAYER_BLOCK) continue;
        const double extra = again[i].backward_seconds() - costs[i].backward_seconds();
        if (r == model::Recompute::kSelective) {
          costs[i].set_selective_activation_bytes(again[i].activation_bytes());
          costs[i].set_selective_recompute_seconds(std::max(0.0, extra));
        } else {
          costs[i].set_full_activation_bytes(again[i].activation_bytes());
          costs[i].set_full_recompute_seconds(extra > 0 ? extra : costs[i].forward_seconds());
        }
      }
    }
    for (auto& layer : chain) layer->set_recompute(model::Recompute::kNone);
    for (int i = 0; i < c.num_layers(); ++i) *p.mutable_layers(i)->add_costs() = costs[i];
    if (o.progress)
      o.progress("micro-batch " + std::to_string(b) + ", " + std::to_string(c.num_layers()) + " layers chained: " +
                 std::to_string(static_cast<int>(Seconds(t0) * 1e3)) + " ms");
  }
  if (o.concurrency > 1) {
    const auto t0 = Clock::now();
    for (double x : MeasureContention(o, load)) d->add_contention(x);
    load.Run(o.concurrency - 1);
    if (o.progress) {
      std::string curve;
      for (double x : d->contention()) curve += (curve.empty() ? "" : " ") + std::to_string(x).substr(0, 4);
      o.progress("contention, 1-" + std::to_string(o.concurrency) + " computing: " + curve + " in " +
                 std::to_string(static_cast<int>(Seconds(t0) * 1e3)) + " ms");
    }
  }
  for (int i = 0; i < c.num_layers(); ++i) {
    const auto t0 = Clock::now();
    double update = 0;
    auto* l = p.mutable_layers(i);
    l->set_optimizer_state_bytes(OptimizerStateBytes(layers[i], dev, o, &update));
    l->set_update_seconds(update);
    if (o.progress)
      o.progress("layer " + std::to_string(i + 1) + "/" + std::to_string(c.num_layers()) + " " +
                 layers[i]->name() + " update: " + std::to_string(static_cast<int>(Seconds(t0) * 1e3)) + " ms");
  }
  chain.clear();
  layers.clear();

  // Gradient all-reduce: every distinct gradient size, each group size once;
  // and a block's output of one micro-batch, the bytes a stage boundary and
  // a tensor-parallel all-reduce move, so that ob-plan --local prices those
  // from a measured point instead of extrapolating the gradients' line down
  // to them. Each block gets its gradient's entries, then its output's.
  std::vector<uint64_t> sizes;
  for (const auto& l : p.layers()) sizes.push_back(l.gradient_bytes());
  uint64_t output_bytes = 0;
  for (const auto& l : p.layers())
    if (l.kind() == pb::LAYER_BLOCK && l.costs_size() > 0) output_bytes = l.costs(0).output_bytes();
  if (output_bytes > 0) sizes.push_back(output_bytes);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  std::map<int, std::map<uint64_t, double>> timed;  // group → bytes → seconds
  for (int g = 1; g <= max_group; g *= 2) {
    auto t0 = Clock::now();
    // The group's ranks and, under --concurrency, as many processes
    // training beside them as make up the workers sharing the machine.
    load.Run(o.concurrency - g);
    // Sharing the cores, each rank computes between its all-reduces as a
    // worker does (collective.h): a block's MLP product of one micro-batch.
    Between between;
    if (o.concurrency > 1) between = {static_cast<int64_t>(o.microbatches.front()) * s, c.n_embd, 4 * c.n_embd};
    auto times = TimeAllReduce(sizes, g, dev.str(), o.warmup, o.repeats, between);
    if (!times.ok()) return times.status();
    for (size_t i = 0; i < sizes.size(); ++i) timed[g][sizes[i]] = (*times)[i];
    if (o.progress)
      o.progress("all-reduce, group of " + std::to_string(g) + ": " + std::to_string(sizes.size()) +
                 " sizes in " + std::to_string(static_cast<int>(Seconds(t0) * 1e3)) + " ms");
  }
  load.Stop();
  for (auto& l : *p.mutable_layers()) {
    auto add = [&l, &timed](uint64_t bytes) {
      for (const auto& [g, by_size] : timed) {
        auto* ar = l.add_allreduce();
        ar->set_group_size(g);
        ar->set_bytes(bytes);
        ar->set_seconds(by_size.at(bytes));
      }
    };
    add(l.gradient_bytes());
    if (l.kind() == pb::LAYER_BLOCK && output_bytes > 0) add(output_bytes);
  }
  // FLOPs per micro-batch are a property of the shapes, not the device.
  for (auto& l : *p.mutable_layers()) {
    for (auto& cost : *l.mutable_costs()) {
      double flops = TrainingFlopsPerToken(c, l.kind(), s) * cost.microbatch() * s;
      cost.set_forward_flops(flops / 3.0);
      cost.set_backward_flops(flops * 2.0 / 3.0);
    }
  }
  return p;
}

}  // namespace ob::profile
