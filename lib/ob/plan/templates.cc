#include "ob/plan/templates.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <string>

namespace ob::plan {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Stage costs and memory limits for one choice of k stages per node, for every
// layer range [j, e]. Values come from the shared model functions themselves,
// so the DP compares exactly the numbers a reader of the template would.
// A stage runs the fastest recomputation mode it fits in (StageMode), which
// depends on how many micro-batches it holds: per mode, its compute and the
// most it fits.
struct StageTable {
  int k = 1, tp = 1, layers = 0, max_stages = 0;
  std::vector<model::Recompute> modes;  // the problem's, fastest first
  std::vector<double> compute;     // the fastest mode's: a lower bound, non-decreasing in e
  std::vector<double> cross_link;  // the boundary to the next node after layer e (by at)
  std::vector<double> local_link;  // the boundary inside the node
  std::vector<int> max_in_flight;  // largest r ≤ max_stages with StageFits (0: none)
  std::vector<std::vector<double>> mode_compute;  // [mode index][at]
  std::vector<std::vector<int>> mode_in_flight;   // [mode index][at]: largest r it fits
  int At(int j, int e) const { return j * layers + e; }
  // The mode index the stage at `at` runs holding r micro-batches (-1: none fits).
  int ModeIndex(int at, int r) const {
    for (size_t i = 0; i < modes.size(); ++i)
      if (mode_in_flight[i][at] >= r) return static_cast<int>(i);
    return -1;
  }
  model::Recompute ModeOf(int at, int r) const {
    const int i = ModeIndex(at, r);
    return i < 0 ? model::Recompute::kNone : modes[static_cast<size_t>(i)];
  }
  // w of the stage holding r micro-batches, sending over the network or not.
  double W(int at, int r, bool crossing) const {
    const int i = ModeIndex(at, r);
    if (i < 0) return kInf;
    return mode_compute[static_cast<size_t>(i)][at] + (crossing ? cross_link[at] : local_link[at]);
  }
  // w of the stage r-th from the end (r = 1: the last). A pipeline has
  // S = nodes·k stages, so the stage at index S − r is its node's last, and
  // sends to the next node, exactly when r ≡ 1 (mod k).
  double Seconds(int at, int r) const { return W(at, r, (r - 1) % k == 0); }
};

StageTable MakeTable(const Problem& p, int k, int max_stages) {
  StageTable t;
  const int L = p.num_layers();
  t.k = k;
  t.tp = p.cluster.gpus_per_node / k;
  t.layers = L;
  t.max_stages = max_stages;
  t.modes = p.recompute_modes;
  const size_t cells = static_cast<size_t>(L) * L;
  t.compute.assign(cells, kInf);
  t.cross_link.assign(cells, kInf);
  t.local_link.assign(cells, kInf);
  t.max_in_flight.assign(cells, 0);
  t.mode_compute.assign(t.modes.size(), std::vector<double>(cells, kInf));
  t.mode_in_flight.assign(t.modes.size(), std::vector<int>(cells, 0));
  for (size_t m = 0; m < t.modes.size(); ++m) {
    for (int j = 0; j < L; ++j) {
      // Memory only grows with the range and with the in-flight count, so the
      // largest in-flight count that fits only shrinks as e grows.
      int r = max_stages;
      for (int e = j; e < L; ++e) {
        while (r > 0 && StageMemoryBytes(p, j, e, t.tp, r, t.modes[m]) > p.cluster.gpu_memory) --r;
        const int at = t.At(j, e);
        t.mode_in_flight[m][at] = r;
        t.mode_compute[m][at] = StageComputeSeconds(p, j, e, t.tp, t.modes[m]);
        t.max_in_flight[at] = std::max(t.max_in_flight[at], r);
        t.compute[at] = std::min(t.compute[at], t.mode_compute[m][at]);
      }
    }
  }
  for (int j = 0; j < L; ++j) {
    for (int e = j; e < L; ++e) {
      t.cross_link[t.At(j, e)] = StageBoundarySeconds(p, e, true);
      t.local_link[t.At(j, e)] = StageBoundarySeconds(p, e, false);
    }
  }
  return t;
}

// F[r][j]: the smallest possible max w over partitions of layers [j, L) into r
// stages where the stage i-th from the end holds i micro-batches in flight.
// Because in-flight counts depend only on the position from the end, one
// table serves every S: B*(S) = F[S][0].
std::vector<double> MinimaxFromBack(const StageTable& t) {
  const int L = t.layers, R = t.max_stages;
  std::vector<double> F(static_cast<size_t>(R + 1) * (L + 1), kInf);
  auto f = [&](int r, int j) -> double& { return F[static_cast<size_t>(r) * (L + 1) + j]; };
  f(0, L) = 0;
  for (int r = 1; r <= R; ++r) {
    for (int j = 0; j + r <= L; ++j) {
      double best = kInf;
      for (int e = j; e <= L - r; ++e) {
        const int at = t.At(j, e);
        if (t.max_in_flight[at] < r || t.compute[at] >= best) break;
        const double rest = f(r - 1, e + 1);
        if (rest == kInf) continue;
        best = std::min(best, std::max(t.Seconds(at, r), rest));
      }
      f(r, j) = best;
    }
  }
  return F;
}

// Among partitions into S stages whose every w ≤ bound (and that fit), the
// one with the smallest Σw; the last layer of each stage, or empty if none.
// Ties go to the shortest first stage (strict improvement only).
std::vector<int> MinSumUnderBound(const StageTable& t, int S, double bound) {
  const int L = t.layers;
  std::vector<double> G(static_cast<size_t>(S + 1) * (L + 1), kInf);
  std::vector<int> arg(G.size(), -1);
  auto idx = [&](int r, int j) { return static_cast<size_t>(r) * (L + 1) + j; };
  G[idx(0, L)] = 0;
  for (int r = 1; r <= S; ++r) {
    // The S − r stages before must cover [0, j), one layer at least each.
    for (int j = S - r; j + r <= L; ++j) {
      double best = kInf;
      int best_e = -1;
      for (int e = j; e <= L - r; ++e) {
        const int at = t.At(j, e);
        if (t.max_in_flight[at] < r || t.compute[at] > bound) break;
        const double w = t.Seconds(at, r);
        if (w > bound) continue;
        const double rest = G[idx(r - 1, e + 1)];
        if (rest == kInf) continue;
        const double v = w + rest;
        if (v < best) best = v, best_e = e;
      }
      G[idx(r, j)] = best;
      arg[idx(r, j)] = best_e;
    }
  }
  if (G[idx(S, 0)] == kInf) return {};
  std::vector<int> lasts;
  for (int r = S, j = 0; r > 0; --r) {
    const int e = arg[idx(r, j)];
    lasts.push_back(e);
    j = e + 1;
  }
  return lasts;
}

// A template's figures from its nodes, stages_per_node and stages (each
// stage's node set when mixed): each stage's w — compute plus the
// boundary, over the network where the next stage is on another node, the
// same sum the tables hold — and memory with its 1F1B in-flight count, the
// bottleneck and Σw, the largest degree, the slowest stage's update and
// the busiest node's gradient.
void SetFigures(const Problem& p, Template* out) {
  const int S = static_cast<int>(out->stages.size());
  std::vector<uint64_t> node_grad(static_cast<size_t>(out->nodes), 0);
  out->tp = 1;
  for (int i = 0; i < S; ++i) {
    const StageShape& s = out->stages[i];
    const bool crosses = i + 1 < S && out->NodeOf(i + 1) != out->NodeOf(i);
    const double w = StageComputeSeconds(p, s) + StageBoundarySeconds(p, s.last, crosses);
    out->stage_seconds.push_back(w);
    out->stage_memory.push_back(StageMemoryBytes(p, s.first, s.last, s.tp, S - i, s.recompute));
    out->bottleneck = std::max(out->bottleneck, w);
    out->total += w;
    out->tp = std::max(out->tp, s.tp);
    double update = 0;
    for (int l = s.first; l <= s.last; ++l) {
      node_grad[static_cast<size_t>(out->NodeOf(i))] += p.layers[l].gradient_bytes;
      update += p.layers[l].update / s.tp;
    }
    out->update_seconds = std::max(out->update_seconds, update);
  }
  out->node_gradient_bytes = *std::max_element(node_grad.begin(), node_grad.end());
}

Template MakeTemplate(const Problem& p, const StageTable& t, int nodes,
                      const std::vector<int>& lasts) {
  Template out;
  out.nodes = nodes;
  out.stages_per_node = t.k;
  for (size_t i = 0, first = 0; i < lasts.size(); ++i) {
    const int r = static_cast<int>(lasts.size() - i);  // its micro-batches in flight
    StageShape st{static_cast<int>(first), lasts[i], t.tp};
    st.recompute = t.ModeOf(t.At(static_cast<int>(first), lasts[i]), r);
    out.stages.push_back(st);
    first = static_cast<size_t>(lasts[i]) + 1;
  }
  SetFigures(p, &out);
  return out;
}

bool Better(const Template& a, const Template& b) {
  if (a.bottleneck != b.bottleneck) return a.bottleneck < b.bottleneck;
  return a.total < b.total;
}

// The time a pipeline of `t` is expected to take per iteration: its 1F1B of
// m micro-batches (m real: the batch's share of its nodes) and its tail.
double Expected(const Problem& p, const Template& t, double m) {
  return t.total + (m - 1) * t.bottleneck + StepTailSeconds(p, t);
}

// The k that divide g and leave a tensor-parallel degree t = g/k the model
// can be split by (t divides the heads and the MLP width: the runtime's
// rule, runtime/topology.h CheckRunnable); k = g (t = 1) always.
std::vector<int> StagesPerNodeChoices(const Problem& p) {
  std::vector<int> ks;
  for (int k = 1; k <= p.cluster.gpus_per_node; ++k) {
    if (p.cluster.gpus_per_node % k != 0) continue;
    const int tp = p.cluster.gpus_per_node / k;
    const bool forced = std::any_of(p.tp_at.begin(), p.tp_at.end(), [&](const auto& a) { return a.second == tp; });
    if (p.tp > 0 && tp != p.tp && !forced) continue;
    if (tp > 1 && !p.TpDivides(tp)) continue;
    ks.push_back(k);
  }
  return ks;
}

// The micro-batches a pipeline of `nodes` nodes is expected to run: the
// batch's share of its nodes, M·nodes/N, at least 1; unbounded (the
// steady state alone decides) when the problem has no batch.
double ExpectedMicrobatches(const Problem& p, int nodes) {
  if (p.microbatches <= 0 || p.cluster.nodes <= 0) return kInf;
  return std::max(1.0, static_cast<double>(p.microbatches) * nodes / p.cluster.nodes);
}

std::optional<MixedResult> BestMixed(const Problem& p, const std::vector<StageTable>& tables, int nodes, double m,
                                     const MixedOptions& o);

// The best template for `nodes` nodes given per-k tables and their F; with
// `mixed` (tables whose max_stages covers every stage count of `nodes`
// nodes), a mixed template when it is expected to finish sooner.
std::optional<Template> BestFromTables(const Problem& p, const std::vector<StageTable>& tables,
                                       const std::vector<std::vector<double>>& minimax,
                                       int nodes, const std::vector<StageTable>* mixed = nullptr) {
  std::optional<Template> best;
  const double m = ExpectedMicrobatches(p, nodes);
  const int L = p.num_layers();
  for (size_t i = 0; i < tables.size(); ++i) {
    const StageTable& t = tables[i];
    auto at = p.tp_at.find(nodes);
    const int want = at != p.tp_at.end() ? at->second : p.tp;
    if (want > 0 && p.cluster.gpus_per_node / t.k != want) continue;
    const int S = nodes * t.k;
    if (S > std::min(L, t.max_stages)) continue;
    const double bound = minimax[i][static_cast<size_t>(S) * (L + 1)];
    if (bound == kInf) continue;
    const std::vector<int> lasts = MinSumUnderBound(t, S, bound);
    if (lasts.empty()) continue;  // cannot happen: the minimax partition qualifies
    Template cand = MakeTemplate(p, t, nodes, lasts);
    if (!best) {
      best = std::move(cand);
      continue;
    }
    const double a = std::isinf(m) ? 0 : Expected(p, cand, m);
    const double b = std::isinf(m) ? 0 : Expected(p, *best, m);
    if (a < b || (a == b && Better(cand, *best))) best = std::move(cand);
  }
  if (mixed && p.mixed_stages && p.tp == 0 && !p.tp_at.count(nodes)) {
    std::optional<Template> cand;
    if (auto r = BestMixed(p, *mixed, nodes, m, MixedOptions{})) cand = std::move(r->t);
    // Only when strictly faster. It may be of one degree after all: the
    // search above ranks each k's partitions by (max w, Σw), which at a
    // few micro-batches can miss the least Σw + (m − 1)·max w when the
    // boundaries' costs differ by layer.
    if (cand) {
      const bool faster = !best || (std::isinf(m) ? Better(*cand, *best) : Expected(p, *cand, m) < Expected(p, *best, m));
      if (faster) best = std::move(cand);
    }
  }
  return best;
}

// ---- Mixed templates ---------------------------------------------------------
//
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

// SearchMixed over the degrees of `tables` (whose max_stages covers every
// stage count of `nodes` nodes).
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

// ---- Memory diagnosis for the error messages ------------------------------

// The least GPU memory with which some node count n ≤ max_nodes has a
// partition that fits: a minimax DP over stage memory instead of time. The
// in-flight term is taken as linear in r, which the model is up to rounding;
// the answer is then confirmed against StageFits and nudged up if needed.
uint64_t LeastMemoryFor(const Problem& p, int max_nodes) {
  const int L = p.num_layers();
  auto fits_somewhere = [&](uint64_t memory) {
    Problem q = p;
    q.cluster.gpu_memory = memory;
    for (int k : StagesPerNodeChoices(q)) {
      const int R = std::min(L, max_nodes * k);
      if (R < k) continue;
      const std::vector<double> F = MinimaxFromBack(MakeTable(q, k, R));
      for (int S = k; S <= R; S += k)
        if (F[static_cast<size_t>(S) * (L + 1)] != kInf) return true;
    }
    return false;
  };
  double least = kInf;
  for (int k : StagesPerNodeChoices(p)) {
    const int tp = p.cluster.gpus_per_node / k;
    const int R = std::min(L, max_nodes * k);
    if (R < k) continue;
    std::vector<double> base(static_cast<size_t>(L) * L), per(static_cast<size_t>(L) * L);
    for (int j = 0; j < L; ++j)
      for (int e = j; e < L; ++e) {
        base[j * L + e] = static_cast<double>(StageMemoryBytes(p, j, e, tp, 0));
        per[j * L + e] = static_cast<double>(StageMemoryBytes(p, j, e, tp, 1)) - base[j * L + e];
      }
    std::vector<double> F(static_cast<size_t>(R + 1) * (L + 1), kInf);
    F[L] = 0;
    for (int r = 1; r <= R; ++r)
      for (int j = 0; j + r <= L; ++j) {
        double best = kInf;
        for (int e = j; e <= L - r; ++e) {
          const double rest = F[static_cast<size_t>(r - 1) * (L + 1) + e + 1];
          best = std::min(best, std::max(base[j * L + e] + r * per[j * L + e], rest));
        }
        F[static_cast<size_t>(r) * (L + 1) + j] = best;
      }
    for (int S = k; S <= R; S += k) least = std::min(least, F[static_cast<size_t>(S) * (L + 1)]);
  }
  if (least == kInf) return 0;
  uint64_t memory = static_cast<uint64_t>(std::ceil(least));
  for (int tries = 0; tries < 20 && !fits_somewhere(memory); ++tries)
    memory += std::max<uint64_t>(memory / 1000, 1);
  return memory;
}

// Rounded up (a need is not understated); under 0.1 GiB in MiB, where the
// tenths of a GiB said "0.1 GiB" of --gpu-memory 1e-9.
std::string GiBText(uint64_t bytes) {
  char buf[32];
  const double gib = static_cast<double>(bytes) / (1ull << 30);
  if (gib < 0.1) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", std::ceil(gib * 1024 * 10) / 10);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f GiB", std::ceil(gib * 10) / 10);
  }
  return buf;
}

