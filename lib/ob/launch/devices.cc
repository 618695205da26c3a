#include "ob/launch/devices.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "ob/io/text.h"
#include "ob/profile/gpus.h"

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

Status CheckGpuMemory(const std::vector<MachineOf>& hosts, uint64_t stage_bytes, uint64_t plan_gpu_bytes) {
  auto size = [](uint64_t b) {
    return b >= (1ull << 30) ? io::Format("%.1f GiB", static_cast<double>(b) / (1ull << 30))
                             : io::Format("%.1f MiB", static_cast<double>(b) / (1ull << 20));
  };
  // What to give ob-plan (GiB): rounded down, never more than the GPU has.
  auto gib_down = [](uint64_t b) {
    return io::Format("%g", std::floor(static_cast<double>(b) / (1ull << 30) * 1000) / 1000);
  };
  std::string small;
  uint64_t least = 0;
  int named = 0, more = 0;
  for (const MachineOf& h : hosts) {
    if (h.device != "cuda") continue;
    const size_t used = h.slots > 0 ? std::min<size_t>(h.gpu_memory.size(), static_cast<size_t>(h.slots))
                                    : h.gpu_memory.size();
    size_t smallest = used;  // the host's smallest GPU of known memory
    for (size_t i = 0; i < used; ++i) {
      if (h.gpu_memory[i] > 0 && (smallest == used || h.gpu_memory[i] < h.gpu_memory[smallest])) smallest = i;
    }
    if (smallest == used || h.gpu_memory[smallest] >= stage_bytes) continue;
    const uint64_t have = h.gpu_memory[smallest];
    least = least == 0 ? have : std::min(least, have);
    if (named == 3) {  // one line, however many hosts
      ++more;
      continue;
    }
    const std::string name =
        smallest < h.gpu_names.size() && !h.gpu_names[smallest].empty() ? " (" + h.gpu_names[smallest] + ")" : "";
    small += std::string(named == 0 ? "" : ", and ") + "host " + h.host + "'s GPU " + std::to_string(smallest) +
             name + " has " + size(have);
    ++named;
  }
  if (named == 0) return Status::Ok();
  if (more > 0) small += ", and those of " + std::to_string(more) + " more host(s)";
  return Status::Config("the plan's stages need up to " + size(stage_bytes) + " of GPU memory" +
                        (plan_gpu_bytes > 0 ? " (it was made for GPUs of " + size(plan_gpu_bytes) + ")" : "") +
                        ", more than " + small + ": make the plan for these GPUs (ob-plan --gpu-memory " +
                        gib_down(least) + ", or a profile measured on one)");
}

Result<std::vector<std::string>> CheckMachines(const std::vector<MachineOf>& hosts) {
  std::map<std::string, std::string> gpu_host;  // a GPU some host's slots use → that host
  for (const MachineOf& h : hosts) {
    const size_t used = std::min(h.gpus.size(), static_cast<size_t>(std::max(h.slots, 0)));
    for (size_t i = 0; i < used; ++i) {
      if (h.gpus[i].empty()) continue;
      auto [it, fresh] = gpu_host.emplace(h.gpus[i], h.host);
      if (!fresh && it->second != h.host) {
        return Status::Config("hosts " + it->second + " and " + h.host + " would both run workers on GPU " +
                              h.gpus[i] + ": list each machine once, or give each host its own GPUs " +
                              "(CUDA_VISIBLE_DEVICES)");
      }
    }
  }
  std::vector<std::string> warnings;
  for (size_t i = 0; i < hosts.size(); ++i) {
    for (size_t j = i + 1; j < hosts.size(); ++j) {
      if (hosts[i].boot_id.empty() || hosts[i].boot_id != hosts[j].boot_id) continue;
      warnings.push_back("hosts " + hosts[i].host + " and " + hosts[j].host + " run on one machine (kernel boot id " +
                         hosts[i].boot_id + "): a failure of it takes both, which the plan counts as two");
    }
  }
  return warnings;
}

Status CheckOneDevice(const std::vector<MachineOf>& hosts) {
  std::map<std::string, std::vector<std::string>> on;  // device → hosts, in the given order
  for (const MachineOf& h : hosts) {
    if (!h.device.empty()) on[h.device].push_back(h.host);
  }
  if (on.size() <= 1) return Status::Ok();
  std::string said;  // the CPU hosts last: they are the ones the note after them is about
  const bool some_cpu = on.count("cpu") > 0;
  std::vector<std::pair<std::string, std::vector<std::string>>> order(on.begin(), on.end());
  std::stable_partition(order.begin(), order.end(), [](const auto& d) { return d.first != "cpu"; });
  for (const auto& [device, names] : order) {
    said += (said.empty() ? "" : "; ") + device + " on ";
    for (size_t i = 0; i < names.size(); ++i) said += (i > 0 ? ", " : "") + names[i];
  }
  return Status::Config("hosts run on different devices: " + said +
                        (some_cpu ? " (no GPU seen there: --device auto). Mend their GPUs or leave those "
                                    "hosts out of the hosts file, or give --device cpu"
                                  : ""));
}

