// Version-dependent LibTorch calls (see torch_compat.h).
#include "ob/torch_compat.h"

#include <cstdlib>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/version.h>

#include <cmath>
#include <limits>

#include <ATen/autocast_mode.h>
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
  const char* addr = std::getenv("OB_GLOO_ADDR");
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(
      addr != nullptr && *addr != '\0' ? addr : "127.0.0.1"));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
}

void Synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

int CudaDeviceCount() { return static_cast<int>(torch::cuda::device_count()); }

#ifdef OB_WITH_CUDA
int64_t CudaAllocatedBytes(int device) {
  // Index 0 is the aggregate over pool types in every version's StatType.
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].current;
}
uint64_t CudaTotalMemory(int device) { return at::cuda::getDeviceProperties(device)->totalGlobalMem; }
std::string CudaDeviceName(int device) { return at::cuda::getDeviceProperties(device)->name; }
#else
int64_t CudaAllocatedBytes(int) { return 0; }
uint64_t CudaTotalMemory(int) { return 0; }
std::string CudaDeviceName(int) { return "none"; }
#endif

AutocastGuard::AutocastGuard(const torch::Device& device, bool enable) {
  if (!enable) return;
  active_ = true;
  cuda_ = device.is_cuda();
  if (!cuda_) {
#if OB_TORCH_AT_LEAST(2, 4)
    was_enabled_ = at::autocast::is_autocast_enabled(at::kCPU);
    was_dtype_ = at::autocast::get_autocast_dtype(at::kCPU);
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
#else
    was_enabled_ = at::autocast::is_cpu_enabled();
    was_dtype_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
#endif
    at::autocast::increment_nesting();
    return;
  }
#if OB_TORCH_AT_LEAST(2, 4)
  was_enabled_ = at::autocast::is_autocast_enabled(at::kCUDA);
  was_dtype_ = at::autocast::get_autocast_dtype(at::kCUDA);
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
#else
  was_enabled_ = at::autocast::is_enabled();
  was_dtype_ = at::autocast::get_autocast_gpu_dtype();
  at::autocast::set_enabled(true);
  at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
#endif
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  if (!cuda_) {
#if OB_TORCH_AT_LEAST(2, 4)
    at::autocast::set_autocast_enabled(at::kCPU, was_enabled_);
    at::autocast::set_autocast_dtype(at::kCPU, was_dtype_);
#else
    at::autocast::set_cpu_enabled(was_enabled_);
    at::autocast::set_autocast_cpu_dtype(was_dtype_);
#endif
    return;
  }
#if OB_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(at::kCUDA, was_enabled_);
  at::autocast::set_autocast_dtype(at::kCUDA, was_dtype_);
#else
  at::autocast::set_enabled(was_enabled_);
  at::autocast::set_autocast_gpu_dtype(was_dtype_);
#endif
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
}  // namespace

std::unique_ptr<CopyFence> CopyOnSideStream(
    const std::vector<std::pair<torch::Tensor, torch::Tensor>>& jobs, const torch::Device& device) {
  auto current = at::cuda::getCurrentCUDAStream(device.index());
  at::cuda::CUDAEvent ready;
  ready.record(current);
  auto side = at::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  ready.block(side);
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
std::unique_ptr<CopyFence> CopyOnSideStream(
    const std::vector<std::pair<torch::Tensor, torch::Tensor>>&, const torch::Device&) {
  TORCH_CHECK(false, "this build of ob has no CUDA");
}

bool PinHostRange(void*, size_t) { return false; }
void UnpinHostRange(void*) {}
#endif

}  // namespace ob::compat
