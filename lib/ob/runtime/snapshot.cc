// Host snapshots of a stage's parameters and AdamW state (see snapshot.h).
#include "ob/runtime/snapshot.h"

#include <memory>
#include <sstream>
#include <string>
#include <type_traits>

#include "ob/torch_compat.h"

namespace ob::runtime {

namespace {

// A host buffer like `like` (pinned when it lives on CUDA), reusing `buf`.
void CopyToHost(const torch::Tensor& src, torch::Tensor* buf) {
  if (!buf->defined() || !buf->sizes().equals(src.sizes()) || buf->dtype() != src.dtype()) {
    auto options = src.options().device(torch::kCPU).pinned_memory(src.is_cuda());
    *buf = torch::empty(src.sizes(), options);
  }
  buf->copy_(src.detach());
}

}  // namespace

int64_t StageSnapshot::bytes() const {
  int64_t n = 0;
  for (const auto& [name, t] : tensors) {
    n += t.value.nbytes() + t.exp_avg.nbytes() + t.exp_avg_sq.nbytes();
  }
  return n;
}

void CaptureSnapshot(const model::GptStage& stage, const torch::Tensor& tied,
                     torch::optim::AdamW& optimizer, int64_t step, StageSnapshot* into) {
  torch::NoGradGuard no_grad;
  into->step = -2;  // invalid until complete: a throw below leaves it unusable

  into->first_layer = stage->first();
  into->last_layer = stage->last();
  auto& state = optimizer.state();
  for (const auto& item : stage->named_parameters()) {
    const torch::Tensor& p = item.value();
    TensorSnapshot& t = into->tensors[SnapshotKey(item.key(), p, tied)];
    CopyToHost(p, &t.value);
    auto it = state.find(compat::OptimizerStateKey(state, p));
    if (it == state.end()) {
      CopyToHost(torch::zeros_like(p), &t.exp_avg);
      CopyToHost(torch::zeros_like(p), &t.exp_avg_sq);
      t.adam_step = 0;
    } else {
      auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
      CopyToHost(s.exp_avg(), &t.exp_avg);
      CopyToHost(s.exp_avg_sq(), &t.exp_avg_sq);
      t.adam_step = s.step();
    }
  }
  into->step = step;
}

void SetAdamState(torch::optim::AdamW& optimizer, const torch::Tensor& p,
                  const TensorSnapshot& snap) {
  auto& state = optimizer.state();
  const auto key = compat::OptimizerStateKey(state, p);
  state.erase(key);
  if (snap.adam_step == 0) return;
  auto s = std::make_unique<torch::optim::AdamWParamState>();
  s->step(snap.adam_step);
  s->exp_avg(snap.exp_avg.to(p.device(), /*non_blocking=*/false, /*copy=*/true));
  s->exp_avg_sq(snap.exp_avg_sq.to(p.device(), /*non_blocking=*/false, /*copy=*/true));
  state[key] = std::move(s);
}

}  // namespace ob::runtime
