// Devices, precision and threads on the launch side (launch/wire/devices.h).
#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "ob/launch/agent/host.h"
#include "ob/launch/master/machine_checks.h"
#include "ob/launch/wire/devices.h"
#include "ob/launch/worker/mfu.h"

using namespace ob::launch;

TEST_CASE("device: auto is CUDA where a GPU is seen, the precision follows the device") {
  REQUIRE(ParseDevice("auto").ok());
  CHECK(*ParseDevice("cuda") == DeviceKind::kCuda);
  CHECK(ParseDevice("gpu").status().code() == ob::Code::kUsage);
  CHECK(ResolveDevice(DeviceKind::kAuto, 0) == DeviceKind::kCpu);
  CHECK(ResolveDevice(DeviceKind::kAuto, 8) == DeviceKind::kCuda);
  CHECK(ResolveDevice(DeviceKind::kCpu, 8) == DeviceKind::kCpu);
  CHECK(ResolveDevice(DeviceKind::kCuda, 0) == DeviceKind::kCuda);  // refused later, by the agent
  CHECK(*ResolvePrecision("", DeviceKind::kCuda) == "bf16");
  CHECK(*ResolvePrecision("", DeviceKind::kCpu) == "fp32");
  CHECK(*ResolvePrecision("bf16", DeviceKind::kCpu) == "bf16");
  CHECK(*ResolvePrecision("float32", DeviceKind::kCuda) == "fp32");
  CHECK(ResolvePrecision("fp16", DeviceKind::kCuda).status().code() == ob::Code::kUsage);
  CHECK(std::string(BackendName(DeviceKind::kCuda)) == "nccl");
  CHECK(std::string(BackendName(DeviceKind::kCpu)) == "gloo");
}

TEST_CASE("gpu per worker: the slot, or the slot's entry of the agent's own list") {
  CHECK(*VisibleDeviceFor(3, nullptr) == "3");
  const std::string empty;
  CHECK(*VisibleDeviceFor(1, &empty) == "1");
  const std::string list = "4, 6,GPU-1a2b";
  CHECK(*VisibleDeviceFor(0, &list) == "4");
  CHECK(*VisibleDeviceFor(1, &list) == "6");
  CHECK(*VisibleDeviceFor(2, &list) == "GPU-1a2b");
  auto r = VisibleDeviceFor(3, &list);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == ob::Code::kConfig);
}

// OB_TEST_NCCL_HOSTS=1: each worker its own NCCL host identity, the
// socket transport on loopback unless the environment chose otherwise.
const char* NoEnv(const char*) { return nullptr; }
const char* SomeEnv(const char* var) { return std::string(var) == "NCCL_SOCKET_IFNAME" ? "veth0" : ""; }

TEST_CASE("test NCCL hosts: an identity per worker, sockets on loopback unless already set") {
  using Env = std::vector<std::pair<std::string, std::string>>;
  CHECK(TestNcclHostEnv("h1", 0, NoEnv) == Env{{"NCCL_HOSTID", "h1/0"},
                                               {"NCCL_P2P_DISABLE", "1"},
                                               {"NCCL_SHM_DISABLE", "1"},
                                               {"NCCL_NET", "Socket"},
                                               {"NCCL_SOCKET_IFNAME", "lo"}});
  // Two workers of one host sharing its GPU differ to NCCL; so do two hosts.
  CHECK(TestNcclHostEnv("h1", 1, NoEnv)[0].second == "h1/1");
  CHECK(TestNcclHostEnv("h2", 0, NoEnv)[0].second == "h2/0");
  // "" counts as unset; a set variable is the user's.
  CHECK(TestNcclHostEnv("h1", 0, SomeEnv) == Env{{"NCCL_HOSTID", "h1/0"},
                                                 {"NCCL_P2P_DISABLE", "1"},
                                                 {"NCCL_SHM_DISABLE", "1"},
                                                 {"NCCL_NET", "Socket"}});
}

