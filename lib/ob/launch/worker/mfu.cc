#include "ob/launch/worker/mfu.h"

#include "ob/profile/gpus.h"

namespace ob::launch {

double MfuPeakFlops(const std::string& cuda_name, model::Precision precision, double profile_peak_tflops,
                    const std::string& profile_dtype, std::string* from) {
  if (Result<profile::GpuSpec> gpu = profile::GpuForDevice(cuda_name); gpu.ok()) {
    const bool fp32 = precision != model::Precision::kBf16;
    *from = cuda_name + "'s dense " + model::PrecisionName(precision) + " peak";
    return profile::DensePeakTflops(*gpu, fp32) * 1e12;
  }
  if (profile_peak_tflops > 0 && profile_dtype == model::PrecisionDtype(precision)) {
    *from = "the plan's profile's peak (" + cuda_name + " has none published here)";
    return profile_peak_tflops * 1e12;
  }
  *from = "none: no published peak for " + cuda_name + ", nor a profile's in " + model::PrecisionName(precision);
  return 0;
}

}  // namespace ob::launch
