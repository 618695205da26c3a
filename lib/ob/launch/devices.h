// Devices, precision and threads on the launch side (design §5 "Devices"):
// what ob-launch --device and --precision mean, which GPU each worker of a
// host gets, and how many CPU threads. Torch-free and pure: the callers
// pass what they measured (GPU count, cores, the environment's values).
//
//   --device auto|cpu|cuda   auto: CUDA where the worker sees a GPU
//   --precision fp32|bf16    default: bf16 on CUDA, fp32 on CPU
//
// One worker per GPU: the agent gives the worker in slot (local rank) s
// CUDA_VISIBLE_DEVICES=s, or the s-th entry of the list the agent itself
// was given, and the worker uses cuda:0. A host with fewer GPUs than the
// plan puts workers on it is refused. Threads: each worker gets
// OMP_NUM_THREADS (and OPENBLAS_/MKL_NUM_THREADS) = max(1, cores / workers
// on the host), unless the agent's environment sets them, as torchrun does;
// a BLAS pool the environment leaves unsized follows its OMP_NUM_THREADS.
#pragma once

#include <string>
#include <vector>

#include "ob/status.h"

namespace ob::launch {

enum class DeviceKind { kAuto, kCpu, kCuda };

// "auto", "cpu" or "cuda"; kUsage otherwise.
Result<DeviceKind> ParseDevice(const std::string& name);
const char* DeviceName(DeviceKind d);
// What a process that sees `gpus` GPUs runs on: auto → cuda when gpus > 0.
DeviceKind ResolveDevice(DeviceKind asked, int gpus);
// "fp32" or "bf16" (as given, or "" for the device's default: bf16 on
// CUDA, fp32 otherwise); kUsage on anything else. REQUIRES: `resolved` is
// not kAuto.
Result<std::string> ResolvePrecision(const std::string& given, DeviceKind resolved);
// "gloo" on CPU, "nccl" on CUDA.
const char* BackendName(DeviceKind resolved);

// CUDA_VISIBLE_DEVICES for the worker in `slot`: the slot's entry of
// `inherited` (the agent's own CUDA_VISIBLE_DEVICES, a comma-separated list;
// "" or unset: all GPUs, numbered from 0). kConfig when the list is shorter.
Result<std::string> VisibleDeviceFor(int slot, const std::string* inherited);

// kConfig "host H has G GPU(s) and the plan puts W workers on it (--device
// cuda)" when workers > gpus; Ok otherwise.
Status CheckGpus(const std::string& host, int workers, int gpus);

// Threads per worker on a host of `cores` cores running `workers` workers.
int ThreadsPerWorker(int cores, int workers);
// The variables the agent sets per worker, in this order.
inline const std::vector<std::string>& ThreadVariables() {
  static const std::vector<std::string> v = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"};
  return v;
}

// One thread variable of a worker and where its value comes from.
struct ThreadSetting {
  enum Origin {
    kShare,        // the worker's share of the cores, set by the agent
    kInherited,    // the agent's environment sets it: the worker inherits it
    kFollowsOmp,   // a BLAS pool the environment leaves unsized, set to its
                   // OMP_NUM_THREADS (what OpenBLAS and MKL read when their
                   // own variable is unset: setting the share instead
                   // overrode the user, e.g. OMP_NUM_THREADS=1 with a
                   // 2-thread BLAS pool per worker on a 2-core machine)
  };
  std::string var, value;
  Origin origin = kShare;
};
// ThreadVariables() in order, for a worker whose share is `share` threads,
// under an environment where `env(var)` is the variable's value (nullptr or
// "" when unset).
std::vector<ThreadSetting> ThreadSettings(int share, const char* (*env)(const char*));

}  // namespace ob::launch
