#include "ob/profile/gpus.h"

#include <algorithm>
#include <cctype>

namespace ob::profile {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

// Peak and bandwidth figures are the vendors' published dense numbers (the
// B200's those of the 1,000 W HGX part);
// all-reduce bus bandwidths are what nccl-tests reach on 8-GPU NVLink nodes.
const std::vector<GpuSpec>& Table() {
  static const std::vector<GpuSpec> kGpus = {
      {"v100", "NVIDIA V100 SXM2 32GB", 125, 15.7, 32768 * kMiB, 900, 130, 0.40, 8},
      {"a100-40gb", "NVIDIA A100 SXM4 40GB", 312, 19.5, 40960 * kMiB, 1555, 230, 0.45, 8},
      {"a100-80gb", "NVIDIA A100 SXM4 80GB", 312, 19.5, 81920 * kMiB, 2039, 230, 0.45, 8},
      {"l40s", "NVIDIA L40S 48GB", 362, 91.6, 46068 * kMiB, 864, 24, 0.40, 8},
      {"h100", "NVIDIA H100 SXM5 80GB", 989, 67, 81559 * kMiB, 3350, 370, 0.40, 8},
      {"h200", "NVIDIA H200 SXM 141GB", 989, 67, 143771 * kMiB, 4800, 370, 0.40, 8},
      {"b200", "NVIDIA B200 180GB", 2250, 75, 183359 * kMiB, 8000, 700, 0.40, 8},
  };
  return kGpus;
}

struct Alias {
  const char* alias;
  const char* name;
};
constexpr Alias kAliases[] = {{"a100", "a100-80gb"}, {"h100-sxm", "h100"}, {"h200-sxm", "h200"}};

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

std::vector<std::string> GpuNames() {
  std::vector<std::string> names;
  for (const auto& g : Table()) names.push_back(g.name);
  for (const auto& a : kAliases) names.push_back(a.alias);
  return names;
}

Result<GpuSpec> FindGpu(const std::string& name) {
  std::string want = Lower(name);
  for (const auto& a : kAliases)
    if (want == a.alias) want = a.name;
  for (const auto& g : Table())
    if (g.name == want) return g;
  std::string known;
  for (const auto& n : GpuNames()) known += (known.empty() ? "" : ", ") + n;
  return Status::Config("unknown GPU '" + name + "' (known: " + known +
                        "; or give --peak-tflops and --mem-gib)");
}

Result<GpuSpec> GpuForDevice(const std::string& cuda_name) {
  const std::string n = Lower(cuda_name);
  auto has = [&](const char* part) { return n.find(part) != std::string::npos; };
  // An H100 PCIe or NVL is another part with other peaks: none of the table's.
  const char* key = nullptr;
  if (!has("pcie") && !has("nvl")) {
    for (const char* k : {"b200", "h200", "h100", "l40s", "v100"}) {
      if (key == nullptr && has(k)) key = k;
    }
    if (key == nullptr && has("a100")) key = has("40gb") ? "a100-40gb" : "a100-80gb";
  }
  if (key == nullptr) return Status::Unavailable("no published peak for GPU '" + cuda_name + "'");
  return FindGpu(key);
}

}  // namespace ob::profile
