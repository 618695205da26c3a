// Templates whose stages mix tensor-parallel degrees (templates.h,
// SearchMixed): a dynamic programme over stages of any degree the tables
// offer, packed into the nodes, for every bound on the slowest stage.
#include <algorithm>
#include <cmath>
#include <set>

#include "ob/plan/templates_impl.h"

namespace ob::plan {
namespace detail {
namespace {

// Stages of any degree the tables offer, packed front to back into the n
// nodes: a node's stages use all its g GPUs, a stage never spans nodes, and
// the stage r-th from the end holds r micro-batches in flight. State, built
// from the back: layers [j, L) covered by r stages that use G GPUs (the
// node being filled, the front-most, has G mod g of them); the first stage
// put into a node from the back is its last, so it sends to the next node
// unless it ends the pipeline. For a bound B, one pass gives the least Σw
// with every w <= B (mode kSum) or the least max w (mode kMax).
class MixedSearch {
 public:
  MixedSearch(const Problem& p, const std::vector<StageTable>& tables, int nodes)
      : tables_(tables), L_(p.num_layers()), g_(p.cluster.gpus_per_node), GN_(nodes * g_),
        R_(std::min(L_, GN_)) {
    for (const StageTable& t : tables) R_ = std::min(R_, t.max_stages);
  }

  // Work of one pass, to decide whether the search is affordable.
  double Work() const {
    return static_cast<double>(L_) * L_ * (R_ + 1) * (GN_ + 1) * static_cast<double>(tables_.size());
  }

  enum Mode { kMax, kSum };
  // The best value under `bound`; with `stages`, the stages (front to back).
  double Pass(Mode mode, double bound, std::vector<StageShape>* stages = nullptr) {
    const size_t size = static_cast<size_t>(L_ + 1) * (R_ + 1) * (GN_ + 1);
    v_.assign(size, kInf);
    if (stages) from_.assign(size, 0), table_of_.assign(size, -1);
    v_[Idx(L_, 0, 0)] = 0;
    for (int j = L_; j > 0; --j) {
      for (int r = 0; r < R_; ++r) {
        for (int G = 0; G < GN_; ++G) {
          const double cur = v_[Idx(j, r, G)];
          if (cur == kInf) continue;
          const int x = G % g_;
          const bool crossing = x == 0 && j != L_;
          for (size_t ti = 0; ti < tables_.size(); ++ti) {
            const StageTable& t = tables_[ti];
            if (x + t.tp > g_) continue;
            for (int s = j - 1; s >= 0; --s) {  // the stage is [s, j - 1]
              const int at = t.At(s, j - 1);
              if (t.max_in_flight[at] < r + 1) break;  // longer needs more memory
              if (t.compute[at] > bound) break;        // and more time
              const double w = t.W(at, r + 1, crossing);
              if (w > bound) continue;
              const size_t to = Idx(s, r + 1, G + t.tp);
              const double nv = mode == kMax ? std::max(cur, w) : cur + w;
              if (nv < v_[to]) {
                v_[to] = nv;
                if (stages) from_[to] = Idx(j, r, G), table_of_[to] = static_cast<int>(ti);
              }
            }
          }
        }
      }
    }
    double best = kInf;
    size_t at = 0;
    for (int r = 1; r <= R_; ++r) {
      if (v_[Idx(0, r, GN_)] < best) best = v_[Idx(0, r, GN_)], at = Idx(0, r, GN_);
    }
    if (stages && best < kInf) {
      stages->clear();
      const size_t per_j = static_cast<size_t>(R_ + 1) * (GN_ + 1);
      for (size_t cur = at; cur != Idx(L_, 0, 0); cur = from_[cur]) {
        StageShape s;
        s.first = static_cast<int>(cur / per_j);
        s.last = static_cast<int>(from_[cur] / per_j) - 1;
        const StageTable& t = tables_[static_cast<size_t>(table_of_[cur])];
        s.tp = t.tp;
        // It is r-th from the end: the r of the state it was put into.
        s.recompute = t.ModeOf(t.At(s.first, s.last), static_cast<int>((cur / (GN_ + 1)) % (R_ + 1)));
        // GPUs used from this stage to the back, this one's included.
        const int used_before = GN_ - static_cast<int>(cur % (GN_ + 1));
        s.node = used_before / g_;
        stages->push_back(s);
      }
    }
    return best;
  }

