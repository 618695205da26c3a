// The peak a worker's MFU is taken over (design: launch, "Devices").
#pragma once

#include <string>

#include "ob/model/config.h"

namespace ob::launch {

// The dense peak MFU is taken over, in FLOP/s, for a worker on the GPU
// CUDA names `cuda_name` training in `precision`: that
// GPU's own published peak in that precision (profile/gpus.h: bf16's on the
// tensor cores, fp32's on the CUDA cores), whatever GPU the plan
// was priced for; for a GPU the table lacks, the plan's profile's peak when
// the profile was made in the run's precision (measured on it, or given
// with --peak-tflops); else 0 (no MFU). *from says which, for the log.
double MfuPeakFlops(const std::string& cuda_name, model::Precision precision, double profile_peak_tflops,
                    const std::string& profile_dtype, std::string* from);

}  // namespace ob::launch
