// Activation recomputation (see recompute.h).
#include "ob/model/recompute.h"

#include <ATen/Context.h>
#include <torch/autograd.h>

#include <atomic>
#include <mutex>

#include "ob/model/compute_copies.h"
#include "ob/torch_compat.h"

namespace ob::model {
namespace {

std::atomic<int64_t> recomputations{0};

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A device's default generator's state, taken and put back.
struct RngState {
  torch::Device device{torch::kCPU};
  torch::Tensor state;

  static RngState Of(const torch::Device& device) {
    at::Generator gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    return {device, gen.get_state()};
  }
  void Restore() const {
    at::Generator gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
};

// What the backward needs to run the forward again as it ran.
struct Replay : public torch::CustomClassHolder {
  TensorsFn fn;
  std::vector<bool> needs_grad;  // per input
  std::vector<RngState> rng;     // the CPU's, and the inputs' GPU's
  torch::Device device{torch::kCPU};
  bool autocast = false;
  ComputeCopies* copies = nullptr;
};

// Detached copies of `xs` (same storage) that require grad where `needs` says.
std::vector<torch::Tensor> Leaves(const std::vector<torch::Tensor>& xs, const std::vector<bool>& needs) {
  std::vector<torch::Tensor> out;
  out.reserve(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) out.push_back(xs[i].detach().requires_grad_(needs[i]));
  return out;
}

struct CheckpointFn : public torch::autograd::Function<CheckpointFn> {
  // `inputs` as a TensorList: autograd takes each as an input (a vector
  // would be one argument that is no tensor).
  static variable_list forward(AutogradContext* ctx, at::TensorList list, c10::intrusive_ptr<Replay> replay) {
    const variable_list inputs = list.vec();
    ctx->save_for_backward(inputs);
    ctx->saved_data["replay"] = c10::IValue::make_capsule(replay);
    // With gradients on, as the recomputation will run: the same functions,
    // the same bits. The graph is dropped with `outs`' history.
    torch::AutoGradMode grad(true);
    std::vector<torch::Tensor> outs = replay->fn(Leaves(inputs, replay->needs_grad));
    for (auto& o : outs) o = o.detach();
    return outs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    auto replay = c10::static_intrusive_pointer_cast<Replay>(ctx->saved_data["replay"].toCapsule());
    std::vector<RngState> now;
    for (const RngState& r : replay->rng) {
      now.push_back(RngState::Of(r.device));
      r.Restore();
    }
    std::vector<torch::Tensor> leaves = Leaves(saved, replay->needs_grad);
    // Each input's gradient as it arrives, before the leaf's accumulator
    // lays it out like the leaf: the layout autograd would have handed on
    // without the checkpoint (a transposed view stays one), so that what
    // reduces it downstream (a norm's weight gradient) sums in the same order.
    std::vector<torch::Tensor> arrived(leaves.size());
    for (size_t i = 0; i < leaves.size(); ++i) {
      if (!leaves[i].requires_grad()) continue;
      leaves[i].register_hook([&arrived, i](const torch::Tensor& g) {
        arrived[i] = g;
        return torch::Tensor();
      });
    }
    {
      ComputeCopies::Scope copies(replay->copies);
      compat::AutocastGuard autocast(replay->device, replay->autocast);
      torch::AutoGradMode grad(true);
      std::vector<torch::Tensor> outs = replay->fn(leaves);
      std::vector<torch::Tensor> roots, seeds;
      for (size_t i = 0; i < outs.size() && i < grads.size(); ++i) {
        if (outs[i].requires_grad() && grads[i].defined()) {
          roots.push_back(outs[i]);
          seeds.push_back(grads[i]);
        }
      }
      if (!roots.empty()) torch::autograd::backward(roots, seeds);
    }
    recomputations.fetch_add(1, std::memory_order_relaxed);
    for (const RngState& r : now) r.Restore();
    variable_list out(arrived.begin(), arrived.end());
    out.push_back(torch::Tensor());  // the replay
    return out;
  }
};

}  // namespace

std::vector<torch::Tensor> Checkpointed(const TensorsFn& fn, const std::vector<torch::Tensor>& inputs) {
  // Undefined inputs are not autograd's: passed around it, put back for fn.
  std::vector<torch::Tensor> defined;
  std::vector<int> where;
  for (size_t i = 0; i < inputs.size(); ++i) {
    where.push_back(inputs[i].defined() ? static_cast<int>(defined.size()) : -1);
    if (inputs[i].defined()) defined.push_back(inputs[i]);
  }
  auto replay = c10::make_intrusive<Replay>();
  replay->fn = [fn, where](const std::vector<torch::Tensor>& xs) {
    std::vector<torch::Tensor> all;
    for (int w : where) all.push_back(w >= 0 ? xs[static_cast<size_t>(w)] : torch::Tensor());
    return fn(all);
  };
  // Without gradients, or with no input that needs one, nothing to keep:
  // fn runs as it is (a checkpoint without such an input would cut its
  // parameters off the graph).
  bool any = false;
  for (const auto& x : defined) {
    replay->needs_grad.push_back(x.requires_grad());
    any = any || x.requires_grad();
  }
  if (!torch::GradMode::is_enabled() || !any) return fn(inputs);
  for (const auto& x : defined) {
    if (x.is_cuda()) {
      replay->device = x.device();
      break;
    }
  }
  replay->rng.push_back(RngState::Of(torch::Device(torch::kCPU)));
  if (replay->device.is_cuda()) replay->rng.push_back(RngState::Of(replay->device));
  for (const auto& x : defined) {
    if (x.is_floating_point()) {
      replay->autocast = compat::AutocastDtype(x).has_value();
      break;
    }
  }
  replay->copies = ComputeCopies::Current();
  return CheckpointFn::apply(at::TensorList(defined), replay);
}

torch::Tensor Checkpointed(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& x) {
  return Checkpointed([fn](const std::vector<torch::Tensor>& xs) { return std::vector<torch::Tensor>{fn(xs[0])}; },
                      {x})
      .front();
}

int64_t RecomputeCount() { return recomputations.load(std::memory_order_relaxed); }

}  // namespace ob::model
