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
#include <c10/cuda/CUDACachingAllocator.h>
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
  return torch::matmul(torch::softmax(att, -1), v);
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
  if (!enable || !device.is_cuda()) return;
  active_ = true;
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
#if OB_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(at::kCUDA, was_enabled_);
  at::autocast::set_autocast_dtype(at::kCUDA, was_dtype_);
#else
  at::autocast::set_enabled(was_enabled_);
  at::autocast::set_autocast_gpu_dtype(was_dtype_);
#endif
}

}  // namespace ob::compat
