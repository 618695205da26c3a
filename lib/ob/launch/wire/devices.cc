#include "ob/launch/wire/devices.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ob/io/text.h"

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

std::string FormatProbe(const ProbeResult& p) {
  std::string out = "gpus " + std::to_string(p.gpus) + "\n";
  for (size_t i = 0; i < p.gpu_ids.size(); ++i) {
    out += "gpu " + (p.gpu_ids[i].empty() ? "-" : p.gpu_ids[i]);  // "-": unknown
    const uint64_t bytes = i < p.gpu_memory.size() ? p.gpu_memory[i] : 0;
    const std::string name = i < p.gpu_names.size() ? p.gpu_names[i] : "";
    if (bytes > 0 || !name.empty()) out += " " + std::to_string(bytes);
    if (!name.empty()) out += " " + name;
    out += "\n";
  }
  if (!p.runtime.empty()) out += "runtime " + p.runtime + "\n";
  return out;
}

Result<ProbeResult> ParseProbe(const std::string& text, const std::string& what) {
  ProbeResult p;
  bool counted = false;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t sp = line.find(' ');
    const std::string key = line.substr(0, sp), value = sp == std::string::npos ? "" : line.substr(sp + 1);
    if (key == "gpus" && !counted) {
      char* end = nullptr;
      const long n = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || n < 0 || n > 4096) break;
      p.gpus = static_cast<int>(n);
      counted = true;
    } else if (key == "gpu" && counted && !value.empty() && value[0] != ' ' &&
               p.gpu_ids.size() < static_cast<size_t>(p.gpus)) {
      // UUID [BYTES [NAME]]
      const size_t a = value.find(' ');
      const std::string id = value.substr(0, a);
      uint64_t bytes = 0;
      std::string name;
      if (a != std::string::npos) {
        const size_t b = value.find(' ', a + 1);
        const std::string digits = value.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
        char* end = nullptr;
        errno = 0;
        const unsigned long long n = std::strtoull(digits.c_str(), &end, 10);
        if (digits.empty() || digits[0] == '-' || *end != '\0' || errno != 0) {
          return Status::DataErr(what + ": not a device report: '" + line.substr(0, 80) + "'");
        }
        bytes = n;
        if (b != std::string::npos) name = value.substr(b + 1);
      }
      p.gpu_ids.push_back(id == "-" ? "" : id);
      p.gpu_memory.push_back(bytes);
      p.gpu_names.push_back(name);
    } else if (key == "runtime" && counted && p.runtime.empty()) {
      p.runtime = value;
    } else {
      return Status::DataErr(what + ": not a device report: '" + line.substr(0, 80) + "'");
    }
  }
  if (!counted) return Status::DataErr(what + ": no device report (want 'gpus N')");
  if (!p.gpu_ids.empty() && p.gpu_ids.size() != static_cast<size_t>(p.gpus)) {
    return Status::DataErr(what + ": reported " + std::to_string(p.gpus) + " GPU(s) and " +
                           std::to_string(p.gpu_ids.size()) + " UUID(s)");
  }
  return p;
}

bool MayHaveGpus() {
  struct stat st;
  return stat("/proc/driver/nvidia/version", &st) == 0 || stat("/dev/nvidiactl", &st) == 0;
}

std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return io::Trim(id);
}

}  // namespace ob::launch
