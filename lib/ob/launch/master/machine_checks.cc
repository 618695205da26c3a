#include "ob/launch/master/machine_checks.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "ob/io/text.h"

namespace ob::launch {

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

uint64_t LargestStageBytes(const pb::Plan& plan) {
  uint64_t most = 0;
  for (const auto& t : plan.templates()) {
    for (const auto& s : t.stages()) most = std::max(most, s.memory_bytes());
  }
  return most;
}

}  // namespace ob::launch