TEST_CASE("the worker program's device report reads back, and anything else is refused naming it") {
  ProbeResult p;
  p.gpus = 2;
  p.gpu_ids = {"GPU-aaaa", ""};
  p.runtime = "device cuda (NVIDIA H100), backend nccl, precision bf16, 16 threads, LibTorch 2.11.0";
  CHECK(FormatProbe(p) == "gpus 2\ngpu GPU-aaaa\ngpu -\nruntime " + p.runtime + "\n");
  auto back = ParseProbe(FormatProbe(p), "w --probe");
  REQUIRE(back.ok());
  CHECK(back->gpus == 2);
  CHECK(back->gpu_ids == std::vector<std::string>{"GPU-aaaa", ""});
  CHECK(back->runtime == p.runtime);
  auto cpu = ParseProbe("gpus 0\n", "w --probe");
  REQUIRE(cpu.ok());
  CHECK(cpu->gpus == 0);
  CHECK(cpu->gpu_ids.empty());
  CHECK(cpu->runtime.empty());
  CHECK(ParseProbe("", "w --probe").status().message() == "w --probe: no device report (want 'gpus N')");
  CHECK(ParseProbe("gpus -1\n", "w --probe").status().code() == ob::Code::kDataErr);
  CHECK(ParseProbe("gpus 2x\n", "w --probe").status().code() == ob::Code::kDataErr);
  CHECK(ParseProbe("gpus 1\ngpu a\ngpu b\n", "w --probe").status().message() ==
        "w --probe: not a device report: 'gpu b'");
  CHECK(ParseProbe("gpus 2\ngpu a\n", "w --probe").status().message() ==
        "w --probe: reported 2 GPU(s) and 1 UUID(s)");
  CHECK(ParseProbe("Segmentation fault\n", "w --probe").status().message() ==
        "w --probe: not a device report: 'Segmentation fault'");
}

TEST_CASE("the device report carries each GPU's memory and name, and refuses a bad size") {
  ProbeResult p;
  p.gpus = 3;
  p.gpu_ids = {"GPU-aaaa", "", "GPU-cccc"};
  p.gpu_memory = {85520809984ull, 42505273344ull, 0};
  p.gpu_names = {"NVIDIA H100 80GB HBM3", "", ""};
  CHECK(FormatProbe(p) ==
        "gpus 3\ngpu GPU-aaaa 85520809984 NVIDIA H100 80GB HBM3\ngpu - 42505273344\ngpu GPU-cccc\n");
  auto back = ParseProbe(FormatProbe(p), "w --probe");
  REQUIRE(back.ok());
  CHECK(back->gpu_ids == p.gpu_ids);
  CHECK(back->gpu_memory == p.gpu_memory);
  CHECK(back->gpu_names == p.gpu_names);
  for (const char* bad : {"gpus 1\ngpu a 12x\n", "gpus 1\ngpu a -5\n", "gpus 1\ngpu a  NAME\n",
                          "gpus 1\ngpu a 99999999999999999999999 N\n", "gpus 1\ngpu  5\n"}) {
    INFO(bad);
    CHECK(ParseProbe(bad, "w --probe").status().code() == ob::Code::kDataErr);
  }
}

