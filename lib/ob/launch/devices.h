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

#include <cstdint>
#include <string>
#include <vector>

#include "ob/model/config.h"
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

// The dense peak MFU is taken over, in FLOP/s, for a worker on the GPU
// CUDA names `cuda_name` training in `precision`: that
// GPU's own published peak in that precision (profile/gpus.h: bf16's on the
// tensor cores, fp32's on the CUDA cores), whatever GPU the plan
// was priced for; for a GPU the table lacks, the plan's profile's peak when
// the profile was made in the run's precision (measured on it, or given
// with --peak-tflops); else 0 (no MFU). *from says which, for the log.
double MfuPeakFlops(const std::string& cuda_name, model::Precision precision, double profile_peak_tflops,
                    const std::string& profile_dtype, std::string* from);

// CUDA_VISIBLE_DEVICES for the worker in `slot`: the slot's entry of
// `inherited` (the agent's own CUDA_VISIBLE_DEVICES, a comma-separated list;
// "" or unset: all GPUs, numbered from 0). kConfig when the list is shorter.
Result<std::string> VisibleDeviceFor(int slot, const std::string* inherited);

// kConfig "host H has G GPU(s) and the plan puts W workers on it (--device
// cuda)" when workers > gpus; Ok otherwise.
Status CheckGpus(const std::string& host, int workers, int gpus);

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

// What an agent said its machine is (control.proto's Hello): the boot id
// and the UUIDs of its GPUs, slot i's at i; `slots`: the workers the host
// may run (the hosts file's slots=).
struct MachineOf {
  std::string host;
  std::string boot_id;
  std::vector<std::string> gpus;
  int slots = 1;
  std::string device;  // what its workers run on: "cuda", "cpu" ("": not said)
  std::string build;   // its ob-launch (Hello.build; "": not said)
  std::vector<uint64_t> gpu_memory;    // as gpus: total bytes (0 or none: not said)
  std::vector<std::string> gpu_names;  // as gpus
};
// One job runs on one kind of device: NCCL groups cannot take Gloo ranks,
// and bf16 on some pipelines and fp32 on others would not be one model.
// kConfig when the hosts' workers would run on different devices (--device
// auto on a host whose GPUs are not seen, say after a driver fault):
// "hosts run on different devices: cuda on a, b; cpu on c: …". Hosts that
// did not say are left out.
Status CheckOneDevice(const std::vector<MachineOf>& hosts);
// One job runs one build of ob (Hello.build): a host left with an older
// install would train with other arithmetic, and snapshots and recovery
// transfers between builds need not read back. kConfig when a host's build
// is not `master_build`: "hosts run another build of ob-launch than this
// master (…): … on h3, h4. Install this one on every host (the path
// --agent-exe names)". Hosts that did not say, and an empty
// `master_build`, are left out.
Status CheckOneBuild(const std::vector<MachineOf>& hosts, const std::string& master_build);
// A plan fits the GPUs it runs on: its largest stage (`stage_bytes`, the
// most any template's stage needs on one GPU, since a recovery may put any
// stage on any host) within the memory of every GPU a host's workers use
// (its first `slots`), by ob-plan's own rule (stage memory at most the
// GPU's). A plan made for 80 GiB GPUs and run on 40 GiB ones would run out
// of memory at the first step, at every restart. kConfig: "the plan's
// stages need up to X GiB of GPU memory (it was made for GPUs of Y GiB),
// more than host a's GPU 0 (NAME) has Z GiB[, and …]: make the plan for
// these GPUs (ob-plan --gpu-memory Z, or a profile measured on one)"; one
// GPU a host, Z in GiB rounded down to 0.001 for ob-plan. Hosts that
// run on the CPU or did not say their GPUs' memory are left out.
Status CheckGpuMemory(const std::vector<MachineOf>& hosts, uint64_t stage_bytes, uint64_t plan_gpu_bytes);

// Hosts of a run that are not the machines they seem. kConfig when the
// workers of two hosts would share a GPU (one machine listed twice, or two
// containers given the same GPUs): "hosts a and b would both run workers on
// GPU GPU-…: list each machine once, or give each its own GPUs
// (CUDA_VISIBLE_DEVICES)". Otherwise one warning a pair of hosts on one
// machine (one boot id): a failure of it takes both, which a plan's f
// counts as two.
Result<std::vector<std::string>> CheckMachines(const std::vector<MachineOf>& hosts);

// Threads per worker on a host of `cores` cores running `workers` workers.
int ThreadsPerWorker(int cores, int workers);

// A host's cores for that share: the CPUs the agent may run on, fewer where
// its cgroup's CPU quota allows fewer (a container given --cpus=4 on a
// 64-core node sees 64 in its affinity mask, and 16 threads per worker for
// 4 workers would have been throttled to a quarter). The parts, from the
// files' contents:
//
// Whole CPUs a CFS quota allows, ceil(quota / period); 0 when unlimited or
// unreadable. cgroup v2's cpu.max ("max 100000", "150000 100000"), or v1's
// cpu.cfs_quota_us ("-1", "150000") and cpu.cfs_period_us.
int QuotaCpus(const std::string& cpu_max);
int QuotaCpus(const std::string& quota_us, const std::string& period_us);
// The cgroup directories whose CPU quota binds this process, innermost
// first (its own cgroup, then each parent up to the mount), from the
// contents of /proc/self/cgroup and /proc/self/mountinfo: v2's unified
// hierarchy (cpu.max), and v1's cpu controller (cpu.cfs_*).
struct CgroupDir {
  std::string path;
  bool v2 = false;
};
std::vector<CgroupDir> CpuCgroupDirs(const std::string& proc_self_cgroup, const std::string& mountinfo);
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

// Sizes this process's BLAS pools to `openblas` and `mkl` threads (<= 0:
// leaves that one), whichever of the two is loaded. Each reads its
// variable only when it loads and is deaf to torch::set_num_threads, so a
// process that was forked (launch/standby_seed.h) or that picks its count
// later (ob-profile --threads) must call this.
void SetBlasThreads(int openblas, int mkl);

}  // namespace ob::launch
