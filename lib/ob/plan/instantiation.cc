#include "ob/plan/instantiation.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <functional>
#include <limits>
#include <queue>
#include <string>
#include <tuple>

#include "ob/plan/fault_sweep.h"
#include "ob/plan/schedule.h"

namespace ob::plan {
namespace {

// One template as the instantiation DP sees it.
struct Option {
  const Template* t = nullptr;
  double all_reduce = 0;  // StepTailSeconds
  // T(m), bit-identical to PipelineSeconds.
  double Seconds(int m) const { return t->Seconds(m) + all_reduce; }
  // How many m in [1, M] finish by tau (T is non-decreasing in m).
  int Capacity(double tau, int M) const {
    if (!(Seconds(1) <= tau)) return 0;
    if (!(t->bottleneck > 0)) return M;
    const double est = std::floor((tau - Seconds(1)) / t->bottleneck) + 1;
    int m = static_cast<int>(std::clamp(est, 1.0, static_cast<double>(M)));
    while (m > 1 && Seconds(m) > tau) --m;
    while (m < M && Seconds(m + 1) <= tau) ++m;
    return m;
  }
};

// The knapsack over node counts for one deadline tau. A state is (pipelines,
// nodes); its value the most micro-batches finishable by tau. The pipeline
// count is clipped at f + 1 when no multiset can have more pipelines than
// micro-batches (N / n0 ≤ M).
//
// Otherwise P ≤ M must hold too, and tracking P exactly up to M costs
// O(N · templates · M) a step (minutes at 16,384 nodes). Mostly it need not
// be tracked: when N / (the largest template) ≥ f + 1, every multiset that
// covers N has P ≥ f + 1, and a knapsack over nodes alone (O(N · templates))
// gives V, the most micro-batches any of them finishes by tau. V < M: tau is
// infeasible. Its multiset has P ≤ M: feasible. Else, if N is the sum of
// exactly M sizes of templates usable by tau (capacity ≥ 1; a coin change
// over their sizes), those M pipelines finish a micro-batch each: feasible.
// (With usable sizes a..b consecutive, every P from ⌈N/b⌉ to ⌊N/a⌋ is
// possible, so this settles every case.) Only what is left, or a floor
// f + 1 that binds, is tracked exactly.
// Which of the cases above a problem is in, from its templates' sizes.
struct Regime {
  bool clipped = true;       // N / n0 ≤ M: no multiset has more pipelines than micro-batches
  bool floor_binds = false;  // some multiset could have fewer than f + 1 pipelines
};
Regime RegimeOf(const Problem& p, const std::vector<int>& sizes) {
  const int N = p.cluster.nodes;
  int smallest = N, largest = 1;
  for (int n : sizes) {
    smallest = std::min(smallest, n);
    largest = std::max(largest, n);
  }
  return {N / smallest <= p.microbatches, (N + largest - 1) / largest < p.MinPipelines()};
}

std::vector<int> SizesOf(const std::vector<Template>& templates) {
  std::vector<int> sizes;
  for (const Template& t : templates) sizes.push_back(t.nodes);
  return sizes;
}

class Knapsack {
 public:
  Knapsack(const Problem& p, const std::vector<Option>& options)
      : options_(options), N_(p.cluster.nodes), M_(p.microbatches), need_(p.MinPipelines()) {
    std::vector<int> sizes;
    for (const Option& o : options_) sizes.push_back(o.t->nodes);
    const Regime r = RegimeOf(p, sizes);
    clipped_ = r.clipped;
    floor_binds_ = r.floor_binds;
  }

  // Whether some multiset covers all N nodes with f + 1 ≤ P ≤ M pipelines
  // that together can finish M micro-batches by tau; if so and `multiset` is
  // given, one such multiset (template node counts, largest first).
  bool Feasible(double tau, std::vector<int>* multiset = nullptr) {
    const int T = static_cast<int>(options_.size());
    caps_.assign(T, 0);
    for (int i = 0; i < T; ++i) caps_[i] = options_[i].Capacity(tau, M_);
    if (clipped_) return Counted(need_, true, multiset);
    if (!floor_binds_ && Spread(multiset)) return true;
    if (!floor_binds_ && settled_) return false;
    return Counted(M_, false, multiset);
  }

 private:
  size_t At(int c, int x) const { return static_cast<size_t>(c) * (N_ + 1) + x; }

