// Version-dependent LibTorch calls (see torch_compat.h).
#include "ob/torch_compat.h"

#include <cstdio>
#include <cstdlib>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/version.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/cuda.h>

#ifdef OB_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace ob::compat {

torch::Tensor CausalSelfAttention(const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v) {
#if OB_TORCH_AT_LEAST(2, 0)
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                          /*is_causal=*/true);
#else
  const int64_t t = q.size(-2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto att = torch::matmul(q, k.transpose(-2, -1)) * scale;  // [b, a, t, t]
  auto future = torch::ones({t, t}, q.options().dtype(torch::kBool)).triu(1);
  att = att.masked_fill(future, -std::numeric_limits<float>::infinity());
  // Softmax in fp32 under bf16 autocast (CUDA's autocast does this itself).
  return torch::matmul(torch::softmax(att, -1, torch::kFloat).to(v.scalar_type()), v);
#endif
}

std::string TorchVersion() { return TORCH_VERSION; }

at::Generator MakeCpuGenerator(uint64_t seed) { return at::detail::createCPUGenerator(seed); }

bool FusedAdamWStep(torch::optim::AdamW& optimizer) {
#if OB_TORCH_AT_LEAST(2, 1)
  for (auto& group : optimizer.param_groups()) {  // first whether it applies, changing nothing
    if (static_cast<torch::optim::AdamWOptions&>(group.options()).amsgrad()) return false;
    for (const auto& p : group.params()) {
      const auto& g = p.grad();
      if (!g.defined()) continue;
      if (!p.is_cuda() || p.scalar_type() != at::kFloat || g.is_sparse() || g.scalar_type() != at::kFloat ||
          g.device() != p.device()) {
        return false;
      }
    }
  }
  torch::NoGradGuard no_grad;
  auto& state = optimizer.state();
  for (auto& group : optimizer.param_groups()) {
    const auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
    std::vector<torch::optim::AdamWParamState*> states;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const auto key = OptimizerStateKey(state, p);
      auto it = state.find(key);
      if (it == state.end()) {  // as AdamW::step() creates it
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        it = state.emplace(key, std::move(fresh)).first;
      }
      auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(s.exp_avg());
      exp_avg_sqs.push_back(s.exp_avg_sq());
      states.push_back(&s);
    }
    if (params.empty()) continue;
    // The kernel reads each parameter's step counter as the number of this
    // update (PyTorch's AdamW advances the counters before calling it): one
    // fp32 counter a parameter, the host's count + 1 (one fill, no copy,
    // when they agree, as they do when every parameter trains every step).
    bool same = true;
    for (auto* s : states) same = same && s->step() == states.front()->step();
    const auto f32 = params.front().options().dtype(at::kFloat);
    at::Tensor counters;
    if (same) {
      counters = torch::full({static_cast<int64_t>(states.size())},
                             static_cast<double>(states.front()->step() + 1), f32);
    } else {
      std::vector<float> host;
      for (auto* s : states) host.push_back(static_cast<float>(s->step() + 1));
      counters = torch::tensor(host).to(params.front().device());
    }
    std::vector<at::Tensor> steps = counters.unbind(0);
    const std::vector<at::Tensor> no_max;  // amsgrad's, unused
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, no_max, steps, o.lr(),
                      std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(),
                      /*amsgrad=*/false, /*maximize=*/false);
    for (auto* s : states) s->step(s->step() + 1);
  }
  return true;
#else
  (void)optimizer;
  return false;
#endif
}

bool TraceStart(bool cuda) {
  using torch::profiler::impl::ActivityType;
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda) activities.insert(ActivityType::CUDA);
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  try {
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

bool TraceStop(const std::string& path) {
  try {
    auto result = torch::autograd::profiler::disableProfiler();
    if (result) result->save(path);  // throws without Kineto (Debian's 1.13)
  } catch (const std::exception&) {
    return false;
  }
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

c10::intrusive_ptr<c10d::Store> MakeHashStore() { return c10::make_intrusive<c10d::HashStore>(); }

c10::intrusive_ptr<Backend> MakeProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                             int size, const torch::Device& device,
                                             std::chrono::milliseconds timeout) {
  if (device.is_cuda()) {
#ifdef OB_WITH_CUDA
    c10::cuda::set_device(device.index());
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
#else
    TORCH_CHECK(false, "this build of ob has no NCCL");
#endif
  }
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  // Gloo listens on, and advertises, this address: OB_GLOO_ADDR (the launch
  // worker sets it to its address facing the master), else loopback.
  const char* env = std::getenv("OB_GLOO_ADDR");
  const std::string addr = env != nullptr && *env != '\0' ? env : "127.0.0.1";
  // One Gloo device an address for the whole process, shared by its groups
  // (a device is a transport endpoint; each group's context makes its own
  // pairs on it). Each device runs a thread that wakes every 10 ms: one a
  // group had a worker of 8 groups wake 800 times a second doing nothing,
  // and a unit test's 200 groups (ranks as threads) spent more time in
  // epoll_wait than in training. Never freed: its thread must outlive
  // every group, and exit needs no join.
  static std::mutex mu;
  static auto* devices = new std::map<std::string, std::shared_ptr<::gloo::transport::Device>>;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto& d = (*devices)[addr];
    if (!d) d = c10d::ProcessGroupGloo::createDeviceForHostname(addr);
    opts->devices.push_back(d);
  }
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
}

