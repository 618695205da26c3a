// MeasureProfile (see measured.h): the device opened and described, every
// layer built and measured (measure_chain.h: a step's chain of them timed,
// in every recomputation mode, and each one's update), the contention
// curve under --concurrency (background_load.h), and the all-reduces timed.
#include "ob/profile/measured.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>

#include <torch/torch.h>

#include "ob/build_info.h"
#include "ob/launch/worker/blas.h"
#include "ob/launch/worker/heap.h"
#include "ob/model/gpt.h"
#include "ob/profile/analytic.h"
#include "ob/profile/background_load.h"
#include "ob/profile/collective.h"
#include "ob/profile/measure_chain.h"
#include "ob/profile/profile.h"
#include "ob/torch_compat.h"

namespace ob::profile {
namespace {

using namespace detail;  // measure_chain.h, background_load.h

// "model name" from /proc/cpuinfo, or the machine type.
std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos)
      return line.substr(line.find(':') + 2);
  }
  return "cpu";
}

// A "KEY: N kB" line of a /proc file, in bytes (0 when unreadable).
uint64_t ProcBytes(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::strtoull(line.c_str() + key.size() + 1, nullptr, 10) * 1024;
  }
  return 0;
}

// VmRSS of this process, bytes (0 when unreadable).
uint64_t ResidentBytes() { return ProcBytes("/proc/self/status", "VmRSS"); }

// MemAvailable, bytes (0 when unreadable).
uint64_t AvailableHostBytes() { return ProcBytes("/proc/meminfo", "MemAvailable"); }

// Measuring holds every layer's weights and gradients and a micro-batch's
// activations at once: refused before any is made when even that (the
// analytic model's count, a lower bound: no AdamW state, no workspace)
// exceeds the memory here, which LibTorch's allocator reported as an
// internal error ("enforce fail at alloc_cpu.cpp"), or the kernel's OOM
// killer ended. kUnavailable naming both sizes.
Status CheckMemoryFor(const model::GptConfig& c, const MeasureOptions& o, int seq_len, const torch::Device& dev) {
  AnalyticOptions a;
  OB_ASSIGN_OR_RETURN(a.gpu, FindGpu("h100"));  // the bytes do not depend on the GPU
  a.microbatches = {o.microbatches.empty() ? 1 : *std::max_element(o.microbatches.begin(), o.microbatches.end())};
  a.seq_len = seq_len;
  a.fp32 = !o.bf16;
  a.max_group = 1;
  OB_ASSIGN_OR_RETURN(pb::Profile model, AnalyticProfile(c, a));
  uint64_t need = 0;
  for (const auto& l : model.layers()) {
    need += l.parameter_bytes() + l.gradient_bytes();
    if (l.costs_size() > 0) need += l.costs(0).activation_bytes();
  }
  const uint64_t have = dev.is_cuda() ? compat::CudaTotalMemory(dev.index()) : AvailableHostBytes();
  if (have == 0 || need <= have) return Status::Ok();
  auto gib = [](uint64_t b) { return std::to_string(static_cast<int64_t>(std::ceil(b / double(1ull << 30)))) + " GiB"; };
  return Status::Unavailable(
      "measuring " + c.name + " needs at least " + gib(need) + " (every layer's weights and gradients, and the "
      "activations of a micro-batch of " + std::to_string(a.microbatches[0]) + " x " + std::to_string(seq_len) +
      "), more than the " + gib(have) + (dev.is_cuda() ? " of the GPU" : " of memory available here") +
      ": model it with --analytic --gpu NAME, or measure a smaller model");
}

// The device `o` names, checked against this build and this machine.
Result<torch::Device> OpenDevice(const MeasureOptions& o) {
  torch::Device dev(torch::kCPU);
  try {
    dev = torch::Device(o.device);
  } catch (const std::exception&) {
    return Status::Config("unknown device '" + o.device + "' (use cpu or cuda[:N])");
  }
  if (dev.is_cuda()) {
#ifndef OB_WITH_CUDA
    return Status::Config("this ob was built without CUDA (LibTorch " OB_TORCH_VERSION " CPU); use --device cpu");
#endif
    if (compat::CudaDeviceCount() == 0) return Status::Unavailable("--device cuda: no CUDA device visible");
    if (!dev.has_index()) dev = torch::Device(torch::kCUDA, 0);
  }
  return dev;
}