Status CheckOneBuild(const std::vector<MachineOf>& hosts, const std::string& master_build) {
  if (master_build.empty()) return Status::Ok();
  std::vector<std::pair<std::string, std::vector<std::string>>> other;  // build → hosts, first seen first
  for (const MachineOf& h : hosts) {
    if (h.build.empty() || h.build == master_build) continue;
    auto it = std::find_if(other.begin(), other.end(), [&](const auto& b) { return b.first == h.build; });
    if (it == other.end()) it = other.insert(other.end(), {h.build, {}});
    it->second.push_back(h.host);
  }
  if (other.empty()) return Status::Ok();
  std::string said;
  for (const auto& [build, names] : other) {
    said += (said.empty() ? "" : "; ") + build + " on ";
    for (size_t i = 0; i < names.size(); ++i) said += (i > 0 ? ", " : "") + names[i];
  }
  return Status::Config("hosts run another build of ob-launch than this master (" + master_build + "): " + said +
                        ". Install this one on every host (the path --agent-exe names)");
}

int ThreadsPerWorker(int cores, int workers) { return std::max(1, cores / std::max(1, workers)); }

namespace {

using io::Trim;

std::vector<std::string> Fields(const std::string& line, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(line);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

// A positive decimal integer, or -1.
int64_t Positive(const std::string& s) {
  if (s.empty() || s.size() > 18) return -1;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v > 0 ? v : -1;
}

int Ceil(int64_t quota, int64_t period) {
  if (quota <= 0 || period <= 0) return 0;
  return static_cast<int>(std::max<int64_t>(1, (quota + period - 1) / period));
}

}  // namespace

int QuotaCpus(const std::string& cpu_max) {
  const auto f = Fields(Trim(cpu_max), ' ');
  if (f.size() != 2) return 0;
  return Ceil(Positive(f[0]), Positive(f[1]));
}

int QuotaCpus(const std::string& quota_us, const std::string& period_us) {
  return Ceil(Positive(Trim(quota_us)), Positive(Trim(period_us)));
}

std::vector<CgroupDir> CpuCgroupDirs(const std::string& proc_self_cgroup, const std::string& mountinfo) {
  // Our cgroup in each hierarchy: "0::PATH" (v2), "N:cpu,cpuacct:PATH" (v1).
  std::string v2_path, v1_path;
  bool have_v2 = false, have_v1 = false;
  std::istringstream cg(proc_self_cgroup);
  for (std::string line; std::getline(cg, line);) {
    const auto a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (id == "0" && controllers.empty()) {
      v2_path = path;
      have_v2 = true;
    } else {
      for (const auto& c : Fields(controllers, ',')) {
        if (c == "cpu") {
          v1_path = path;
          have_v1 = true;
        }
      }
    }
  }
  // Their mounts: "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [TAGS...] - FSTYPE SOURCE SUPEROPTS".
  std::vector<CgroupDir> out;
  std::istringstream mi(mountinfo);
  for (std::string line; std::getline(mi, line);) {
    const auto f = Fields(line, ' ');
    size_t dash = 0;
    while (dash < f.size() && f[dash] != "-") ++dash;
    if (f.size() < 5 || dash + 1 >= f.size()) continue;
    const std::string& fstype = f[dash + 1];
    bool v2 = false;
    if (fstype == "cgroup2") {
      if (!have_v2) continue;
      v2 = true;
    } else if (fstype == "cgroup" && dash + 3 < f.size()) {
      bool cpu = false;
      for (const auto& o : Fields(f[dash + 3], ',')) cpu = cpu || o == "cpu";
      if (!cpu || !have_v1) continue;
    } else {
      continue;
    }
    // The mount shows ROOT of the hierarchy at MOUNTPOINT: our path below
    // ROOT is below MOUNTPOINT (a container sees its own cgroup as "/").
    const std::string& root = f[3];
    const std::string& mountpoint = f[4];
    std::string rel = v2 ? v2_path : v1_path;
    if (root != "/") {
      if (rel.compare(0, root.size(), root) != 0 || (rel.size() > root.size() && rel[root.size()] != '/')) continue;
      rel = rel.substr(root.size());
    }
    while (!rel.empty() && rel.back() == '/') rel.pop_back();
    for (;;) {
      out.push_back({mountpoint + rel, v2});
      if (rel.empty()) break;
      rel = rel.substr(0, rel.rfind('/'));
    }
  }
  return out;
}

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

void SetBlasThreads(int openblas, int mkl) {
  using SetThreads = void (*)(int);
  for (auto [name, n] : {std::pair{"openblas_set_num_threads", openblas}, std::pair{"mkl_set_num_threads", mkl}}) {
    if (n <= 0) continue;
    if (auto f = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, name))) f(n);
  }
}

}  // namespace ob::launch