TEST_CASE("a plan whose stages need more memory than a host's GPUs have is refused, naming the host") {
  constexpr uint64_t kGiB = 1ull << 30;
  auto gpu_host = [](std::string name, std::vector<uint64_t> memory, int slots, std::string device = "cuda") {
    MachineOf m;
    m.host = std::move(name);
    m.device = std::move(device);
    m.slots = slots;
    m.gpu_memory = std::move(memory);
    m.gpu_names.assign(m.gpu_memory.size(), "NVIDIA A100-SXM4-40GB");
    return m;
  };
  const uint64_t a100_40 = 42505273344ull, h100 = 85520809984ull;
  // Fits: every GPU holds the largest stage, or its memory is not known.
  CHECK(CheckGpuMemory({gpu_host("a", {h100}, 1), gpu_host("b", {}, 1)}, 60 * kGiB, 80 * kGiB).ok());
  CHECK(CheckGpuMemory({gpu_host("a", {a100_40}, 1, "cpu")}, 60 * kGiB, 80 * kGiB).ok());  // the CPU's memory is not this
  CHECK(CheckGpuMemory({gpu_host("a", {h100, 0}, 2)}, 60 * kGiB, 80 * kGiB).ok());
  // Only the GPUs of the host's slots count.
  CHECK(CheckGpuMemory({gpu_host("a", {h100, a100_40}, 1)}, 60 * kGiB, 80 * kGiB).ok());
  // A stage needing exactly a GPU's memory fits, by ob-plan's rule.
  CHECK(CheckGpuMemory({gpu_host("a", {a100_40}, 1)}, a100_40, 80 * kGiB).ok());
  const ob::Status st =
      CheckGpuMemory({gpu_host("a", {h100, a100_40}, 2), gpu_host("b", {h100}, 1), gpu_host("c", {a100_40}, 1)},
                     60 * kGiB + kGiB / 4, 81559ull << 20);
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == ob::Code::kConfig);
  CHECK(st.exit_code() == 78);
  CHECK(st.message() ==
        "the plan's stages need up to 60.2 GiB of GPU memory (it was made for GPUs of 79.6 GiB), more than host "
        "a's GPU 1 (NVIDIA A100-SXM4-40GB) has 39.6 GiB, and host c's GPU 0 (NVIDIA A100-SXM4-40GB) has 39.6 GiB: "
        "make the plan for these GPUs (ob-plan --gpu-memory 39.586, or a profile measured on one)");
  // A host's smallest GPU is the one named; past three hosts, a count.
  const ob::Status many = CheckGpuMemory({gpu_host("a", {a100_40, 8ull << 30}, 2), gpu_host("b", {a100_40}, 1),
                                          gpu_host("c", {a100_40}, 1), gpu_host("d", {a100_40}, 1),
                                          gpu_host("e", {a100_40}, 1)},
                                         60 * kGiB, 0);
  CHECK(many.message() ==
        "the plan's stages need up to 60.0 GiB of GPU memory, more than host a's GPU 1 (NVIDIA A100-SXM4-40GB) has "
        "8.0 GiB, and host b's GPU 0 (NVIDIA A100-SXM4-40GB) has 39.6 GiB, and host c's GPU 0 (NVIDIA "
        "A100-SXM4-40GB) has 39.6 GiB, and those of 2 more host(s): make the plan for these GPUs (ob-plan "
        "--gpu-memory 8, or a profile measured on one)");
  // Sizes under a GiB in MiB; the size for ob-plan never above the GPU's.
  CHECK_THAT(CheckGpuMemory({gpu_host("a", {4ull << 20}, 1)}, 10ull << 20, 0).message(),
             Catch::StartsWith("the plan's stages need up to 10.0 MiB of GPU memory, more than host a's GPU 0 "
                               "(NVIDIA A100-SXM4-40GB) has 4.0 MiB: make the plan for these GPUs (ob-plan "
                               "--gpu-memory 0.003,"));
}

TEST_CASE("more workers than GPUs on a host is refused with one line naming it") {
  CHECK(CheckGpus("h1", 2, 2).ok());
  CHECK(CheckGpus("h1", 1, 8).ok());
  ob::Status st = CheckGpus("h1", 3, 2);
  CHECK(st.code() == ob::Code::kConfig);
  CHECK(st.exit_code() == 78);
  CHECK(st.message() == "host h1 has 2 GPU(s) and the plan puts 3 worker(s) on it (--device cuda: one GPU per worker)");
  CHECK(CheckGpus("h2", 1, 0).message().rfind("host h2 has 0 GPU(s)", 0) == 0);
}

namespace {
MachineOf M(std::string host, std::string boot_id, std::vector<std::string> gpus, int slots) {
  MachineOf m;
  m.host = std::move(host);
  m.boot_id = std::move(boot_id);
  m.gpus = std::move(gpus);
  m.slots = slots;
  return m;
}
}  // namespace

