// Published figures of GPUs the analytic profile can model (design/profile.md).
// Torch-free; the table is constant and safe to read from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ob/status.h"

namespace ob::profile {

struct GpuSpec {
  std::string name;             // canonical, e.g. "h100"
  std::string description;      // e.g. "NVIDIA H100 SXM5 80GB"
  double peak_tflops = 0;       // dense bf16/fp16 tensor-core peak
  double fp32_tflops = 0;       // dense fp32 peak of the CUDA cores: ob trains
                                // fp32 without TF32 (cuBLAS's default for
                                // LibTorch's fp32 products), so no tensor cores
  uint64_t memory_bytes = 0;    // device memory as the driver reports it
  double memory_gbps = 0;       // HBM bandwidth, GB/s
  double allreduce_gbps = 0;    // intra-node all-reduce bus bandwidth, GB/s (NVLink)
  double efficiency = 0.45;     // default fraction of peak reached by real training
  int gpus_per_node = 8;
};

// The dense peak of `g`, TFLOP/s, for training in fp32 (`fp32`) or in bf16
// mixed precision, whose products run on the tensor cores in bf16.
inline double DensePeakTflops(const GpuSpec& g, bool fp32) { return fp32 ? g.fp32_tflops : g.peak_tflops; }

// Names and aliases accepted by --gpu.
std::vector<std::string> GpuNames();

// Looks a GPU up by name or alias (case-insensitive); kConfig naming the
// known GPUs when it is not in the table.
Result<GpuSpec> FindGpu(const std::string& name);

// The table's entry for a device as CUDA names it ("NVIDIA H100 80GB HBM3",
// "NVIDIA H200", "NVIDIA A100-SXM4-40GB", ...); kUnavailable for a device the
// table does not describe (an H100 PCIe or NVL has other peaks than the SXM
// part, so it is not taken for one).
Result<GpuSpec> GpuForDevice(const std::string& cuda_name);

}  // namespace ob::profile
