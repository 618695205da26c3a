// torch_compat: the one place where ob's code differs between the LibTorch
// versions it builds against (Debian's 1.13 CPU build and 2.x with CUDA).
// Everything else calls these shims and stays version-free. Add a shim here,
// with the version test in torch_compat.cc, rather than #if-ing elsewhere.
//
// Thread-safety: stateless functions. Failure: LibTorch exceptions
// (c10::Error) propagate to the caller, which catches them at its boundary.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/torch.h>
#include <torch/version.h>

#include <chrono>
#include <memory>
#include <optional>
#include <utility>
#include <vector>
#include <sstream>
#include <type_traits>
#include <string>

#define OB_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||     \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#if OB_TORCH_AT_LEAST(2, 0)
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

namespace ob::compat {

// Causal scaled-dot-product attention: softmax(QK^T / sqrt(d) + mask) V with
// the upper triangle masked. q, k, v: [b, a, t, d]; returns [b, a, t, d].
// Fused (at::scaled_dot_product_attention) on LibTorch >= 2.0.
torch::Tensor CausalSelfAttention(const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v);

// The LibTorch version compiled against, e.g. "1.13.0".
std::string TorchVersion();

// A CPU random generator seeded with `seed`, for deterministic initialisation.
at::Generator MakeCpuGenerator(uint64_t seed);

// --- optimizers ----------------------------------------------------------------
// The key of parameter `p` in torch::optim's state map: LibTorch 1.13 keys it
// by the TensorImpl address printed as a string, 2.x by the address itself;
// the map's key type says which.
template <typename Map>
typename Map::key_type OptimizerStateKey(const Map&, const torch::Tensor& p) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;  // as c10::guts::to_string(TensorImpl*)
    key << p.unsafeGetTensorImpl();
    return key.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

// --- optimizers: the fused step ---------------------------------------------
// One AdamW update of every parameter of `optimizer` that has a gradient,
// the math of torch::optim::AdamW::step() (decoupled weight decay, bias
// corrections, no amsgrad) in one fused multi-tensor kernel per parameter
// group (at::_fused_adamw_) instead of about seven kernels per parameter.
// The moments stay in the optimizer's own state map, created there as
// AdamW::step() would, so snapshots and checkpoints see no difference.
// Returns false, having changed nothing, where the fused kernel does not
// apply: LibTorch < 2.1, a CPU or non-fp32 parameter, a sparse gradient,
// amsgrad; the caller then calls optimizer.step(). Results equal step()'s
// up to rounding (the kernel keeps intermediate values in registers).
bool FusedAdamWStep(torch::optim::AdamW& optimizer);

// --- tracing -------------------------------------------------------------------
// A Kineto trace (the ops, and the CUDA kernels and copies when `cuda`) of
// what this process runs between TraceStart and TraceStop, written by
// TraceStop as Chrome trace JSON to `path`. On a LibTorch built without
// Kineto (Debian's 1.13) the profiler may start, but the file
// is not written. Neither throws: false says the profiler would not start
// or wrote no file, and training goes on untraced.
bool TraceStart(bool cuda);
bool TraceStop(const std::string& path);

// --- c10d ------------------------------------------------------------------
// What a Gloo/NCCL group object is: c10d::Backend since 2.0, ProcessGroup before.
#if OB_TORCH_AT_LEAST(2, 0)
using Backend = c10d::Backend;
#else
using Backend = c10d::ProcessGroup;
#endif

// c10d::Store subclasses (launch/worker/relay_store.h): newer LibTorch 2.x
// declares a pure virtual `c10::intrusive_ptr<Store> clone()`; 1.13 has
// none. A subclass declares `virtual c10::intrusive_ptr<c10d::Store> clone()`
// without `override`: it overrides the base's where there is one and is an
// ordinary member where not, so the same source builds against both.

// An in-memory store for groups whose ranks are threads of this process.
c10::intrusive_ptr<c10d::Store> MakeHashStore();


// A communication group: Gloo for CPU tensors (on $OB_GLOO_ADDR, default
// loopback), NCCL for CUDA
// (REQUIRES: a CUDA build). Blocks until all `size` ranks joined via `store`.
c10::intrusive_ptr<Backend> MakeProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                             int size, const torch::Device& device,
                                             std::chrono::milliseconds timeout);

// --- devices -----------------------------------------------------------------
// Waits for the work queued on `device`'s current stream (not on side
// streams, such as the snapshot's copies); no-op on CPU.
void Synchronize(const torch::Device& device);
int CudaDeviceCount();                  // 0 in a CPU build
int64_t CudaAllocatedBytes(int device); // live bytes of the caching allocator
uint64_t CudaTotalMemory(int device);
std::string CudaDeviceName(int device);
// The GPU's UUID as nvidia-smi -L prints it ("GPU-1a2b3c4d-…"), the same in
// every process and container that sees the GPU; "" without CUDA.
std::string CudaDeviceUuid(int device);