void Synchronize(const torch::Device& device) {
#ifdef OB_WITH_CUDA
  // The current stream only: a whole-device synchronize would also wait for
  // the snapshot's copies on their side stream, which must overlap the next
  // step (seen on an H100: 78 ms of copies a step added to the step).
  if (device.is_cuda()) at::cuda::getCurrentCUDAStream(device.index()).synchronize();
#else
  (void)device;
#endif
}

int CudaDeviceCount() { return static_cast<int>(torch::cuda::device_count()); }

#ifdef OB_WITH_CUDA
int64_t CudaAllocatedBytes(int device) {
  // Index 0 is the aggregate over pool types in every version's StatType.
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].current;
}
uint64_t CudaTotalMemory(int device) { return at::cuda::getDeviceProperties(device)->totalGlobalMem; }
std::string CudaDeviceName(int device) { return at::cuda::getDeviceProperties(device)->name; }
std::string CudaDeviceUuid(int device) {
  const auto& u = at::cuda::getDeviceProperties(device)->uuid.bytes;
  std::string s = "GPU-";
  char hex[3];
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned char>(u[i]));
    s += hex;
  }
  return s;
}
#else
int64_t CudaAllocatedBytes(int) { return 0; }
uint64_t CudaTotalMemory(int) { return 0; }
std::string CudaDeviceName(int) { return "none"; }
std::string CudaDeviceUuid(int) { return ""; }
#endif

AutocastCacheScope::AutocastCacheScope(bool enable) : active_(enable) {
  // An outer nesting level: the guards inside it no longer reach level 0,
  // where they would clear the cache.
  if (active_) at::autocast::increment_nesting();
}