TEST_CASE("CheckMachines: a GPU two hosts would use is refused, one machine is said") {
  // Two nodes of 8 GPUs each, and a third name for the first node.
  std::vector<std::string> a, b;
  for (int i = 0; i < 8; ++i) {
    a.push_back("GPU-a" + std::to_string(i));
    b.push_back("GPU-b" + std::to_string(i));
  }
  auto ok = CheckMachines({M("n1", "boot1", a, 8), M("n2", "boot2", b, 8)});
  REQUIRE(ok.ok());
  CHECK(ok->empty());
  auto twice = CheckMachines({M("n1", "boot1", a, 8), M("n2", "boot2", b, 8), M("n1-ib", "boot1", a, 8)});
  REQUIRE_FALSE(twice.ok());
  CHECK(twice.status().exit_code() == 78);
  CHECK(twice.status().message() ==
        "hosts n1 and n1-ib would both run workers on GPU GPU-a0: list each machine once, or give each host its "
        "own GPUs (CUDA_VISIBLE_DEVICES)");
  // Two containers of one node, 4 GPUs each: one machine, no GPU shared.
  std::vector<std::string> lo(a.begin(), a.begin() + 4), hi(a.begin() + 4, a.end());
  auto pods = CheckMachines({M("pod1", "boot1", lo, 4), M("pod2", "boot1", hi, 4), M("n2", "boot2", b, 8)});
  REQUIRE(pods.ok());
  REQUIRE(pods->size() == 1);
  CHECK((*pods)[0] == "hosts pod1 and pod2 run on one machine (kernel boot id boot1): a failure of it takes both, "
                      "which the plan counts as two");
  // Only the GPUs the slots take: 2 slots each of a list of 8 in two orders.
  std::vector<std::string> rev(a.rbegin(), a.rend());
  CHECK(CheckMachines({M("x", "boot1", a, 2), M("y", "boot1", rev, 2)}).ok());
  CHECK_FALSE(CheckMachines({M("x", "boot1", a, 8), M("y", "boot1", rev, 2)}).ok());
  // The CPU: no GPUs, no boot id known: nothing to say.
  auto cpu = CheckMachines({M("c1", "", {}, 1), M("c2", "", {}, 1)});
  REQUIRE(cpu.ok());
  CHECK(cpu->empty());
  CHECK_FALSE(BootId().empty());
}

TEST_CASE("threads per worker: the host's cores shared, at least one") {
  CHECK(ThreadsPerWorker(16, 4) == 4);
  CHECK(ThreadsPerWorker(16, 3) == 5);
  CHECK(ThreadsPerWorker(2, 4) == 1);
  CHECK(ThreadsPerWorker(8, 0) == 8);
  CHECK(ThreadVariables().front() == "OMP_NUM_THREADS");
}

namespace {
const char* NoThreadVars(const char*) { return nullptr; }
const char* OmpOne(const char* var) { return std::string(var) == "OMP_NUM_THREADS" ? "1" : nullptr; }
const char* OmpAndMkl(const char* var) {
  const std::string v = var;
  return v == "OMP_NUM_THREADS" ? "3" : v == "MKL_NUM_THREADS" ? "2" : v == "OPENBLAS_NUM_THREADS" ? "" : nullptr;
}
std::string Said(const std::vector<ThreadSetting>& s) {
  std::string out;
  for (const auto& t : s) out += t.var + "=" + t.value + "/" + std::to_string(static_cast<int>(t.origin)) + " ";
  return out;
}
}  // namespace

TEST_CASE("thread variables: the share unless the environment sizes the pools, BLAS following OMP_NUM_THREADS") {
  CHECK(Said(ThreadSettings(4, NoThreadVars)) == "OMP_NUM_THREADS=4/0 OPENBLAS_NUM_THREADS=4/0 MKL_NUM_THREADS=4/0 ");
  // OMP_NUM_THREADS=1 as torchrun users set it: a BLAS pool of the share
  // beside it oversubscribed the cores (4 workers on 2 cores ran 1.5x slower).
  CHECK(Said(ThreadSettings(2, OmpOne)) == "OMP_NUM_THREADS=1/1 OPENBLAS_NUM_THREADS=1/2 MKL_NUM_THREADS=1/2 ");
  // An empty variable is unset.
  CHECK(Said(ThreadSettings(8, OmpAndMkl)) == "OMP_NUM_THREADS=3/1 OPENBLAS_NUM_THREADS=3/2 MKL_NUM_THREADS=2/1 ");
}

