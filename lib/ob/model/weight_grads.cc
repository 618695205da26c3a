// Deferred weight gradients (weight_grads.h).
#include "ob/model/weight_grads.h"

#include <atomic>
#include <cassert>
#include <set>

#include "ob/model/linear_impl.h"

namespace ob::model {
namespace {

// The scope of the thread that opened it: autograd runs a CPU graph's
// backward on the thread that asked for it, so workers of one process (the
// runtime tests' threads) each defer into their own. A device's backward
// runs on autograd's thread for that device, which sees the process's one
// scope (g_into: a worker process runs one at a time).
thread_local WeightGradients* t_into = nullptr;
std::atomic<WeightGradients*> g_into{nullptr};

}  // namespace

void WeightGradients::Keep(Kind kind, const torch::Tensor& param, const torch::Tensor& a, const torch::Tensor& b) {
  entries_.push_back({kind, param, a, b, unit_});
}

void WeightGradients::Run(int unit) {
  // As autograd runs the backward that kept them: no graph (the layer
  // inputs kept may be leaves that require grad).
  torch::NoGradGuard no_grad;
  std::vector<Entry> rest;
  for (Entry& e : entries_) {
    if (unit >= 0 && e.unit != unit) {
      rest.push_back(std::move(e));
      continue;
    }
    switch (e.kind) {
      case Kind::kWeight: detail::SumWeightGradient(e.param, e.a, e.b); break;
      case Kind::kBias: detail::SumBiasGradient(e.param, e.a); break;
      case Kind::kAdd: detail::SumIntoGradient(e.param, e.a); break;
    }
  }
  entries_ = std::move(rest);
}

uint64_t WeightGradients::bytes() const {
  std::set<const void*> seen;
  uint64_t total = 0;
  auto count = [&](const torch::Tensor& t) {
    if (!t.defined()) return;
    const void* p = t.storage().data();
    if (!seen.insert(p).second) return;
    total += t.storage().nbytes();
  };
  for (const Entry& e : entries_) count(e.a), count(e.b);
  return total;
}

DeferWeightGradients::DeferWeightGradients(WeightGradients* into) {
  assert(t_into == nullptr && "one DeferWeightGradients scope a thread at a time");
  t_into = into;
  WeightGradients* none = nullptr;
  g_into.compare_exchange_strong(none, into);  // taken: another thread's, which its own device threads read
}

DeferWeightGradients::~DeferWeightGradients() {
  WeightGradients* mine = t_into;
  g_into.compare_exchange_strong(mine, nullptr);
  t_into = nullptr;
}

WeightGradients* DeferringWeightGradients() { return t_into != nullptr ? t_into : g_into.load(); }

}  // namespace ob::model