 private:
  size_t Idx(int j, int r, int G) const {
    return (static_cast<size_t>(j) * (R_ + 1) + r) * (GN_ + 1) + G;
  }
  const std::vector<StageTable>& tables_;
  int L_, g_, GN_, R_;
  std::vector<double> v_;
  std::vector<size_t> from_;
  std::vector<int> table_of_;
};

Template MakeMixedTemplate(const Problem& p, int nodes, const std::vector<StageShape>& stages) {
  Template out;
  out.nodes = nodes;
  out.stages_per_node = 0;
  out.stages = stages;
  SetFigures(p, &out);
  // One degree and the same count on every node: the uniform template it is.
  const int S = static_cast<int>(stages.size()), k = S / nodes;
  bool uniform = S % nodes == 0;
  for (int i = 0; uniform && i < S; ++i) uniform = stages[i].tp == stages[0].tp && stages[i].node == i / k;
  if (uniform) out.stages_per_node = k;
  return out;
}

}  // namespace

std::optional<MixedResult> BestMixed(const Problem& p, const std::vector<StageTable>& tables, int nodes, double m,
                                     const MixedOptions& o) {
  if (tables.empty()) return std::nullopt;
  MixedSearch search(p, tables, nodes);
  if (search.Work() > o.max_work) return std::nullopt;
  MixedResult out;
  const double b_star = search.Pass(MixedSearch::kMax, kInf);
  if (b_star == kInf) return std::nullopt;
  std::vector<StageShape> best_stages;
  double best = kInf;
  if (std::isinf(m) || m <= 1) {  // the steady state alone, or fill and drain alone
    const double bound = std::isinf(m) ? b_star : kInf;
    best = search.Pass(MixedSearch::kSum, bound, &best_stages);
    out.bounds_tried = 1;
  } else {
    std::set<double> ws;  // every w at or above B*, ascending
    for (const StageTable& t : tables) {
      for (size_t m = 0; m < t.modes.size(); ++m)
        for (size_t at = 0; at < t.compute.size(); ++at)
          for (const double link : {t.cross_link[at], t.local_link[at]}) {
            const double w = t.mode_compute[m][at] + link;
            if (w >= b_star && w < kInf) ws.insert(w);
          }
    }
    const double floor = search.Pass(MixedSearch::kSum, kInf);  // Σw under no bound
    for (double b : ws) {
      if (floor + (m - 1) * b >= best) break;
      if (out.bounds_tried >= o.max_bounds) {
        out.capped = true;
        break;
      }
      ++out.bounds_tried;
      std::vector<StageShape> stages;
      const double sum = search.Pass(MixedSearch::kSum, b, &stages);
      if (sum == kInf) continue;
      if (sum + (m - 1) * b < best) best = sum + (m - 1) * b, best_stages = std::move(stages);
    }
  }
  if (best_stages.empty()) return std::nullopt;
  out.t = MakeMixedTemplate(p, nodes, best_stages);
  return out;
}

}  // namespace detail

std::optional<MixedResult> SearchMixed(const Problem& p, int nodes, double m, const MixedOptions& o) {
  if (nodes < 1 || p.num_layers() == 0) return std::nullopt;
  const int g = p.cluster.gpus_per_node;
  const std::vector<int> degrees = o.degrees.empty() ? TensorParallelChoices(p) : o.degrees;
  std::vector<detail::StageTable> tables;
  for (int t : degrees) {
    if (t < 1 || g % t != 0) continue;
    tables.push_back(detail::MakeTable(p, g / t, std::min(p.num_layers(), nodes * g)));
  }
  return detail::BestMixed(p, tables, nodes, m, o);
}

}  // namespace ob::plan
