// The schedules (schedule.h): a new one is a file stating its order and a
// line here. And what every schedule shares: names, peaks, descriptions.
#include <algorithm>
#include <cassert>
#include <memory>

#include "ob/schedule/schedule.h"

namespace ob::schedule {

extern const Schedule kOneFOneB;
extern const Schedule kZbH1;
extern const Schedule kZbH2;
extern const Schedule kInterleaved;
extern const Schedule kZbV;

const std::vector<const Schedule*>& All() {
  static const std::vector<const Schedule*> all{
      &kOneFOneB,  // one_f_one_b.cc
      &kZbH1,      // zb_h1.cc
      &kZbH2,      // zb_h2.cc
      &kInterleaved,  // interleaved.cc
      &kZbV,       // zb_v.cc
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

std::vector<Op> Order(const Schedule& s, int stage, int stages, int microbatches, int chunks) {
  assert(0 <= stage && stage < stages);
  return s.order(s.ChainOf(stages, chunks), stage, microbatches);
}

std::shared_ptr<const PipelineOrders> Orders(const Schedule& s, int stages, int microbatches, int chunks) {
  return Orders(s, UnitCosts(stages * chunks), microbatches, chunks);
}

std::shared_ptr<const PipelineOrders> Orders(const Schedule& s, const std::vector<StageCosts>& costs,
                                             int microbatches, int chunks) {
  assert(chunks >= s.min_chunks && chunks <= s.max_chunks && costs.size() % chunks == 0);
  const Chain chain = s.ChainOf(static_cast<int>(costs.size()) / chunks, chunks);
  if (s.orders) return s.orders(chain, costs, microbatches);
  auto all = std::make_shared<PipelineOrders>();
  for (int i = 0; i < chain.stages; ++i) all->push_back(s.order(chain, i, microbatches));
  return all;
}

std::vector<std::vector<Held>> PipelinePeaks(const Schedule& s, const std::vector<StageCosts>& costs,
                                             int microbatches, int chunks) {
  std::vector<std::vector<Held>> out;
  for (const std::vector<Op>& order : *Orders(s, costs, microbatches, chunks)) out.push_back(Peaks(order));
  return out;
}

uint64_t PeakBytes(const std::vector<Op>& order, const std::vector<uint64_t>& activation_bytes,
                   const std::vector<uint64_t>& weight_input_bytes) {
  uint64_t now = 0, most = 0;
  for (const Op& op : order) {
    const size_t c = static_cast<size_t>(op.chunk);
    const uint64_t a = activation_bytes[c], w = weight_input_bytes[c];
    switch (op.type) {
      case Op::kForward: now += a; break;
      case Op::kBackward: now -= a; break;
      case Op::kInputGrad: now = now - a + w; break;
      case Op::kWeightGrad: now -= w; break;
    }
    most = std::max(most, now);
  }
  return most;
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
  std::string out = kPrefix[op.type] + std::to_string(op.microbatch);
  if (op.chunk != 0) out += "." + std::to_string(op.chunk);
  return out;
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
