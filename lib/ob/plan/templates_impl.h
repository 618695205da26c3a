// The private parts of the template search (templates.h) that its .cc
// files share: stage_table.cc's per-k tables of stage costs and the
// dynamic programmes over them, mixed_templates.cc's search over stages of
// mixed degrees, template_memory.cc's diagnosis of what does not fit, and
// the figures templates.cc computes for any template. Nothing outside
// lib/ob/plan includes it.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "ob/plan/templates.h"

namespace ob::plan::detail {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

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

// The table for k stages per node, holding up to max_stages micro-batches
// in flight.
StageTable MakeTable(const Problem& p, int k, int max_stages);

// F[r][j]: the smallest possible max w over partitions of layers [j, L) into r
// stages where the stage i-th from the end holds i micro-batches in flight.
// Because in-flight counts depend only on the position from the end, one
// table serves every S: B*(S) = F[S][0].
std::vector<double> MinimaxFromBack(const StageTable& t);

// Among partitions into S stages whose every w ≤ bound (and that fit), the
// one with the smallest Σw; the last layer of each stage, or empty if none.
// Ties go to the shortest first stage (strict improvement only).
std::vector<int> MinSumUnderBound(const StageTable& t, int S, double bound);

// The k that divide g and leave a tensor-parallel degree t = g/k the model
// can be split by (t divides the heads and the MLP width: the runtime's
// rule, runtime/topology.h CheckRunnable); k = g (t = 1) always.
std::vector<int> StagesPerNodeChoices(const Problem& p);

// A template's figures from its nodes, stages_per_node and stages (each
// stage's node set when mixed): each stage's w — compute plus the
// boundary, over the network where the next stage is on another node, the
// same sum the tables hold — and memory with its 1F1B in-flight count, the
// bottleneck and Σw, the largest degree, the slowest stage's update and
// the busiest node's gradient.
void SetFigures(const Problem& p, Template* out);

// SearchMixed over the degrees of `tables` (whose max_stages covers every
// stage count of `nodes` nodes), for m micro-batches (mixed_templates.cc).
std::optional<MixedResult> BestMixed(const Problem& p, const std::vector<StageTable>& tables, int nodes, double m,
                                     const MixedOptions& o);

// The least GPU memory with which some node count n ≤ max_nodes has a
// partition that fits (0: none); a size in GiB (MiB under 0.1 GiB), rounded
// up; and why no node count works (template_memory.cc).
uint64_t LeastMemoryFor(const Problem& p, int max_nodes);
std::string GiBText(uint64_t bytes);
Status NothingFits(const Problem& p);

// `t` (one chunk, its stages cut for 1F1B) cut again for schedule `s`
// with v chunks a stage (chunks.cc): the layers in S·v slices of about
// equal compute, each stage's in one recomputation mode (the first of
// p.recompute_modes in which every stage fits at its order's peak over
// m_memory micro-batches), its figures and op costs per slice, and what
// its orders save on Σw + (m − 1)·max w at 1 and m micro-batches (as
// ChooseSchedule sets them). nullopt when no mode fits, for one stage, a
// mixed template, or more slices than layers.
std::optional<Template> ChunkedTemplate(const Problem& p, const Template& t, const schedule::Schedule& s, int v,
                                        int m, int m_memory);

}  // namespace ob::plan::detail
