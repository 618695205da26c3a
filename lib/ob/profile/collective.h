// All-reduce timing with real c10d process groups (design/profile.md): one rank per
// thread of this process, joined through an in-memory store; Gloo over
// loopback for CPU, NCCL with one GPU per rank for CUDA. Torch-free header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ob/status.h"

namespace ob::profile {

// A matrix product [m, k] × [k, n] (fp32) each rank computes before every
// timed all-reduce; all zero: none.
struct Between {
  int64_t m = 0, k = 0, n = 0;
  bool any() const { return m > 0 && k > 0 && n > 0; }
};

// Seconds of an all-reduce (sum, fp32) of each size in `bytes` over a group
// of `group_size` ranks, after `warmup` untimed runs; rank 0's clock is used.
// Without `between`, the median of runs the ranks line up for on a barrier.
// With it, each rank computes the product before every all-reduce, with no
// barrier, as a worker does between the collectives of its step, and the
// time is the extra per all-reduce over the products alone (the median of
// 8 alternating passes of `repeats` each): on cores
// shared with other processes (ob-profile --concurrency) a rank that
// arrives first sleeps and must be scheduled again, which a tight loop of
// ranks that all run never pays (gpt-tiny, two ranks beside two busy
// processes on 2 cores: 1.2-1.9 ms against 0.2-0.3 ms for the tight
// loop, and a tensor-parallel run's 128 all-reduces a step cost it 1.2-1.6
// ms each). Group size 1 times the local no-op path. kUnavailable if the
// group cannot be formed (e.g. fewer GPUs than ranks).
Result<std::vector<double>> TimeAllReduce(const std::vector<uint64_t>& bytes, int group_size,
                                          const std::string& device, int warmup, int repeats,
                                          Between between = {});

}  // namespace ob::profile
