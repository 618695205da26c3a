// The schedules (schedule.h): a new one is a file stating its order and a
// line here. And what every schedule shares: names, peaks, descriptions.
#include <algorithm>
#include <memory>

#include "ob/schedule/schedule.h"

namespace ob::schedule {

extern const Schedule kOneFOneB;
extern const Schedule kZbH1;
extern const Schedule kZbH2;

const std::vector<const Schedule*>& All() {
  static const std::vector<const Schedule*> all{
      &kOneFOneB,  // one_f_one_b.cc
      &kZbH1,      // zb_h1.cc
      &kZbH2,      // zb_h2.cc
  };
  return all;
}

const Schedule& OneFOneB() { return kOneFOneB; }

const Schedule* Find(std::string_view name) {
  if (name.empty()) return &kOneFOneB;
  for (const Schedule* s : All())
    if (s->name == name) return s;
  return nullptr;
}

std::string Names() {
  std::string out;
  for (const Schedule* s : All()) {
    if (!out.empty()) out += ", ";
    out += s->name;
  }
  return out;
}

std::vector<Held> Peaks(const std::vector<Op>& order) {
  // The most weight inputs held at each count of activations, then the
  // points no other dominates: from the most activations down, each that
  // holds more weight inputs than every point with more activations.
  std::vector<int> most_w;
  Held now;
  for (const Op& op : order) {
    switch (op.type) {
      case Op::kForward: ++now.activations; break;
      case Op::kBackward: --now.activations; break;
      case Op::kInputGrad: --now.activations, ++now.weight_inputs; break;
      case Op::kWeightGrad: --now.weight_inputs; break;
    }
    if (op.type != Op::kForward && op.type != Op::kInputGrad) continue;
    if (static_cast<int>(most_w.size()) <= now.activations) most_w.resize(now.activations + 1, -1);
    most_w[now.activations] = std::max(most_w[now.activations], now.weight_inputs);
  }
  std::vector<Held> out;
  int best = -1;
  for (int a = static_cast<int>(most_w.size()) - 1; a >= 0; --a) {
    if (most_w[a] > best) out.push_back({a, most_w[a]}), best = most_w[a];
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<StageCosts> UnitCosts(int stages) {
  return std::vector<StageCosts>(static_cast<size_t>(std::max(0, stages)), StageCosts{1, 1, 1, 0, 0});
}

std::shared_ptr<const PipelineOrders> Orders(const Schedule& s, int stages, int microbatches) {
  return Orders(s, UnitCosts(stages), microbatches);
}

std::shared_ptr<const PipelineOrders> Orders(const Schedule& s, const std::vector<StageCosts>& costs,
                                             int microbatches) {
  if (s.orders) return s.orders(costs, microbatches);
  const int stages = static_cast<int>(costs.size());
  auto all = std::make_shared<PipelineOrders>();
  for (int i = 0; i < stages; ++i) all->push_back(s.order(i, stages, microbatches));
  return all;
}

std::vector<std::vector<Held>> PipelinePeaks(const Schedule& s, const std::vector<StageCosts>& costs,
                                             int microbatches) {
  std::vector<std::vector<Held>> out;
  for (const std::vector<Op>& order : *Orders(s, costs, microbatches)) out.push_back(Peaks(order));
  return out;
}

uint64_t PeakBytes(const std::vector<Held>& peaks, uint64_t activation_bytes, uint64_t weight_input_bytes) {
  uint64_t most = 0;
  for (const Held& h : peaks)
    most = std::max(most, static_cast<uint64_t>(h.activations) * activation_bytes +
                              static_cast<uint64_t>(h.weight_inputs) * weight_input_bytes);
  return most;
}

std::string Describe(const Op& op) {
  static const char* const kPrefix[] = {"F", "BW", "B", "W"};
  return kPrefix[op.type] + std::to_string(op.microbatch);
}

std::string Describe(const std::vector<Op>& order) {
  std::string out;
  for (const Op& op : order) {
    if (!out.empty()) out += ' ';
    out += Describe(op);
  }
  return out;
}

}  // namespace ob::schedule