TEST_CASE("CPU quota: whole CPUs of cgroup v2's cpu.max and v1's cfs files, 0 when unlimited") {
  CHECK(QuotaCpus("max 100000\n") == 0);
  CHECK(QuotaCpus("400000 100000\n") == 4);
  CHECK(QuotaCpus("150000 100000") == 2);  // 1.5 CPUs: 2 threads, not 1
  CHECK(QuotaCpus("5000 100000") == 1);
  CHECK(QuotaCpus("") == 0);
  CHECK(QuotaCpus("garbage") == 0);
  CHECK(QuotaCpus("100000 0") == 0);
  CHECK(QuotaCpus("-1\n", "100000\n") == 0);
  CHECK(QuotaCpus("200000\n", "100000\n") == 2);
  CHECK(QuotaCpus("250000", "100000") == 3);
  CHECK(QuotaCpus("x", "100000") == 0);
}

TEST_CASE("CPU quota: the cgroup directories of /proc/self/cgroup under their mounts, innermost first") {
  // cgroup v2 in a container: the mount's root is the container's cgroup.
  const std::string v2_cgroup = "0::/kubepods/pod1/ctr\n";
  const std::string v2_mounts =
      "28 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
      "30 23 0:27 / /proc rw - proc proc rw\n";
  auto dirs = CpuCgroupDirs(v2_cgroup, v2_mounts);
  REQUIRE(dirs.size() == 4);
  CHECK(dirs[0].path == "/sys/fs/cgroup/kubepods/pod1/ctr");
  CHECK(dirs[0].v2);
  CHECK(dirs[1].path == "/sys/fs/cgroup/kubepods/pod1");
  CHECK(dirs[3].path == "/sys/fs/cgroup");
  // A bind mount of our own cgroup (root /docker/abc shown at the mount).
  dirs = CpuCgroupDirs("0::/docker/abc\n", "28 23 0:26 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n");
  REQUIRE(dirs.size() == 1);
  CHECK(dirs[0].path == "/sys/fs/cgroup");
  // v1, the cpu controller mounted with cpuacct; optional tags before "-".
  const std::string v1_cgroup = "4:memory:/x\n3:cpu,cpuacct:/slurm/job7\n0::/\n";
  const std::string v1_mounts =
      "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct\n"
      "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
      "40 31 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
  dirs = CpuCgroupDirs(v1_cgroup, v1_mounts);
  REQUIRE(dirs.size() == 4);  // v1: job7, slurm, the mount; v2: its root
  CHECK(dirs[0].path == "/sys/fs/cgroup/cpu,cpuacct/slurm/job7");
  CHECK_FALSE(dirs[0].v2);
  CHECK(dirs[2].path == "/sys/fs/cgroup/cpu,cpuacct");
  CHECK(dirs[3].path == "/sys/fs/cgroup/unified");
  CHECK(dirs[3].v2);
  // Nothing to go on: no directories.
  CHECK(CpuCgroupDirs("", v1_mounts).empty());
  CHECK(CpuCgroupDirs(v1_cgroup, "").empty());
  // A cgroup outside what the mount shows is not ours to read.
  CHECK(CpuCgroupDirs("0::/other\n", "28 23 0:26 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n").empty());
}

