// The template search (see templates.h): for each node count the best
// stage partition over the per-k tables (stage_table.cc), or a mixed one
// (mixed_templates.cc) where it is expected to finish sooner; the set of
// templates for consecutive node counts; and a template's figures.
#include "ob/plan/templates.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "ob/plan/templates_impl.h"

namespace ob::plan {
namespace detail {

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
    out->stage_held.push_back({S - i, 0});
    out->bottleneck = std::max(out->bottleneck, w);
    out->total += w;
    out->tp = std::max(out->tp, s.tp);
    double update = 0;
    for (int l = s.first; l <= s.last; ++l) {
      node_grad[static_cast<size_t>(out->NodeOf(i))] += p.layers[l].gradient_bytes;
      update += p.UpdateSeconds(p.layers[l]) / s.tp;
    }
    out->update_seconds = std::max(out->update_seconds, update);
  }
  out->node_gradient_bytes = *std::max_element(node_grad.begin(), node_grad.end());
}

}  // namespace detail

namespace {

using namespace detail;  // templates_impl.h

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

// The time a pipeline of `t` is expected to take per iteration: its
// schedule's m micro-batches (m real: the batch's share of its nodes) and
// its tail.
double Expected(const Problem& p, const Template& t, double m) {
  return t.total + (m - 1) * t.bottleneck - t.Saved(m) + StepTailSeconds(p, t);
}

// The micro-batches a pipeline of `nodes` nodes is expected to run: the
// batch's share of its nodes, M·nodes/N, at least 1; unbounded (the
// steady state alone decides) when the problem has no batch.
double ExpectedMicrobatches(const Problem& p, int nodes) {
  if (p.microbatches <= 0 || p.cluster.nodes <= 0) return kInf;
  return std::max(1.0, static_cast<double>(p.microbatches) * nodes / p.cluster.nodes);
}

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
    ChooseSchedule(p, &cand, m);
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
    if (auto r = BestMixed(p, *mixed, nodes, m, MixedOptions{})) {
      cand = std::move(r->t);
      ChooseSchedule(p, &*cand, m);
    }
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

}  // namespace

std::vector<StageShape> Template::ChunksOf(int i) const {
  if (chunks <= 1) return {stages[static_cast<size_t>(i)]};
  std::vector<StageShape> out;
  const schedule::Chain c = chain();
  for (int k = 0; k < chunks; ++k) out.push_back(slices[static_cast<size_t>(c.At(i, k))]);
  return out;
}

std::vector<std::pair<int, int>> Template::LayersOf(int i) const {
  std::vector<std::pair<int, int>> out;
  for (const StageShape& s : ChunksOf(i)) out.emplace_back(s.first, s.last);
  return out;
}