// Why no node count works: the first layer that does not fit even alone on
// a whole node with one micro-batch in flight, else the model as a whole.
Status NothingFits(const Problem& p) {
  const int g = p.cluster.gpus_per_node;
  const int L = p.num_layers();
  // A node's GPUs are k stages × tensor parallelism t; t must divide the
  // heads (and 4 × the hidden size), so a node can hold more GPUs than the
  // layers can use ("the model needs at least 0.0 GiB per GPU" said it).
  const std::vector<int> ks = StagesPerNodeChoices(p);
  if (std::none_of(ks.begin(), ks.end(), [&](int k) { return k <= L; })) {
    int widest = 1;  // the largest tensor-parallel degree the model allows
    for (int t = 1; t <= std::max(1, p.n_head); ++t) {
      const bool divides = p.TpDivides(t);
      if (divides && (p.tp <= 0 || t == p.tp)) widest = t;
    }
    return Status::Config(
        "no layout uses a node's " + std::to_string(g) + " GPUs: as stages × tensor parallelism, with a degree the "
        "model allows (at most " + std::to_string(widest) + ": it divides the " + std::to_string(p.n_head) +
        " heads), a node needs " + (ks.empty() ? std::string("more") : "at least " + std::to_string(ks.front())) +
        " stages, and the model has " + std::to_string(L) + " layers; plan for at most " +
        std::to_string(L * widest) + " GPUs a node (--gpus-per-node)");
  }
  const uint64_t need = LeastMemoryFor(p, p.num_layers());
  const std::string have = GiBText(p.cluster.gpu_memory) + " per GPU";
  for (int l = 0; l < p.num_layers(); ++l) {
    if (StageFits(p, l, l, g, 1)) continue;
    return Status::Config("layer " + std::to_string(l) + " does not fit in " + have +
                          " even alone with tensor parallelism " + std::to_string(g) +
                          " (needs " + GiBText(StageMemoryBytes(p, l, l, g, 1)) +
                          "); the model needs at least " + GiBText(need) + " per GPU");
  }
  return Status::Config("no stage partition fits in " + have + " at any node count (" +
                        std::to_string(p.num_layers()) +
                        " layers, 1F1B in-flight activations); the model needs at least " +
                        GiBText(need) + " per GPU");
}

}  // namespace

