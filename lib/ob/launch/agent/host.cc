#include "ob/launch/agent/host.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ob/io/file.h"
#include "ob/io/text.h"

namespace ob::launch {

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

std::vector<std::pair<std::string, std::string>> TestNcclHostEnv(const std::string& host, uint32_t slot,
                                                                  const char* (*env)(const char*)) {
  std::vector<std::pair<std::string, std::string>> out = {{"NCCL_HOSTID", host + "/" + std::to_string(slot)}};
  for (const auto& [var, value] : std::vector<std::pair<std::string, std::string>>{
           {"NCCL_P2P_DISABLE", "1"}, {"NCCL_SHM_DISABLE", "1"}, {"NCCL_NET", "Socket"}, {"NCCL_SOCKET_IFNAME", "lo"}}) {
    const char* given = env(var.c_str());
    if (given == nullptr || *given == '\0') out.emplace_back(var, value);
  }
  return out;
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

int CgroupCpus() {
  static const int cpus = [] {
    auto cgroup = io::ReadFile("/proc/self/cgroup");
    auto mounts = io::ReadFile("/proc/self/mountinfo");
    if (!cgroup.ok() || !mounts.ok()) return 0;
    int least = 0;
    for (const CgroupDir& d : CpuCgroupDirs(*cgroup, *mounts)) {
      int n = 0;
      if (d.v2) {
        auto max = io::ReadFile(d.path + "/cpu.max");
        if (max.ok()) n = QuotaCpus(*max);
      } else {
        auto quota = io::ReadFile(d.path + "/cpu.cfs_quota_us");
        auto period = io::ReadFile(d.path + "/cpu.cfs_period_us");
        if (quota.ok() && period.ok()) n = QuotaCpus(*quota, *period);
      }
      if (n > 0 && (least == 0 || n < least)) least = n;
    }
    return least;
  }();
  return cpus;
}

int UsableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int mask = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                                 : static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  const int quota = CgroupCpus();
  return std::max(1, quota > 0 ? std::min(mask, quota) : mask);
}

}  // namespace ob::launch