// This process set up as a worker would be before its stage: --threads
// for LibTorch and the BLAS, the seed. On the CPU, what such a process
// holds then (bytes resident), else 0.
uint64_t PrepareProcess(const MeasureOptions& o, const torch::Device& dev) {
  // --threads for the BLAS too: a profile "with one thread" whose OpenBLAS
  // kept a pool of every core ran its products 20-30% faster than the
  // one-thread workers it was to predict, and made a --concurrency load
  // twice too heavy.
  if (o.threads > 0) {
    torch::set_num_threads(o.threads);
    launch::SetBlasThreads(o.threads, o.threads);
  }
  torch::manual_seed(o.seed);
  uint64_t process_bytes = 0;
  if (!dev.is_cuda()) {
    // What a worker holds before its stage: the runtime's code and pools,
    // a Gloo group, one small op run.
    (void)TimeAllReduce({4096}, 1, "cpu", 0, 1);
    (void)torch::ones({64, 64}).matmul(torch::ones({64, 64})).sum().item<float>();
    process_bytes = ResidentBytes();
  }
  return process_bytes;
}

// The profile's device record: what `dev` is and holds, and how it was measured.
void DescribeDevice(const MeasureOptions& o, const torch::Device& dev, uint64_t process_bytes, pb::Profile& p) {
  auto* d = p.mutable_device();
  d->set_kind(dev.is_cuda() ? "cuda" : "cpu");
  d->set_name(dev.is_cuda() ? compat::CudaDeviceName(dev.index())
                            : CpuModelName() + ", " + std::to_string(torch::get_num_threads()) +
                                  " threads");
  d->set_threads(torch::get_num_threads());
  d->set_concurrency(static_cast<uint32_t>(o.concurrency));
  d->set_process_bytes(process_bytes);
  d->set_devices_per_node(dev.is_cuda() ? compat::CudaDeviceCount() : 1);
  if (dev.is_cuda()) d->set_memory_bytes(compat::CudaTotalMemory(dev.index()));
  else d->set_memory_bytes(static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE));
  // The dense peak of the profile's dtype, for MFU, where the GPU's is
  // published (gpus.h).
  if (auto gpu = GpuForDevice(d->name()); dev.is_cuda() && gpu.ok()) d->set_peak_tflops(DensePeakTflops(*gpu, !o.bf16));
  p.set_warmup(o.warmup);
  p.set_repeats(o.repeats);
  p.set_torch_version(compat::TorchVersion());
}

// Every planner layer of `c` built on `dev`, with its record in the profile
// (parameters, their bytes and their gradients').
std::vector<model::PlannerLayer> AddLayers(const model::GptConfig& c, const MeasureOptions& o,
                                           const torch::Device& dev, pb::Profile& p) {
  std::vector<model::PlannerLayer> layers;
  for (int i = 0; i < c.num_layers(); ++i) {
    model::PlannerLayer layer = model::MakeLayer(c, i, o.seed);
    layer->to(dev);
    auto* l = p.add_layers();
    l->set_index(i);
    l->set_kind(layer->kind());
    l->set_name(layer->name());
    uint64_t count = 0, bytes = 0;
    for (const auto& t : layer->parameters()) {
      count += static_cast<uint64_t>(t.numel());
      bytes += TensorBytes(t);
    }
    l->set_parameter_count(count);
    if (layer->kind() == pb::LAYER_HEAD)
      l->set_tied_parameter_count(static_cast<uint64_t>(c.vocab_size) * c.n_embd);
    // The fp32 weights, and under bf16 their compute copies (2 bytes each).
    l->set_parameter_bytes(bytes + (o.bf16 ? 2 * count : 0));
    l->set_gradient_bytes(bytes);  // fp32 gradients, one per weight
    layers.push_back(std::move(layer));
  }
  return layers;
}

std::vector<model::PlannerLayer> ChainOf(const model::GptConfig& c, const MeasureOptions& o,
                                         const torch::Device& dev, const std::vector<model::PlannerLayer>& layers) {
  // The chain ties the head to the embed's token table, as a stage holding
  // both does (model/gpt.h); the layers above keep the head's own copy,
  // which its bytes count for stages without the embed.
  std::vector<model::PlannerLayer> chain = layers;
  if (chain.size() >= 2 && chain.back()->kind() == pb::LAYER_HEAD) {
    auto* embed = dynamic_cast<model::EmbedLayerImpl*>(chain.front().get());
    if (embed != nullptr) {
      chain.back() = std::make_shared<model::HeadLayerImpl>(c, o.seed, embed->token_table());
      chain.back()->to(dev);
    }
  }
  return chain;
}

// The work of a measured profile, for MeasureOptions::progress: each
// chained pass over the layers counts a unit a layer, each layer's update
// one, the contention curve and each all-reduce group one each.
struct Tally {
  const MeasureOptions& o;
  int done = 0, total = 0;
  void Step(int units, const std::string& line) {
    done += units;
    if (o.progress) o.progress(line, done, total);
  }
};

std::string Ms(Clock::time_point since) { return std::to_string(static_cast<int>(Seconds(since) * 1e3)) + " ms"; }