int Template::StageOf(int layer) const {
  if (chunks > 1) {
    if (slices.empty() || layer < slices.front().first || layer > slices.back().last) return -1;
    auto it = std::upper_bound(slices.begin(), slices.end(), layer,
                               [](int l, const StageShape& s) { return l < s.first; });
    return chain().StageOf(static_cast<int>(it - slices.begin()) - 1);
  }
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
  if (!p.cluster.local) {
    if (!replicas) return t.update_seconds;
    const double all_reduce = AllReduceSeconds(p, t.node_gradient_bytes);
    if (p.shards <= 1) return std::max(0.0, all_reduce - t.allreduce_hidden) + t.update_seconds;
    // Sharded (design/shard.md): the backward hides the reduce-scatter,
    // half a ring all-reduce's bytes; the all-gather after the update
    // goes on under the next step's forward, all but its first bucket.
    const uint64_t first = std::min<uint64_t>(t.node_gradient_bytes, kGradientBucketBytes);
    return std::max(0.0, all_reduce / 2 - t.allreduce_hidden) + AllReduceSeconds(p, first) / 2 + t.update_seconds;
  }
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

namespace {

// Each stages-per-node choice's table over all L layers, and its minimax.
struct WholeTables {
  std::vector<StageTable> tables;
  std::vector<std::vector<double>> minimax;
};

WholeTables WholeTablesOf(const Problem& p) {
  const int L = p.num_layers();
  WholeTables w;
  for (int k : StagesPerNodeChoices(p)) {
    if (k > L) continue;
    w.tables.push_back(MakeTable(p, k, L));
    w.minimax.push_back(MinimaxFromBack(w.tables.back()));
  }
  return w;
}

// n0: the fewest nodes a template fits on (0: none does).
int LeastNodesOf(const Problem& p, const WholeTables& w) {
  const int L = p.num_layers();
  auto has_template = [&](int n) {
    auto at = p.tp_at.find(n);
    const int want = at != p.tp_at.end() ? at->second : p.tp;
    for (size_t i = 0; i < w.tables.size(); ++i) {
      if (want > 0 && p.cluster.gpus_per_node / w.tables[i].k != want) continue;
      const int S = n * w.tables[i].k;
      if (S <= L && w.minimax[i][static_cast<size_t>(S) * (L + 1)] != kInf) return true;
    }
    return false;
  };
  for (int n = 1; n <= L; ++n)
    if (has_template(n)) return n;
  return 0;
}

}  // namespace

int LeastNodes(const Problem& p) { return p.num_layers() == 0 ? 0 : LeastNodesOf(p, WholeTablesOf(p)); }

Result<TemplateSet> BuildTemplatesForAnyFaults(const Problem& p) {
  const int L = p.num_layers();
  const int N = p.cluster.nodes;
  if (L == 0) return Status::Config("the model has no layers");
  WholeTables whole = WholeTablesOf(p);
  std::vector<StageTable>& tables = whole.tables;
  std::vector<std::vector<double>>& minimax = whole.minimax;
  const int n0 = LeastNodesOf(p, whole);
  if (n0 == 0) return NothingFits(p);
  TemplateSet set;
  set.min_nodes = n0;
  // Consecutive node counts only: stop at the first one without a template.
  for (int n = n0; n <= N; ++n) {
    std::optional<Template> t = BestFromTables(p, tables, minimax, n, &tables);
    if (!t) break;
    set.templates.push_back(std::move(*t));
  }
  return set;
}

Result<TemplateSet> CutTemplatesForFaults(const Problem& p, const TemplateSet& any) {
  // At least f + 1 pipelines (design/plan.md), f + 1 rows of S with the
  // optimizer state in S (design/shard.md).
  const int N = p.cluster.nodes, f = p.faults, n0 = any.min_nodes, least = p.MinPipelines();
  if (static_cast<int64_t>(N) < static_cast<int64_t>(n0) * least) {
    std::string msg = "needs at least " + std::to_string(n0 * least) + " nodes for f=" + std::to_string(f) +
                      p.ShardsText() +
                      ", n0=" + std::to_string(n0) + " (have " + std::to_string(N) + ")";
    const int allowed = N / least;
    if (allowed >= 1) {
      if (const uint64_t need = LeastMemoryFor(p, allowed); need > 0)
        msg += "; with " + GiBText(need) + " per GPU n0 would be at most " + std::to_string(allowed);
    }
    return Status::Config(msg);
  }
  TemplateSet set;
  set.min_nodes = n0;
  for (const Template& t : any.templates) {
    if (t.nodes > N - (least - 1) * n0) break;
    set.templates.push_back(t);
  }
  return set;
}

Result<TemplateSet> BuildTemplates(const Problem& p) {
  OB_ASSIGN_OR_RETURN(TemplateSet any, BuildTemplatesForAnyFaults(p));
  return CutTemplatesForFaults(p, any);
}

std::vector<int> TensorParallelChoices(const Problem& p) {
  std::vector<int> ts;
  for (int k : StagesPerNodeChoices(p)) ts.push_back(p.cluster.gpus_per_node / k);
  std::sort(ts.begin(), ts.end());
  return ts;
}

}  // namespace ob::plan
