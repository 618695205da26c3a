// A step's chain of layers timed, and an AdamW update measured (see
// measure_chain.h).
#include "ob/profile/measure_chain.h"

#include "ob/model/weight_grads.h"

#include <malloc.h>

#include <memory>

#include "ob/model/train.h"
#include "ob/torch_compat.h"

namespace ob::profile::detail {

int64_t InUseBytes(const torch::Device& dev) {
  if (dev.is_cuda()) return compat::CudaAllocatedBytes(dev.index());
  struct mallinfo2 mi = mallinfo2();
  return static_cast<int64_t>(mi.uordblks + mi.hblkhd);
}

uint64_t TensorBytes(const torch::Tensor& t) {
  return static_cast<uint64_t>(t.numel()) * t.element_size();
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

LayerInputs MakeInputs(const model::GptConfig& c, pb::LayerKind kind, int b, int s,
                       const torch::Device& dev) {
  auto ids = torch::TensorOptions().dtype(torch::kInt64).device(dev);
  LayerInputs in;
  in.targets = torch::randint(c.vocab_size, {b, s}, ids);
  if (kind == pb::LAYER_EMBED) {
    in.input = torch::randint(c.vocab_size, {b, s}, ids);
  } else {
    in.input = torch::randn({b, s, c.n_embd}, torch::TensorOptions().device(dev)).requires_grad_(true);
  }
  return in;
}

std::vector<pb::LayerCost> MeasureChain(const model::GptConfig& c, std::vector<model::PlannerLayer>& layers,
                                        int b, int s, const torch::Device& dev, const MeasureOptions& o) {
  const size_t n = layers.size();
  std::vector<Samples> fwd(n), bwd(n), wgt(n);
  std::vector<uint64_t> weight_inputs(n, 0);
  std::vector<int64_t> activation(n, -1);
  std::vector<uint64_t> output_bytes(n, 0);
  // Under bf16 the layers read their weights' compute copies, as a
  // worker's do (model/compute_copies.h): made once a step outside the
  // layers' times, and not in their activation bytes (parameter_bytes
  // counts them).
  std::unique_ptr<model::ComputeCopies> copies;
  if (o.bf16) copies = model::MakeComputeCopies(layers, torch::kBFloat16);
  for (int k = 0; k < o.warmup + o.repeats; ++k) {
    LayerInputs first = MakeInputs(c, layers.front()->kind(), b, s, dev);
    if (copies) copies->Refresh();
    model::ComputeCopies::Scope use_copies(copies.get());
    // Gradients accumulate from the first micro-batch on, as in a step of
    // several: the timed backwards add into the previous ones.
    if (k == 0)
      for (auto& layer : layers)
        for (auto& p : layer->parameters()) p.mutable_grad() = torch::Tensor();
    std::vector<torch::Tensor> inputs(n), outputs(n);
    // Each layer timed by the device (CUDA events; the host's clock on the
    // CPU), with no synchronisation between layers: a worker queues a
    // whole micro-batch, so its GPU runs layer after layer while the host
    // launches ahead. A synchronisation around every layer, as here before,
    // timed the launches of each layer's kernels as well and made
    // gpt2-medium's step on an H200 look 2.1x longer than it ran. (The
    // allocator's byte count needs none: it is kept on the host.)
    std::vector<std::unique_ptr<compat::DeviceTimer>> ft(n), bt(n), wt(n);
    compat::Synchronize(dev);
    for (size_t i = 0; i < n; ++i) {
      inputs[i] = i == 0 ? first.input : outputs[i - 1].detach().requires_grad_(true);
      const int64_t before = InUseBytes(dev);
      ft[i] = std::make_unique<compat::DeviceTimer>(dev);
      ft[i]->Start();
      {
        compat::AutocastGuard autocast(dev, o.bf16);
        outputs[i] = layers[i]->forward(inputs[i], first.targets);
      }
      ft[i]->Stop();
      if (activation[i] < 0 && k >= o.warmup) {
        output_bytes[i] = TensorBytes(outputs[i]);
        activation[i] = std::max<int64_t>(0, InUseBytes(dev) - before - static_cast<int64_t>(output_bytes[i]));
      }
    }
    // The backward as the zero-bubble schedules split it (model/weight_grads.h):
    // the input gradient, then the weight gradients from what it kept,
    // each timed; the two are the whole backward's work.
    for (size_t i = n; i-- > 0;) {
      model::WeightGradients kept;
      bt[i] = std::make_unique<compat::DeviceTimer>(dev);
      wt[i] = std::make_unique<compat::DeviceTimer>(dev);
      bt[i]->Start();
      {
        model::DeferWeightGradients defer(&kept);
        if (i + 1 < n) outputs[i].backward(inputs[i + 1].grad());
        else outputs[i].backward();  // the head's output is the loss
      }
      bt[i]->Stop();
      outputs[i] = torch::Tensor();  // its graph is spent; free it as a step does
      if (k >= o.warmup) weight_inputs[i] = kept.bytes();
      wt[i]->Start();
      kept.Run();
      wt[i]->Stop();
    }
    if (k >= o.warmup) {
      for (size_t i = 0; i < n; ++i) {
        fwd[i].v.push_back(ft[i]->Seconds());
        bwd[i].v.push_back(bt[i]->Seconds() + wt[i]->Seconds());
        wgt[i].v.push_back(wt[i]->Seconds());
      }
    }
  }
  // Every block of a GptConfig is the same work (one shape, one kind of
  // attention and MLP), so their samples are pooled and each block gets
  // the pool's typical time. Timed apart, one of four identical GPT-2-sized
  // blocks on the 2-core VM came out at 207 ms forward against 105 for the
  // others (a mean of 3, one repeat preempted), and the planner cut stages
  // by that: a 2-stage cut priced 783 and 593 ms a micro-batch ran 570 and
  // 570.
  Samples block_fwd, block_bwd, block_wgt;
  for (size_t i = 0; i < n; ++i) {
    if (layers[i]->kind() != pb::LAYER_BLOCK) continue;
    block_fwd.v.insert(block_fwd.v.end(), fwd[i].v.begin(), fwd[i].v.end());
    block_bwd.v.insert(block_bwd.v.end(), bwd[i].v.begin(), bwd[i].v.end());
    block_wgt.v.insert(block_wgt.v.end(), wgt[i].v.begin(), wgt[i].v.end());
  }
  for (size_t i = 0; i < n; ++i) {
    if (layers[i]->kind() != pb::LAYER_BLOCK) continue;
    fwd[i] = block_fwd, bwd[i] = block_bwd, wgt[i] = block_wgt;
  }
  std::vector<pb::LayerCost> costs(n);
  for (size_t i = 0; i < n; ++i) {
    costs[i].set_microbatch(b);
    costs[i].set_forward_seconds(fwd[i].Typical(o));
    costs[i].set_backward_seconds(bwd[i].Typical(o));
    costs[i].set_forward_spread(fwd[i].Spread());
    costs[i].set_backward_spread(bwd[i].Spread());
    costs[i].set_weight_grad_seconds(std::min(wgt[i].Typical(o), costs[i].backward_seconds()));
    costs[i].set_weight_input_bytes(weight_inputs[i]);
    costs[i].set_activation_bytes(static_cast<uint64_t>(activation[i]));
    costs[i].set_output_bytes(output_bytes[i]);
  }
  return costs;
}

uint64_t OptimizerStateBytes(model::PlannerLayer& layer, const torch::Device& dev,
                             const MeasureOptions& o, double* update_seconds) {
  std::vector<torch::Tensor> params;
  for (auto& p : layer->parameters()) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    params.push_back(p);
  }
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-4));
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> saved;
    for (auto& p : params) saved.push_back(p.detach().clone());
    Samples t;
    std::vector<torch::Tensor> snapshot;  // CPU: one row each for weight, exp_avg, exp_avg_sq
    for (int k = 0; k < o.warmup + o.repeats; ++k) {
      compat::Synchronize(dev);
      const auto t0 = Clock::now();
      std::vector<torch::Tensor> grads;
      for (auto& p : params) grads.push_back(p.grad());
      (void)torch::stack(at::_foreach_norm(grads, 2)).to(torch::kDouble).cpu();
      model::OptimizerStep(opt);  // as the workers: fused on CUDA
      if (!dev.is_cuda()) {
        // The host snapshot: each step the workers copy the weights and
        // both moments into their arena (runtime/snapshot_arena.h), on a
        // thread of their own that on the CPU shares the cores with the
        // training (on a GPU, a copy engine does it off the critical path).
        if (snapshot.empty()) {
          for (auto& p : params) snapshot.push_back(torch::empty({3, p.numel()}));
        }
        for (size_t i = 0; i < params.size(); ++i) {
          const auto& st = static_cast<const torch::optim::AdamWParamState&>(
              *opt.state().at(compat::OptimizerStateKey(opt.state(), params[i])));
          snapshot[i][0].copy_(params[i].reshape(-1));
          snapshot[i][1].copy_(st.exp_avg().reshape(-1));
          snapshot[i][2].copy_(st.exp_avg_sq().reshape(-1));
        }
      }
      compat::Synchronize(dev);
      if (k >= o.warmup) t.v.push_back(Seconds(t0));
    }
    *update_seconds = t.Typical(o);
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(saved[i]);  // leave weights as built
  }
  uint64_t state = 0;
  for (const auto& kv : opt.state()) {
    const auto& st = static_cast<const torch::optim::AdamWParamState&>(*kv.second);
    state += TensorBytes(st.exp_avg()) + TensorBytes(st.exp_avg_sq());
    if (st.max_exp_avg_sq().defined()) state += TensorBytes(st.max_exp_avg_sq());
  }
  return state;
}

}  // namespace ob::profile::detail