// Keeps autocast's casts of the weights (fp32 leaves to bf16) from one
// AutocastGuard to the next while it lives, and drops them when it ends:
// over a step's micro-batches each weight is cast once, not once a
// micro-batch. REQUIRES: no weight changes while it lives (the optimizer
// runs after it), and no no-grad forward under it (a cast made without
// grad would be reused with grad). Does nothing when !enable.
class AutocastCacheScope {
 public:
  explicit AutocastCacheScope(bool enable);
  ~AutocastCacheScope();
  AutocastCacheScope(const AutocastCacheScope&) = delete;
  AutocastCacheScope& operator=(const AutocastCacheScope&) = delete;

 private:
  bool active_ = false;
};

// The dtype autocast computes in for tensors on `x`'s device type (bf16
// under AutocastGuard), or nullopt where autocast is off there.
std::optional<at::ScalarType> AutocastDtype(const torch::Tensor& x);

// `w` in `dtype` through autocast's cache: an fp32 leaf that requires
// grad (a weight) is cast once while an AutocastGuard or AutocastCacheScope
// lives, like the weights autocast casts for its own ops; anything else is
// cast each call. Differentiable (the gradient comes back in fp32).
torch::Tensor CachedCast(const torch::Tensor& w, at::ScalarType dtype);

// to[i].copy_(from[i]) for every i (REQUIRES: equal sizes and strides
// pairwise): one multi-tensor kernel per few dozen tensors on CUDA where
// LibTorch has _foreach_copy_ (>= 2.2; casting included), one copy each
// elsewhere.
void ForeachCopy(const std::vector<torch::Tensor>& to, const std::vector<torch::Tensor>& from);

// Autocast off for the calls made while it lives: they compute in the
// dtypes of their inputs.
class AutocastOff {
 public:
  AutocastOff();
  ~AutocastOff();
  AutocastOff(const AutocastOff&) = delete;
  AutocastOff& operator=(const AutocastOff&) = delete;

 private:
  std::unique_ptr<c10::impl::ExcludeDispatchKeyGuard> guard_;
};

// Scoped bf16 autocast on `device`'s type (CUDA or CPU); does nothing when
// !enable. Nestable; restores the previous state.
class AutocastGuard {
 public:
  AutocastGuard(const torch::Device& device, bool enable);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;
  bool cuda_ = false;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kHalf;
};

int64_t CudaPeakAllocatedBytes(int device);  // since the last reset; 0 in a CPU build
void CudaResetPeak(int device);

// The CUDA and NCCL versions this build runs with ("" in a CPU build).
std::string CudaVersion();
std::string NcclVersion();

// --- point-to-point ------------------------------------------------------------
// One message of a batch (PostP2p).
struct P2pMessage {
  bool send = true;
  torch::Tensor tensor;   // what is sent, or where a receive lands (contiguous)
  int peer = 0;           // rank in `group`
  int tag = 0;
};

// Posts `batch` at once and returns its works, in order. Under NCCL (CUDA
// tensors) the messages form one group (ncclGroupStart/End), so they
// progress together and a send does not wait for the peer to reach a
// receive issued later; under Gloo each is asynchronous anyway.
std::vector<c10::intrusive_ptr<c10d::Work>> PostP2p(Backend& group,
                                                   const std::vector<P2pMessage>& batch);

// --- timing ----------------------------------------------------------------------
// Accumulates the time of intervals on `device`'s compute stream: CUDA
// events on a GPU (the host does not wait; Seconds() synchronises with the
// last interval's end), the steady clock on the CPU.
class DeviceTimer {
 public:
  explicit DeviceTimer(const torch::Device& device);
  ~DeviceTimer();
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;
  void Start();
  void Stop();
  double Seconds();  // the sum of the intervals so far

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// --- asynchronous device-to-host copies ---------------------------------------
// A point in the work queued so far on `device`'s current stream (a CUDA
// event), for another thread's stream to wait for. REQUIRES a CUDA build.
class StreamMark {
 public:
  virtual ~StreamMark() = default;
};
std::shared_ptr<StreamMark> MarkCurrentStream(const torch::Device& device);

// Copies each jobs[i].second (device) into jobs[i].first (host) on a side
// stream that first waits for `after` (a mark, taken on the thread that
// queued what the copies must follow); the returned fence's Wait() blocks
// until the copies are done. Callable from any thread. REQUIRES a CUDA build and CUDA sources (CPU copies are
// the caller's, see SnapshotCopier).
class CopyFence {
 public:
  virtual ~CopyFence() = default;
  virtual void Wait() = 0;
};
std::unique_ptr<CopyFence> CopyOnSideStream(
    const std::vector<std::pair<torch::Tensor, torch::Tensor>>& jobs, const torch::Device& device,
    StreamMark& after);

// Page-locks [data, data + bytes) for fast, asynchronous device copies
// (cudaHostRegister); false where there is no CUDA or it failed (the copies
// then still work, at pageable speed).
bool PinHostRange(void* data, size_t bytes);
// Undoes PinHostRange for the range that starts at data (cudaHostUnregister).
void UnpinHostRange(void* data);

}  // namespace ob::compat