// Each micro-batch size's costs of every layer, in the chain, and of the
// blocks again in each recomputation mode.
void MeasureCosts(const model::GptConfig& c, const MeasureOptions& o, std::vector<model::PlannerLayer>& chain, int s,
                  const torch::Device& dev, pb::Profile& p, Tally& tally) {
  const int L = c.num_layers();
  for (int b : o.microbatches) {
    auto t0 = Clock::now();
    std::vector<pb::LayerCost> costs = MeasureChain(c, chain, b, s, dev, o);
    tally.Step(L, "micro-batch " + std::to_string(b) + ", " + std::to_string(L) + " layers chained: " + Ms(t0));
    // The blocks again in each recomputation mode (model/recompute.h): what
    // they keep, and what their backward takes beyond none's. A full
    // block's backward runs its forward again: where the difference is
    // lost in the noise, that forward's own time stands for it.
    for (model::Recompute r : {model::Recompute::kSelective, model::Recompute::kFull}) {
      for (auto& layer : chain) layer->set_recompute(r);
      t0 = Clock::now();
      const std::vector<pb::LayerCost> again = MeasureChain(c, chain, b, s, dev, o);
      tally.Step(L, "micro-batch " + std::to_string(b) + ", " + std::to_string(L) + " layers chained, " +
                        (r == model::Recompute::kSelective ? "selective" : "full") + " recomputation: " + Ms(t0));
      for (int i = 0; i < c.num_layers(); ++i) {
        if (chain[static_cast<size_t>(i)]->kind() != pb::LAYER_BLOCK) continue;
        const double extra = again[i].backward_seconds() - costs[i].backward_seconds();
        if (r == model::Recompute::kSelective) {
          costs[i].set_selective_activation_bytes(again[i].activation_bytes());
          costs[i].set_selective_recompute_seconds(std::max(0.0, extra));
        } else {
          costs[i].set_full_activation_bytes(again[i].activation_bytes());
          costs[i].set_full_recompute_seconds(extra > 0 ? extra : costs[i].forward_seconds());
        }
      }
    }
    for (auto& layer : chain) layer->set_recompute(model::Recompute::kNone);
    for (int i = 0; i < c.num_layers(); ++i) *p.mutable_layers(i)->add_costs() = costs[i];
  }
}

void MeasureContentionCurve(const MeasureOptions& o, BackgroundLoad& load, pb::Profile& p, Tally& tally) {
  auto* d = p.mutable_device();
  const auto t0 = Clock::now();
  for (double x : MeasureContention(o, load)) d->add_contention(x);
  load.Run(o.concurrency - 1);
  std::string curve;
  for (double x : d->contention()) curve += (curve.empty() ? "" : " ") + std::to_string(x).substr(0, 4);
  tally.Step(1, "contention, 1-" + std::to_string(o.concurrency) + " computing: " + curve + " in " + Ms(t0));
}

// Each layer's optimizer state and update time.
void MeasureUpdates(const model::GptConfig& c, const MeasureOptions& o, std::vector<model::PlannerLayer>& layers,
                    const torch::Device& dev, pb::Profile& p, Tally& tally) {
  for (int i = 0; i < c.num_layers(); ++i) {
    const auto t0 = Clock::now();
    double update = 0;
    auto* l = p.mutable_layers(i);
    l->set_optimizer_state_bytes(OptimizerStateBytes(layers[i], dev, o, &update));
    l->set_update_seconds(update);
    tally.Step(1, "layer " + std::to_string(i + 1) + "/" + std::to_string(c.num_layers()) + " " + layers[i]->name() +
                      " update: " + Ms(t0));
  }
}

