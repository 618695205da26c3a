#include "ob/launch/devices.h"

#include <algorithm>
#include <sstream>

namespace ob::launch {

Result<DeviceKind> ParseDevice(const std::string& name) {
  if (name == "auto") return DeviceKind::kAuto;
  if (name == "cpu") return DeviceKind::kCpu;
  if (name == "cuda") return DeviceKind::kCuda;
  return Status::Usage("--device: '" + name + "' is not auto, cpu or cuda");
}

const char* DeviceName(DeviceKind d) {
  switch (d) {
    case DeviceKind::kCpu: return "cpu";
    case DeviceKind::kCuda: return "cuda";
    default: return "auto";
  }
}

DeviceKind ResolveDevice(DeviceKind asked, int gpus) {
  if (asked != DeviceKind::kAuto) return asked;
  return gpus > 0 ? DeviceKind::kCuda : DeviceKind::kCpu;
}

Result<std::string> ResolvePrecision(const std::string& given, DeviceKind resolved) {
  if (given.empty()) return std::string(resolved == DeviceKind::kCuda ? "bf16" : "fp32");
  if (given == "fp32" || given == "float32") return std::string("fp32");
  if (given == "bf16" || given == "bfloat16") return std::string("bf16");
  return Status::Usage("--precision: '" + given + "' is not fp32 or bf16");
}

const char* BackendName(DeviceKind resolved) { return resolved == DeviceKind::kCuda ? "nccl" : "gloo"; }

Result<std::string> VisibleDeviceFor(int slot, const std::string* inherited) {
  if (inherited == nullptr || inherited->empty()) return std::to_string(slot);
  std::vector<std::string> ids;
  std::stringstream in(*inherited);
  std::string id;
  while (std::getline(in, id, ',')) {
    id.erase(0, id.find_first_not_of(" \t"));
    id.erase(id.find_last_not_of(" \t") + 1);
    if (!id.empty()) ids.push_back(id);
  }
  if (slot < 0 || slot >= static_cast<int>(ids.size())) {
    return Status::Config("CUDA_VISIBLE_DEVICES='" + *inherited + "' names " + std::to_string(ids.size()) +
                          " GPU(s), too few for worker slot " + std::to_string(slot));
  }
  return ids[static_cast<size_t>(slot)];
}

Status CheckGpus(const std::string& host, int workers, int gpus) {
  if (workers <= gpus) return Status::Ok();
  return Status::Config("host " + host + " has " + std::to_string(std::max(gpus, 0)) +
                        " GPU(s) and the plan puts " + std::to_string(workers) +
                        " worker(s) on it (--device cuda: one GPU per worker)");
}

int ThreadsPerWorker(int cores, int workers) { return std::max(1, cores / std::max(1, workers)); }

std::vector<ThreadSetting> ThreadSettings(int share, const char* (*env)(const char*)) {
  auto set = [&](const std::string& var) -> const char* {
    const char* v = env(var.c_str());
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
  const char* omp = set("OMP_NUM_THREADS");
  std::vector<ThreadSetting> out;
  for (const std::string& var : ThreadVariables()) {
    ThreadSetting s;
    s.var = var;
    if (const char* v = set(var)) {
      s.value = v;
      s.origin = ThreadSetting::kInherited;
    } else if (omp != nullptr) {
      s.value = omp;
      s.origin = ThreadSetting::kFollowsOmp;
    } else {
      s.value = std::to_string(share);
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace ob::launch