int Template::StageOf(int layer) const {
  if (stages.empty() || layer < stages.front().first || layer > stages.back().last) return -1;
  auto it = std::upper_bound(stages.begin(), stages.end(), layer,
                             [](int l, const StageShape& s) { return l < s.first; });
  return static_cast<int>(it - stages.begin()) - 1;
}

int Template::FirstStageOn(int q) const {
  if (!mixed()) return q * stages_per_node;
  int i = 0;
  while (i < static_cast<int>(stages.size()) && stages[i].node < q) ++i;
  return i;
}

int Template::LastStageOn(int q) const {
  if (!mixed()) return (q + 1) * stages_per_node - 1;
  int i = static_cast<int>(stages.size()) - 1;
  while (i >= 0 && stages[i].node > q) --i;
  return i;
}

double StepTailSeconds(const Problem& p, const Template& t) {
  // Every node runs a pipeline: a template over fewer nodes than the
  // cluster's has replicas to all-reduce with; one over all of them, none.
  const bool replicas = t.nodes < p.cluster.nodes;
  if (!p.cluster.local) return (replicas ? AllReduceSeconds(p, t.node_gradient_bytes) : 0.0) + t.update_seconds;
  const bool stages = t.stages.size() > 1;
  const uint64_t bytes = replicas ? t.node_gradient_bytes : 0;
  const double buckets = replicas ? std::ceil(static_cast<double>(bytes) / kGradientBucketBytes) : 0;
  // The tied weight's gradient and the losses (its holders: the first and
  // last stage of every pipeline), then the norms over the pipeline and
  // the tensor-parallel group.
  const double collectives = buckets + (replicas || stages ? 2 : 0) + (stages ? 1 : 0) + (t.tp > 1 ? 1 : 0);
  return collectives * p.cluster.local_step.fixed + static_cast<double>(bytes) * p.cluster.local_step.per_byte +
         t.update_seconds;
}

