// Whether the hosts of a run fit together, from what each agent said of
// its machine (design: launch, "Devices"): one kind of device, one build of
// ob, GPUs that hold the plan's stages, no GPU shared by two hosts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ob/plan.pb.h"
#include "ob/status.h"

namespace ob::launch {

// What an agent said its machine is (control.proto's Hello): the boot id
// and the UUIDs of its GPUs, slot i's at i; `slots`: the workers the host
// may run (the hosts file's slots=).
struct MachineOf {
  std::string host;
  std::string boot_id;
  std::vector<std::string> gpus;
  int slots = 1;
  std::string device;  // what its workers run on: "cuda", "cpu" ("": not said)
  std::string build;   // its ob-launch (Hello.build; "": not said)
  std::vector<uint64_t> gpu_memory;    // as gpus: total bytes (0 or none: not said)
  std::vector<std::string> gpu_names;  // as gpus
};
// One job runs on one kind of device: NCCL groups cannot take Gloo ranks,
// and bf16 on some pipelines and fp32 on others would not be one model.
// kConfig when the hosts' workers would run on different devices (--device
// auto on a host whose GPUs are not seen, say after a driver fault):
// "hosts run on different devices: cuda on a, b; cpu on c: …". Hosts that
// did not say are left out.
Status CheckOneDevice(const std::vector<MachineOf>& hosts);
// One job runs one build of ob (Hello.build): a host left with an older
// install would train with other arithmetic, and snapshots and recovery
// transfers between builds need not read back. kConfig when a host's build
// is not `master_build`: "hosts run another build of ob-launch than this
// master (…): … on h3, h4. Install this one on every host (the path
// --agent-exe names)". Hosts that did not say, and an empty
// `master_build`, are left out.
Status CheckOneBuild(const std::vector<MachineOf>& hosts, const std::string& master_build);
// A plan fits the GPUs it runs on: its largest stage (`stage_bytes`, the
// most any template's stage needs on one GPU, since a recovery may put any
// stage on any host) within the memory of every GPU a host's workers use
// (its first `slots`), by ob-plan's own rule (stage memory at most the
// GPU's). A plan made for 80 GiB GPUs and run on 40 GiB ones would run out
// of memory at the first step, at every restart. kConfig: "the plan's
// stages need up to X GiB of GPU memory (it was made for GPUs of Y GiB),
// more than host a's GPU 0 (NAME) has Z GiB[, and …]: make the plan for
// these GPUs (ob-plan --gpu-memory Z, or a profile measured on one)"; one
// GPU a host, Z in GiB rounded down to 0.001 for ob-plan. Hosts that
// run on the CPU or did not say their GPUs' memory are left out.
Status CheckGpuMemory(const std::vector<MachineOf>& hosts, uint64_t stage_bytes, uint64_t plan_gpu_bytes);

// Hosts of a run that are not the machines they seem. kConfig when the
// workers of two hosts would share a GPU (one machine listed twice, or two
// containers given the same GPUs): "hosts a and b would both run workers on
// GPU GPU-…: list each machine once, or give each its own GPUs
// (CUDA_VISIBLE_DEVICES)". Otherwise one warning a pair of hosts on one
// machine (one boot id): a failure of it takes both, which a plan's f
// counts as two.
Result<std::vector<std::string>> CheckMachines(const std::vector<MachineOf>& hosts);

// The most GPU memory a stage of any of the plan's templates needs (what
// a host may be given after a recovery).
uint64_t LargestStageBytes(const pb::Plan& plan);

}  // namespace ob::launch
