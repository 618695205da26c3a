// All-reduce timing with real c10d process groups (design §3): one rank per
// thread of this process, joined through an in-memory store; Gloo over
// loopback for CPU, NCCL with one GPU per rank for CUDA. Torch-free header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ob/status.h"

namespace ob::profile {

// Median seconds of an all-reduce (sum, fp32) of each size in `bytes` over a
// group of `group_size` ranks, after `warmup` untimed runs; ranks line up on a
// barrier before each timed run and rank 0's clock is used. Group size 1
// times the local no-op path. kUnavailable if the group cannot be formed
// (e.g. fewer GPUs than ranks).
Result<std::vector<double>> TimeAllReduce(const std::vector<uint64_t>& bytes, int group_size,
                                          const std::string& device, int warmup, int repeats);

}  // namespace ob::profile