  // States (pipelines up to `counts`, nodes): clipped at counts, or exact.
  bool Counted(int counts, bool clipped, std::vector<int>* multiset) {
    const int T = static_cast<int>(options_.size());
    const size_t states = static_cast<size_t>(counts + 1) * (N_ + 1);
    best_.assign(states, -1);
    from_.assign(states, -1);
    best_[At(0, 0)] = 0;
    for (int x = 0; x < N_; ++x) {
      for (int c = 0; c <= counts; ++c) {
        const int64_t v = best_[At(c, x)];
        if (v < 0) continue;
        const int c2 = clipped ? std::min(c + 1, counts) : c + 1;
        if (c2 > counts) continue;
        for (int i = 0; i < T; ++i) {
          if (caps_[i] == 0) continue;
          const int x2 = x + options_[i].t->nodes;
          if (x2 > N_) continue;
          const size_t to = At(c2, x2);
          if (v + caps_[i] > best_[to]) {
            best_[to] = v + caps_[i];
            from_[to] = static_cast<int64_t>(At(c, x)) * T + i;
          }
        }
      }
    }
    int end = -1;
    for (int c = need_; c <= counts && end < 0; ++c)
      if (best_[At(c, N_)] >= M_) end = c;
    if (end < 0) return false;
    if (multiset) {
      multiset->clear();
      for (int64_t s = static_cast<int64_t>(At(end, N_)); s != 0;) {
        const int i = static_cast<int>(from_[s] % T);
        multiset->push_back(options_[i].t->nodes);
        s = from_[s] / T;
      }
      std::sort(multiset->begin(), multiset->end(), std::greater<int>());
    }
    return true;
  }

  // The knapsack over nodes alone and the coin change (the class
  // comment); settled_ is false when neither decides.
  bool Spread(std::vector<int>* multiset) {
    const int T = static_cast<int>(options_.size());
    settled_ = true;
    best_.assign(N_ + 1, -1);
    from_.assign(N_ + 1, -1);
    best_[0] = 0;
    int smallest = N_ + 1;
    for (int i = 0; i < T; ++i)
      if (caps_[i] > 0) smallest = std::min(smallest, options_[i].t->nodes);
    for (int x = 0; x < N_; ++x) {
      const int64_t v = best_[x];
      if (v < 0) continue;
      for (int i = 0; i < T; ++i) {
        const int x2 = x + options_[i].t->nodes;
        if (caps_[i] == 0 || x2 > N_) continue;
        if (v + caps_[i] > best_[x2]) {
          best_[x2] = v + caps_[i];
          from_[x2] = i;
        }
      }
    }
    if (best_[N_] < M_) return false;
    std::vector<int> most;
    for (int x = N_; x != 0; x -= options_[from_[x]].t->nodes) most.push_back(options_[from_[x]].t->nodes);
    if (static_cast<int>(most.size()) <= M_) {
      if (multiset) {
        std::sort(most.begin(), most.end(), std::greater<int>());
        *multiset = std::move(most);
      }
      return true;
    }
    // M pipelines: each of the smallest usable size plus a coin of
    // (size − smallest), the fewest coins (largest first on ties) summing
    // to N − M · smallest.
    const int64_t rest = static_cast<int64_t>(N_) - static_cast<int64_t>(M_) * smallest;
    if (rest >= 0) {
      const int R = static_cast<int>(rest);
      best_.assign(R + 1, -1);  // here the fewest coins
      from_.assign(R + 1, -1);
      best_[0] = 0;
      for (int y = 1; y <= R; ++y) {
        for (int i = 0; i < T; ++i) {
          const int coin = options_[i].t->nodes - smallest;
          if (caps_[i] == 0 || coin <= 0 || coin > y || best_[y - coin] < 0) continue;
          if (best_[y] < 0 || best_[y - coin] + 1 < best_[y]) {
            best_[y] = best_[y - coin] + 1;
            from_[y] = i;
          }
        }
      }
      if (best_[R] >= 0 && best_[R] <= M_) {
        if (multiset) {
          multiset->clear();
          for (int y = R; y != 0; y -= options_[from_[y]].t->nodes - smallest)
            multiset->push_back(options_[from_[y]].t->nodes);
          multiset->resize(M_, smallest);
          std::sort(multiset->begin(), multiset->end(), std::greater<int>());
        }
        return true;
      }
    }
    settled_ = false;
    return false;
  }

