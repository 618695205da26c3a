// The device vocabulary every process of a run shares (design: launch):
// what ob-launch --device and --precision mean, the report
// ob-launch-worker --probe gives of a machine, and the machine's boot id.
// Torch-free and pure: the callers pass what they measured. Which GPU and
// how many threads each worker gets is the agent's (agent/host.h); whether
// the hosts of a run fit together, the master's (master/machine_checks.h).
//
//   --device auto|cpu|cuda   auto: CUDA where the worker sees a GPU
//   --precision fp32|bf16    default: bf16 on CUDA, fp32 on CPU
#pragma once

#include <cstdint>
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

// What ob-launch-worker --probe reports of this machine, as its workers
// would see it: the GPUs (their UUIDs, memory and names, slot i's at i)
// and, for --version -v, one DescribeRuntime line. ob-launch (the master
// and the agents) does not load LibTorch; it asks the worker binary, which
// does. Its stdout, a line each: "gpus N", N lines "gpu UUID [BYTES [NAME]]"
// ("-": unknown UUID; BYTES the GPU's total memory), then "runtime TEXT"
// (optional).
struct ProbeResult {
  int gpus = 0;
  std::vector<std::string> gpu_ids;
  std::vector<uint64_t> gpu_memory;     // as gpu_ids; 0: unknown
  std::vector<std::string> gpu_names;   // as gpu_ids; "": unknown
  std::string runtime;
};
std::string FormatProbe(const ProbeResult& p);
// kDataErr naming `what` (the program that printed it) for anything else.
Result<ProbeResult> ParseProbe(const std::string& text, const std::string& what);
// Whether this machine could have a GPU for CUDA: the NVIDIA driver's
// /proc/driver/nvidia/version or /dev/nvidiactl exists. Without either no
// process here sees one, and ob-launch need not ask (no LibTorch loaded).
bool MayHaveGpus();

// This machine's kernel boot id (/proc/sys/kernel/random/boot_id): one for
// every process of one machine, whatever container or network namespace it
// runs in; "" where unreadable.
std::string BootId();

}  // namespace ob::launch
