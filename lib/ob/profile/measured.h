// Measured layer costs (design/profile.md): every planner layer is built alone on the
// local device and timed; memory is counted by the allocator, not estimated.
//
// The header is torch-free so tools can call it without LibTorch headers.
// Not thread-safe: measuring installs a counting CPU allocator for the
// process and sets the intra-op thread count; run one measurement at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ob/model/config.h"
#include "ob/profile.pb.h"
#include "ob/status.h"

namespace ob::profile {

struct MeasureOptions {
  std::string device = "cpu";        // "cpu" or "cuda" / "cuda:N"
  std::vector<int> microbatches{1};  // sequences per micro-batch
  int seq_len = 0;                   // 0: the model's context length
  int warmup = 2;                    // untimed runs before timing
  int repeats = 5;                   // timed runs; their mean is kept (CUDA: median)
  int max_group = 0;                 // all-reduce group sizes 1, 2, 4, ... up to this; 0: the
                                     // node's GPUs on CUDA, 4 on the CPU
  int threads = 0;                   // CPU intra-op threads; 0: LibTorch's default
  bool bf16 = false;                 // bf16 autocast over fp32 weights (CUDA or CPU)
  uint64_t seed = 1234;              // weights and inputs
  // CPU: time the layers while concurrency − 1 other processes train the
  // same layers on this machine (forward and backward in a loop), as the
  // workers of a local cluster share its cores; 1: alone.
  int concurrency = 1;
  // After each step of work: what it was, and the work done so far of
  // all (a chained pass over the layers counts as many as there are).
  std::function<void(const std::string& line, int done, int total)> progress;
};

// Measures every layer of `c`. kConfig for unusable options (no CUDA in this
// build, sequence longer than the context, ...); kUnavailable when the device
// or a communication group cannot be set up.
Result<pb::Profile> MeasureProfile(const model::GptConfig& c, const MeasureOptions& opts);

}  // namespace ob::profile