// --device auto resolved per host: a host whose GPUs are not seen (a driver
// fault) would run Gloo/CPU workers beside NCCL/CUDA ones (before
// 2026-11-28 it did, and the job hung in its first collective).
TEST_CASE("one job runs on one kind of device: hosts that differ are refused, naming them") {
  using ob::launch::CheckOneDevice;
  using ob::launch::MachineOf;
  auto host = [](const std::string& name, const std::string& device) {
    MachineOf m;
    m.host = name;
    m.device = device;
    return m;
  };
  CHECK(CheckOneDevice({}).ok());
  CHECK(CheckOneDevice({host("a", "cuda"), host("b", "cuda"), host("c", "cuda")}).ok());
  CHECK(CheckOneDevice({host("a", "cpu"), host("b", "cpu")}).ok());
  CHECK(CheckOneDevice({host("a", "cuda"), host("b", "")}).ok());  // an agent that did not say
  const ob::Status st = CheckOneDevice({host("a", "cuda"), host("c", "cpu"), host("b", "cuda")});
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == ob::Code::kConfig);
  CHECK(st.message() ==
        "hosts run on different devices: cuda on a, b; cpu on c (no GPU seen there: --device auto). Mend their "
        "GPUs or leave those hosts out of the hosts file, or give --device cpu");
}

TEST_CASE("one build: hosts whose ob-launch is not the master's are named, by build", "[devices]") {
  using ob::launch::CheckOneBuild;
  using ob::launch::MachineOf;
  auto host = [](const std::string& name, const std::string& build) {
    MachineOf m;
    m.host = name;
    m.build = build;
    return m;
  };
  const std::string mine = "ob-launch 0.1.0 (da0f788), LibTorch 1.13.0";
  CHECK(CheckOneBuild({}, mine).ok());
  CHECK(CheckOneBuild({host("a", mine), host("b", mine)}, mine).ok());
  CHECK(CheckOneBuild({host("a", mine), host("b", "")}, mine).ok());  // an agent that did not say
  CHECK(CheckOneBuild({host("a", "x"), host("b", "y")}, "").ok());    // a master that does not know
  const ob::Status st = CheckOneBuild({host("a", mine), host("b", "old"), host("c", "older"), host("d", "old")}, mine);
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == ob::Code::kConfig);
  CHECK(st.message() == "hosts run another build of ob-launch than this master (" + mine +
                            "): old on b, d; older on c. Install this one on every host (the path --agent-exe "
                            "names)");
}

TEST_CASE("MFU is over the dense peak of the GPU the worker runs on, not the one the plan was priced for") {
  std::string from;
  // A plan made with --analytic --gpu a100 (312 TFLOP/s), run on an H100:
  // over the A100's peak, MFU would read 3.2 times too high.
  CHECK(MfuPeakFlops("NVIDIA H100 80GB HBM3", ob::model::Precision::kBf16, 312, "bfloat16", &from) == 989e12);
  CHECK(from == "NVIDIA H100 80GB HBM3's dense bf16 peak");
  CHECK(MfuPeakFlops("NVIDIA A100-SXM4-80GB", ob::model::Precision::kBf16, 989, "bfloat16", &from) == 312e12);
  CHECK(MfuPeakFlops("NVIDIA H200", ob::model::Precision::kBf16, 0, "", &from) == 989e12);
  // An fp32 run is over the CUDA cores' fp32 peak (ob does not enable
  // TF32), not the tensor cores' bf16 peak, 15 times higher.
  CHECK(MfuPeakFlops("NVIDIA H100 80GB HBM3", ob::model::Precision::kFp32, 989, "bfloat16", &from) == 67e12);
  CHECK(from == "NVIDIA H100 80GB HBM3's dense fp32 peak");
  CHECK(MfuPeakFlops("NVIDIA A100-SXM4-40GB", ob::model::Precision::kFp32, 0, "", &from) == 19.5e12);
  // A GPU the table lacks: the profile's peak, in the run's precision only.
  CHECK(MfuPeakFlops("NVIDIA GeForce RTX 4090", ob::model::Precision::kBf16, 165, "bfloat16", &from) == 165e12);
  CHECK_THAT(from, Catch::StartsWith("the plan's profile's peak"));
  CHECK(MfuPeakFlops("NVIDIA GeForce RTX 4090", ob::model::Precision::kBf16, 165, "float32", &from) == 0);
  CHECK(MfuPeakFlops("NVIDIA H100 PCIe", ob::model::Precision::kBf16, 0, "bfloat16", &from) == 0);  // not the SXM part
}
