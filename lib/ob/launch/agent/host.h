// What an agent gives each worker of its host (design: launch, "Devices"):
// one worker per GPU (the worker in slot s gets CUDA_VISIBLE_DEVICES=s, or
// the s-th entry of the list the agent itself was given, and uses cuda:0; a
// host with fewer GPUs than the plan puts workers on it is refused) and its
// share of the cores: OMP_NUM_THREADS (and OPENBLAS_/MKL_NUM_THREADS) =
// max(1, cores / workers on the host), unless the agent's environment sets
// them, as torchrun does; a BLAS pool the environment leaves unsized
// follows its OMP_NUM_THREADS. Pure: the callers pass what they read.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ob/status.h"

namespace ob::launch {

// CUDA_VISIBLE_DEVICES for the worker in `slot`: the slot's entry of
// `inherited` (the agent's own CUDA_VISIBLE_DEVICES, a comma-separated list;
// "" or unset: all GPUs, numbered from 0). kConfig when the list is shorter.
Result<std::string> VisibleDeviceFor(int slot, const std::string* inherited);

// kConfig "host H has G GPU(s) and the plan puts W workers on it (--device
// cuda)" when workers > gpus; Ok otherwise.
Status CheckGpus(const std::string& host, int workers, int gpus);

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
// The cores this process may use: its affinity mask, or fewer where a
// cgroup's quota (below) allows fewer; at least 1. Also ob-data's default
// -j.
int UsableCores();
// The least CPU quota of this process's cgroups (QuotaCpus), 0 when none is
// set or none can be read. Read once: a quota is the container's.
int CgroupCpus();
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

// $OB_TEST_NCCL_HOSTS=1 (tests on one machine, documented in ob-launch(1)):
// the variables that make NCCL take each worker for a host of its own and
// talk to it over sockets on loopback, so local hosts sharing one GPU run
// real NCCL between them. NCCL refuses two ranks of one host on one GPU
// ("Duplicate GPU detected"), and two workers of one host that share the GPU
// would be exactly that: so the identity (NCCL_HOSTID) is the worker's,
// "HOST/SLOT", not the host's. Then NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1,
// NCCL_NET=Socket and NCCL_SOCKET_IFNAME=lo, each only where `env(var)` (the
// agent's environment; nullptr or "" when unset) does not set it already.
// NCCL_HOSTID always: the point is that it differs. Pairs of name and value.
std::vector<std::pair<std::string, std::string>> TestNcclHostEnv(const std::string& host, uint32_t slot,
                                                                  const char* (*env)(const char*));

}  // namespace ob::launch