  const std::vector<Option>& options_;
  int N_, M_, need_;
  bool clipped_ = true;
  bool floor_binds_ = false;  // Regime
  bool settled_ = true;       // Spread decided
  std::vector<int> caps_;
  std::vector<int64_t> best_;
  std::vector<int64_t> from_;  // previous state · T + template index (Spread: the template index)
};

}  // namespace

int Instantiation::nodes_used() const {
  int n = 0;
  for (const PipelineInstance& pl : pipelines) n += pl.template_nodes;
  return n;
}

double PipelineSeconds(const Problem& p, const Template& t, int m) {
  return t.Seconds(m) + StepTailSeconds(p, t);
}

PipelineTimes TimePipelines(const Problem& p, const TemplateSet& ts, const Instantiation& inst) {
  if (p.cluster.local && p.cluster.contention.size() > 1) return SharedCoresTimes(p, ts, inst);
  PipelineTimes out;
  for (const PipelineInstance& pl : inst.pipelines) {
    const Template* t = ts.ForNodes(pl.template_nodes);
    out.seconds.push_back(t ? PipelineSeconds(p, *t, pl.microbatches) : 0.0);
    if (t)
      for (const StageShape& s : t->Virtual()) out.busy += pl.microbatches * StageComputeSeconds(p, s);
  }
  return out;
}

double SlowestPipelineSeconds(const Problem& p, const TemplateSet& ts, const Instantiation& inst) {
  double slowest = 0;
  for (double t : TimePipelines(p, ts, inst).seconds) slowest = std::max(slowest, t);
  return slowest;
}

Result<std::vector<int>> SplitBatch(const Problem& p, const TemplateSet& ts,
                                    const std::vector<int>& template_nodes) {
  const int P = static_cast<int>(template_nodes.size());
  const int M = p.microbatches;
  if (P == 0) return Status::Config("no pipelines to split the batch over");
  if (M < P)
    return Status::Config("a global batch of " + std::to_string(M) +
                          " micro-batches cannot feed " + std::to_string(P) +
                          " pipelines (each needs at least one)");
  std::vector<Option> options(P);
  for (int j = 0; j < P; ++j) {
    const Template* t = ts.ForNodes(template_nodes[j]);
    if (!t) return Status::Config("no template for " + std::to_string(template_nodes[j]) + " nodes");
    options[j] = {t, StepTailSeconds(p, *t)};
  }
  // Each next micro-batch goes where it would finish first (ties: lower index).
  std::vector<int> m(P, 1);
  using Entry = std::pair<double, int>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> next;
  for (int j = 0; j < P; ++j) next.push({options[j].Seconds(2), j});
  for (int left = M - P; left > 0; --left) {
    const int j = next.top().second;
    next.pop();
    ++m[j];
    next.push({options[j].Seconds(m[j] + 1), j});
  }
  return m;
}

Result<TensorParallelPlan> ChooseTensorParallelPlan(const Problem& p, FaultSweep* sweep) {
  Status last = Status::Config("no tensor-parallel degree divides the model");
  TensorParallelPlan best;
  for (int t : TensorParallelChoices(p)) {
    Problem q = p;
    q.tp = t;
    Result<TemplateSet> ts = sweep ? sweep->Templates(q) : BuildTemplates(q);
    if (!ts.ok()) {
      last = ts.status();
      continue;
    }
    Result<Instantiation> inst = sweep ? sweep->Instantiate(q, *ts) : Instantiate(q, *ts);
    if (!inst.ok()) {
      last = inst.status();
      continue;
    }
    if (best.tp == 0 || inst->iteration_seconds < best.inst.iteration_seconds) {
      best = {t, std::move(ts).value(), std::move(inst).value()};
    }
  }
  if (best.tp == 0) return last;
  return best;
}

Result<int> ChooseTensorParallel(const Problem& p) {
  OB_ASSIGN_OR_RETURN(TensorParallelPlan chosen, ChooseTensorParallelPlan(p));
  return chosen.tp;
}

Status Rebalance(const Problem& p, const TemplateSet& ts, Instantiation* inst) {
  std::vector<int> template_nodes;
  for (const PipelineInstance& pl : inst->pipelines) template_nodes.push_back(pl.template_nodes);
  OB_ASSIGN_OR_RETURN(std::vector<int> m, SplitBatch(p, ts, template_nodes));
  for (size_t j = 0; j < m.size(); ++j) inst->pipelines[j].microbatches = m[j];
  inst->iteration_seconds = SlowestPipelineSeconds(p, ts, *inst);
  return Status::Ok();
}

namespace {

// Pipelines of the given node counts, in that order, on nodes 0..N-1 in
// order, the batch split by SplitBatch.
Result<Instantiation> Number(const Problem& p, const TemplateSet& ts, const std::vector<int>& sizes) {
  OB_ASSIGN_OR_RETURN(std::vector<int> m, SplitBatch(p, ts, sizes));
  Instantiation inst;
  int next_node = 0;
  for (size_t j = 0; j < sizes.size(); ++j) {
    PipelineInstance pl;
    pl.template_nodes = sizes[j];
    for (int q = 0; q < sizes[j]; ++q) pl.nodes.push_back(next_node++);
    pl.microbatches = m[j];
    inst.pipelines.push_back(std::move(pl));
  }
  assert(next_node == p.cluster.nodes);
  inst.iteration_seconds = SlowestPipelineSeconds(p, ts, inst);
  return inst;
}

}  // namespace

bool InstantiationIgnoresFaults(const Problem& p, const TemplateSet& ts) {
  if (ts.templates.empty() || p.microbatches < p.MinPipelines()) return false;
  const Regime r = RegimeOf(p, SizesOf(ts.templates));
  return !r.clipped && !r.floor_binds;
}

Result<Instantiation> Instantiate(const Problem& p, const TemplateSet& ts) {
  const int N = p.cluster.nodes, M = p.microbatches, f = p.faults, least = p.MinPipelines();
  if (M < least)
    return Status::Config("a global batch of " + std::to_string(M) + " micro-batches cannot feed " +
                          std::to_string(least) + " pipelines (f=" + std::to_string(f) + p.ShardsText() + ")");
  if (ts.templates.empty()) return Status::Config("no pipeline templates to instantiate");
  // Largest templates first: DP ties then favour fewer, larger pipelines.
  std::vector<Option> options;
  for (auto it = ts.templates.rbegin(); it != ts.templates.rend(); ++it)
    options.push_back({&*it, StepTailSeconds(p, *it)});
  Knapsack dp(p, options);

  // The optimum is some T(m) of some template: bisect on tau until few such
  // candidates remain in (lo, hi], then binary-search those exactly.
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  for (const Option& o : options) {
    lo = std::min(lo, o.Seconds(1));
    hi = std::max(hi, o.Seconds(M));
  }
  lo = std::nextafter(lo, 0.0);  // every capacity is 0 here: infeasible
  if (!dp.Feasible(hi))
    return Status::Config("no combination of templates (" + std::to_string(ts.min_nodes) + ".." +
                          std::to_string(ts.max_nodes()) + " nodes) covers " + std::to_string(N) +
                          " nodes with at least " + std::to_string(least) + " pipelines and " +
                          std::to_string(M) + " micro-batches");
  auto candidates_between = [&](double a, double b) {
    int64_t count = 0;
    for (const Option& o : options) count += o.Capacity(b, M) - o.Capacity(a, M);
    return count;
  };
  constexpr int64_t kFewCandidates = 64;
  for (int step = 0; step < 200 && candidates_between(lo, hi) > kFewCandidates; ++step) {
    const double mid = lo + (hi - lo) / 2;
    if (!(mid > lo && mid < hi)) break;
    (dp.Feasible(mid) ? hi : lo) = mid;
  }
  std::vector<double> candidates;
  for (const Option& o : options)
    for (int m = o.Capacity(lo, M) + 1, last = o.Capacity(hi, M); m <= last; ++m)
      candidates.push_back(o.Seconds(m));
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  // hi is feasible, so the largest candidate ≤ hi is (same capacities).
  size_t a = 0, b = candidates.size() - 1;
  while (a < b) {
    const size_t mid = (a + b) / 2;
    if (dp.Feasible(candidates[mid])) b = mid; else a = mid + 1;
  }
  std::vector<int> multiset;
  const bool ok = dp.Feasible(candidates[a], &multiset);
  assert(ok);
  (void)ok;

  return Number(p, ts, multiset);
}

Result<Instantiation> InstantiateGiven(const Problem& p, const TemplateSet& ts,
                                       std::vector<int> pipeline_nodes) {
  const int N = p.cluster.nodes, f = p.faults;
  const int P = static_cast<int>(pipeline_nodes.size());
  int sum = 0;
  for (int n : pipeline_nodes) {
    if (!ts.ForNodes(n))
      return Status::Config("--pipelines: no template for " + std::to_string(n) + " nodes (with -f " +
                            std::to_string(f) + " the templates cover " + std::to_string(ts.min_nodes) +
                            ".." + std::to_string(ts.max_nodes()) + " nodes)");
    sum += n;
  }
  if (sum != N)
    return Status::Config("--pipelines: the pipelines hold " + std::to_string(sum) + " nodes, the cluster has " +
                          std::to_string(N));
  if (P < p.MinPipelines())
    return Status::Config("--pipelines: " + std::to_string(P) + " pipeline(s) cannot survive -f " +
                          std::to_string(f) + p.ShardsText() +
                          " (needs at least " + std::to_string(p.MinPipelines()) + ")");
  std::sort(pipeline_nodes.begin(), pipeline_nodes.end(), std::greater<int>());
  return Number(p, ts, pipeline_nodes);
}

}  // namespace ob::plan