AutocastCacheScope::~AutocastCacheScope() {
  if (active_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

namespace {
// Autocast's state for one device type (CPU or CUDA), read and set.
bool AutocastOn(c10::DeviceType type) {
#if OB_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(type);
#else
  return type == c10::DeviceType::CUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

at::ScalarType AutocastDtypeOn(c10::DeviceType type) {
#if OB_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(type);
#else
  return type == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                       : at::autocast::get_autocast_cpu_dtype();
#endif
}

void SetAutocast(c10::DeviceType type, bool on, at::ScalarType dtype) {
#if OB_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(type, on);
  at::autocast::set_autocast_dtype(type, dtype);
#else
  if (type == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(on);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_cpu_enabled(on);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}
}  // namespace

std::optional<at::ScalarType> AutocastDtype(const torch::Tensor& x) {
  if (!x.is_cuda() && !x.is_cpu()) return std::nullopt;
  const auto type = x.is_cuda() ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  if (!AutocastOn(type)) return std::nullopt;
  return AutocastDtypeOn(type);
}

torch::Tensor CachedCast(const torch::Tensor& w, at::ScalarType dtype) {
  return at::autocast::cached_cast(dtype, w, w.is_cuda() ? c10::DeviceType::CUDA : c10::DeviceType::CPU);
}

void ForeachCopy(const std::vector<torch::Tensor>& to, const std::vector<torch::Tensor>& from) {
  TORCH_CHECK(to.size() == from.size(), "ForeachCopy: ", to.size(), " targets for ", from.size(), " sources");
#if OB_TORCH_AT_LEAST(2, 2)
  if (!to.empty()) at::_foreach_copy_(to, from);
#else
  for (size_t i = 0; i < to.size(); ++i) const_cast<torch::Tensor&>(to[i]).copy_(from[i]);
#endif
}

AutocastOff::AutocastOff()
    : guard_(std::make_unique<c10::impl::ExcludeDispatchKeyGuard>(c10::autocast_dispatch_keyset)) {}
AutocastOff::~AutocastOff() = default;

AutocastGuard::AutocastGuard(const torch::Device& device, bool enable) {
  if (!enable) return;
  active_ = true;
  cuda_ = device.is_cuda();
  const auto type = cuda_ ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  was_enabled_ = AutocastOn(type);
  was_dtype_ = AutocastDtypeOn(type);
  SetAutocast(type, true, at::kBFloat16);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  SetAutocast(cuda_ ? c10::DeviceType::CUDA : c10::DeviceType::CPU, was_enabled_, was_dtype_);
}

#ifdef OB_WITH_CUDA
int64_t CudaPeakAllocatedBytes(int device) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].peak;
}
void CudaResetPeak(int device) { c10::cuda::CUDACachingAllocator::resetPeakStats(device); }
std::string CudaVersion() {
  int v = 0;
  cudaRuntimeGetVersion(&v);
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}
std::string NcclVersion() {
  int v = 0;
  ncclGetVersion(&v);
  // NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}
#else
int64_t CudaPeakAllocatedBytes(int) { return 0; }
void CudaResetPeak(int) {}
std::string CudaVersion() { return ""; }
std::string NcclVersion() { return ""; }
#endif

std::vector<c10::intrusive_ptr<c10d::Work>> PostP2p(Backend& group,
                                                   const std::vector<P2pMessage>& batch) {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  works.reserve(batch.size());
  auto post = [&] {
    for (const P2pMessage& m : batch) {
      std::vector<torch::Tensor> t{m.tensor};
      works.push_back(m.send ? group.send(t, m.peer, m.tag) : group.recv(t, m.peer, m.tag));
    }
  };
#ifdef OB_WITH_CUDA
  if (!batch.empty() && batch.front().tensor.is_cuda()) {
#if OB_TORCH_AT_LEAST(2, 1)
    // As torch.distributed.batch_isend_irecv: one coalesced NCCL group whose
    // work stands for all of its messages.
    group.startCoalescing();
    try {
      post();
    } catch (...) {
      (void)group.endCoalescing();
      throw;
    }
    auto all = group.endCoalescing();
    works.clear();
    if (all) works.push_back(all);
    return works;
#else
    c10d::ProcessGroupNCCL::groupStart();
    try {
      post();
    } catch (...) {
      c10d::ProcessGroupNCCL::groupEnd();
      throw;
    }
    c10d::ProcessGroupNCCL::groupEnd();
    return works;
#endif
  }
#endif
  post();
  return works;
}

#ifdef OB_WITH_CUDA
struct DeviceTimer::Impl {
  bool cuda = false;
  std::chrono::steady_clock::time_point started;
  double seconds = 0;
  std::vector<std::pair<at::cuda::CUDAEvent, at::cuda::CUDAEvent>> intervals;
};
#else
struct DeviceTimer::Impl {
  bool cuda = false;
  std::chrono::steady_clock::time_point started;
  double seconds = 0;
};
#endif

DeviceTimer::DeviceTimer(const torch::Device& device) : impl_(std::make_unique<Impl>()) {
  impl_->cuda = device.is_cuda();
}
DeviceTimer::~DeviceTimer() = default;

void DeviceTimer::Start() {
#ifdef OB_WITH_CUDA
  if (impl_->cuda) {
    impl_->intervals.emplace_back(at::cuda::CUDAEvent(cudaEventDefault),
                                  at::cuda::CUDAEvent(cudaEventDefault));
    impl_->intervals.back().first.record();
    return;
  }
#endif
  impl_->started = std::chrono::steady_clock::now();
}

void DeviceTimer::Stop() {
#ifdef OB_WITH_CUDA
  if (impl_->cuda) {
    impl_->intervals.back().second.record();
    return;
  }
#endif
  impl_->seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - impl_->started).count();
}

double DeviceTimer::Seconds() {
#ifdef OB_WITH_CUDA
  if (impl_->cuda) {
    double total = 0;
    for (auto& [a, b] : impl_->intervals) {
      b.synchronize();
      total += a.elapsed_time(b) / 1000.0;
    }
    return total;
  }
#endif
  return impl_->seconds;
}

#ifdef OB_WITH_CUDA
namespace {
class CudaCopyFence : public CopyFence {
 public:
  at::cuda::CUDAEvent done;
  void Wait() override { done.synchronize(); }
};

struct CudaStreamMark : public StreamMark {
  at::cuda::CUDAEvent event;
};
}  // namespace

std::shared_ptr<StreamMark> MarkCurrentStream(const torch::Device& device) {
  auto mark = std::make_shared<CudaStreamMark>();
  mark->event.record(at::cuda::getCurrentCUDAStream(device.index()));
  return mark;
}

std::unique_ptr<CopyFence> CopyOnSideStream(
    const std::vector<std::pair<torch::Tensor, torch::Tensor>>& jobs, const torch::Device& device,
    StreamMark& after) {
  c10::cuda::OptionalCUDAGuard on_device;  // a thread of its own starts on device 0
  if (device.has_index()) on_device.set_index(device.index());
  auto side = at::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  static_cast<CudaStreamMark&>(after).event.block(side);
  auto fence = std::make_unique<CudaCopyFence>();
  {
    c10::cuda::CUDAStreamGuard guard(side);
    for (const auto& [host, dev] : jobs) host.copy_(dev, /*non_blocking=*/true);
  }
  fence->done.record(side);
  return fence;
}

bool PinHostRange(void* data, size_t bytes) {
  return cudaHostRegister(data, bytes, cudaHostRegisterDefault) == cudaSuccess;
}
void UnpinHostRange(void* data) { (void)cudaHostUnregister(data); }
#else
std::shared_ptr<StreamMark> MarkCurrentStream(const torch::Device&) {
  TORCH_CHECK(false, "this build of ob has no CUDA");
}

std::unique_ptr<CopyFence> CopyOnSideStream(
    const std::vector<std::pair<torch::Tensor, torch::Tensor>>&, const torch::Device&, StreamMark&) {
  TORCH_CHECK(false, "this build of ob has no CUDA");
}

bool PinHostRange(void*, size_t) { return false; }
void UnpinHostRange(void*) {}
#endif

}  // namespace ob::compat