Status MeasureAllReduces(const model::GptConfig& c, const MeasureOptions& o, int s, const torch::Device& dev,
                         int max_group, BackgroundLoad& load, pb::Profile& p, Tally& tally) {
  // Gradient all-reduce: every distinct gradient size, each group size once;
  // and a block's output of one micro-batch, the bytes a stage boundary and
  // a tensor-parallel all-reduce move, so that ob-plan --local prices those
  // from a measured point instead of extrapolating the gradients' line down
  // to them. Each block gets its gradient's entries, then its output's.
  std::vector<uint64_t> sizes;
  for (const auto& l : p.layers()) sizes.push_back(l.gradient_bytes());
  uint64_t output_bytes = 0;
  for (const auto& l : p.layers())
    if (l.kind() == pb::LAYER_BLOCK && l.costs_size() > 0) output_bytes = l.costs(0).output_bytes();
  if (output_bytes > 0) sizes.push_back(output_bytes);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  std::map<int, std::map<uint64_t, double>> timed;  // group → bytes → seconds
  for (int g = 1; g <= max_group; g *= 2) {
    auto t0 = Clock::now();
    // The group's ranks and, under --concurrency, as many processes
    // training beside them as make up the workers sharing the machine.
    load.Run(o.concurrency - g);
    // Sharing the cores, each rank computes between its all-reduces as a
    // worker does (collective.h): a block's MLP product of one micro-batch.
    Between between;
    if (o.concurrency > 1) between = {static_cast<int64_t>(o.microbatches.front()) * s, c.n_embd, 4 * c.n_embd};
    auto times = TimeAllReduce(sizes, g, dev.str(), o.warmup, o.repeats, between);
    if (!times.ok()) return times.status();
    for (size_t i = 0; i < sizes.size(); ++i) timed[g][sizes[i]] = (*times)[i];
    tally.Step(1, "all-reduce, group of " + std::to_string(g) + ": " + std::to_string(sizes.size()) + " sizes in " +
                      Ms(t0));
  }
  load.Stop();
  for (auto& l : *p.mutable_layers()) {
    auto add = [&l, &timed](uint64_t bytes) {
      for (const auto& [g, by_size] : timed) {
        auto* ar = l.add_allreduce();
        ar->set_group_size(g);
        ar->set_bytes(bytes);
        ar->set_seconds(by_size.at(bytes));
      }
    };
    add(l.gradient_bytes());
    if (l.kind() == pb::LAYER_BLOCK && output_bytes > 0) add(output_bytes);
  }
  return Status::Ok();
}

// FLOPs per micro-batch are a property of the shapes, not the device.
void SetFlops(const model::GptConfig& c, int s, pb::Profile& p) {
  for (auto& l : *p.mutable_layers()) {
    for (auto& cost : *l.mutable_costs()) {
      double flops = TrainingFlopsPerToken(c, l.kind(), s) * cost.microbatch() * s;
      cost.set_forward_flops(flops / 3.0);
      cost.set_backward_flops(flops * 2.0 / 3.0);
    }
  }
}

}  // namespace

Result<pb::Profile> MeasureProfile(const model::GptConfig& c, const MeasureOptions& o) {
  if (o.warmup < 0 || o.repeats < 1) return Status::Config("--warmup must be >= 0 and --repeats >= 1");
  if (o.max_group < 0) return Status::Config("--allreduce-max must be >= 1");
  OB_ASSIGN_OR_RETURN(pb::Profile p, NewLayerProfile(c, pb::PROFILE_MEASURED,
                                                     o.bf16 ? "bfloat16" : "float32", o.seq_len,
                                                     o.microbatches));
  const int s = static_cast<int>(p.sequence_length());
  OB_ASSIGN_OR_RETURN(const torch::Device dev, OpenDevice(o));
  if (o.concurrency < 1) return Status::Config("--concurrency must be >= 1");
  OB_RETURN_IF_ERROR(CheckMemoryFor(c, o, s, dev));
  if (o.concurrency > 1 && dev.is_cuda())
    return Status::Config("--concurrency is for workers sharing CPU cores; on CUDA each worker has its GPU");
  // The heap as a worker keeps it (launch/worker/heap.h): with glibc's
  // defaults a layer's tensors are fresh pages each pass, and the times a
  // third longer than the workers' own. Before the load processes fork.
  launch::KeepFreedMemory();
  // N − 1 train beside this process while it times the layers; one more
  // stands by (stopped) for the contention curve's k = N.
  BackgroundLoad load;
  if (o.concurrency > 1) {
    OB_RETURN_IF_ERROR(load.Start(c, o, s, o.concurrency));
    load.Run(o.concurrency - 1);
  }
  const uint64_t process_bytes = PrepareProcess(o, dev);
  // Unset, the all-reduce groups go up to this node's GPUs (a one-GPU
  // machine times the group of one alone), or to 4 ranks on the CPU.
  const int max_group = o.max_group > 0 ? o.max_group : dev.is_cuda() ? compat::CudaDeviceCount() : 4;
  DescribeDevice(o, dev, process_bytes, p);
  std::vector<model::PlannerLayer> layers = AddLayers(c, o, dev, p);
  std::vector<model::PlannerLayer> chain = ChainOf(c, o, dev, layers);
  Tally tally{o};
  int groups = 0;
  for (int g = 1; g <= max_group; g *= 2) ++groups;
  tally.total = 3 * c.num_layers() * static_cast<int>(o.microbatches.size()) + (o.concurrency > 1 ? 1 : 0) +
                c.num_layers() + groups;
  MeasureCosts(c, o, chain, s, dev, p, tally);
  if (o.concurrency > 1) MeasureContentionCurve(o, load, p, tally);
  MeasureUpdates(c, o, layers, dev, p, tally);
  chain.clear();
  layers.clear();
  OB_RETURN_IF_ERROR(MeasureAllReduces(c, o, s, dev, max_group, load, p, tally));
  SetFlops(c, s, p);
  return p;
}

}  // namespace ob::profile