const Template* TemplateSet::ForNodes(int n) const {
  // By each template's own count, not its index: a set read from a plan
  // file need not be the contiguous run that Generate makes.
  for (const Template& t : templates) {
    if (t.nodes == n) return &t;
  }
  return nullptr;
}

std::optional<Template> BestTemplate(const Problem& p, int nodes) {
  if (nodes < 1 || p.num_layers() == 0) return std::nullopt;
  std::vector<StageTable> tables;
  std::vector<std::vector<double>> minimax;
  std::vector<StageTable> mixed;
  for (int k : StagesPerNodeChoices(p)) {
    if (p.mixed_stages) mixed.push_back(MakeTable(p, k, std::min(p.num_layers(), nodes * p.cluster.gpus_per_node)));
    if (nodes * k > p.num_layers()) continue;
    tables.push_back(MakeTable(p, k, nodes * k));
    minimax.push_back(MinimaxFromBack(tables.back()));
  }
  return BestFromTables(p, tables, minimax, nodes, &mixed);
}

Result<TemplateSet> BuildTemplates(const Problem& p) {
  const int L = p.num_layers();
  const int N = p.cluster.nodes, f = p.faults;
  if (L == 0) return Status::Config("the model has no layers");
  std::vector<StageTable> tables;
  std::vector<std::vector<double>> minimax;
  for (int k : StagesPerNodeChoices(p)) {
    if (k > L) continue;
    tables.push_back(MakeTable(p, k, L));
    minimax.push_back(MinimaxFromBack(tables.back()));
  }
  auto has_template = [&](int n) {
    auto at = p.tp_at.find(n);
    const int want = at != p.tp_at.end() ? at->second : p.tp;
    for (size_t i = 0; i < tables.size(); ++i) {
      if (want > 0 && p.cluster.gpus_per_node / tables[i].k != want) continue;
      const int S = n * tables[i].k;
      if (S <= L && minimax[i][static_cast<size_t>(S) * (L + 1)] != kInf) return true;
    }
    return false;
  };
  int n0 = 0;
  for (int n = 1; n <= L && n0 == 0; ++n)
    if (has_template(n)) n0 = n;
  if (n0 == 0) return NothingFits(p);
  if (static_cast<int64_t>(N) < static_cast<int64_t>(n0) * (f + 1)) {
    std::string msg = "needs at least " + std::to_string(n0 * (f + 1)) + " nodes for f=" +
                      std::to_string(f) + ", n0=" + std::to_string(n0) + " (have " +
                      std::to_string(N) + ")";
    const int allowed = N / (f + 1);
    if (allowed >= 1) {
      if (const uint64_t need = LeastMemoryFor(p, allowed); need > 0)
        msg += "; with " + GiBText(need) + " per GPU n0 would be at most " + std::to_string(allowed);
    }
    return Status::Config(msg);
  }
  TemplateSet set;
  set.min_nodes = n0;
  // Consecutive node counts only: stop at the first one without a template.
  for (int n = n0; n <= N - f * n0; ++n) {
    std::optional<Template> t = BestFromTables(p, tables, minimax, n, &tables);
    if (!t) break;
    set.templates.push_back(std::move(*t));
  }
  return set;
}

std::optional<MixedResult> SearchMixed(const Problem& p, int nodes, double m, const MixedOptions& o) {
  if (nodes < 1 || p.num_layers() == 0) return std::nullopt;
  const int g = p.cluster.gpus_per_node;
  const std::vector<int> degrees = o.degrees.empty() ? TensorParallelChoices(p) : o.degrees;
  std::vector<StageTable> tables;
  for (int t : degrees) {
    if (t < 1 || g % t != 0) continue;
    tables.push_back(MakeTable(p, g / t, std::min(p.num_layers(), nodes * g)));
  }
  return BestMixed(p, tables, nodes, m, o);
}

std::vector<int> TensorParallelChoices(const Problem& p) {
  std::vector<int> ts;
  for (int k : StagesPerNodeChoices(p)) ts.push_back(p.cluster.gpus_per_node / k);
  std::sort(ts.begin(), ts.end());
  return ts;
}

}  // namespace ob::plan
