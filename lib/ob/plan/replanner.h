// The search behind Reinstantiate (recovery.h): candidate layouts of the
// next instantiation and what they cost against what the survivors hold.
// Replanner's policy is the header's ("Policy", "Details"). Internal to
// lib/ob/plan (recovery.cc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <unordered_map>
#include <vector>

#include "ob/plan/problem.h"
#include "ob/plan/templates.h"

namespace ob::plan::detail {

inline constexpr double kNoTime = std::numeric_limits<double>::infinity();
// A fresh layout replaces a kept one when nodes come back only if it is at
// least this much faster (it may move many layers).
inline constexpr double kFreshGain = 0.005;
// New pipelines from a pool of added nodes: how many pipeline counts to try.
inline constexpr int kMaxSplitsTried = 64;

// Layers [first, last] a node holds; empty when last < first.
struct Span {
  int first = 0, last = -1;
};

// The layers the node at position `pos` of a pipeline of `t` holds:
// ascending ranges, adjacent ones merged (one range without chunks).
inline std::vector<Span> NodeSpans(const Template& t, int pos) {
  if (t.chunks <= 1) return {{t.stages[t.FirstStageOn(pos)].first, t.stages[t.LastStageOn(pos)].last}};
  std::vector<Span> out;
  for (int i = t.FirstStageOn(pos); i <= t.LastStageOn(pos); ++i)
    for (const auto& [first, last] : t.LayersOf(i)) out.push_back({first, last});
  std::sort(out.begin(), out.end(), [](const Span& a, const Span& b) { return a.first < b.first; });
  std::vector<Span> merged;
  for (const Span& s : out) {
    if (!merged.empty() && merged.back().last + 1 == s.first) merged.back().last = s.last;
    else merged.push_back(s);
  }
  return merged;
}
inline bool Holds(const std::vector<Span>& spans, int layer) {
  for (const Span& s : spans)
    if (s.first <= layer && layer <= s.last) return true;
  return false;
}

// What a surviving node held in `current`.
struct Held {
  int pipeline = -1;
  std::vector<Span> spans;
};

// A read-only run of node ids.
struct Slice {
  const int* data = nullptr;
  int size = 0;
};
inline Slice Of(const std::vector<int>& v, int from, int to) { return {v.data() + from, to - from}; }
inline Slice Of(const std::vector<int>& v) { return Of(v, 0, static_cast<int>(v.size())); }

struct Pipe {
  int template_nodes = 0;
  std::vector<int> nodes;
  int origin = std::numeric_limits<int>::max();  // old pipeline it continues (new: last)
  uint64_t bytes = 0;  // what its nodes must fetch
};

// One candidate next instantiation under construction.
struct Layout {
  std::vector<Pipe> pipes;
  std::vector<int> spare;  // surviving nodes waiting for a pipeline
  std::vector<int> added;  // added nodes not used yet
  std::vector<int> idle;   // set by FinishPool
  uint64_t bytes = 0;      // Σ pipes[].bytes
};

struct Group {
  std::vector<int> nodes;
  int origin = 0;
};

// The search: costs of candidate layouts against what survivors hold.
class Replanner {
 public:
  Replanner(const Problem& p, const TemplateSet& ts, std::unordered_map<int, Held> held);

  const std::unordered_map<int, Held>& held() const { return held_; }

  // `l`'s nodes (its pipelines' and its idle ones) laid out as Instantiate
  // would lay them out afresh, when that is more than kFreshGain faster:
  // pipelines of a size the fresh instantiation has are kept whole, the
  // other nodes, in their pipelines' order, form the rest. False (and `l`
  // untouched) otherwise.
  bool Refresh(Layout& l);

  // Bytes a pipeline of template n over nodes a ++ b must fetch.
  uint64_t Cost(int n, Slice a, Slice b = {}) const;
  // Bytes `node` lacks of the layers `want`.
  uint64_t Missing(int node, const std::vector<Span>& want) const;

  // Iteration time of pipelines of these sizes after the batch split.
  double Time(std::vector<int> sizes);
  double Time(const Layout& l) { return Time(Sizes(l)); }
  static std::vector<int> Sizes(const Layout& l);

  // The largest n ≤ c with a template, 0 if none.
  int LargestTemplateAtMost(int c) const;
  bool Has(int n) const { return n >= n0_ && ts_.ForNodes(n) != nullptr; }

  // A pipeline of `nodes` (on the template for their count) added to `l`.
  void AddPipe(Layout& l, std::vector<int> nodes, int origin) const;
  // Re-lays pipe j on the template for its (changed) node count.
  void Relay(Layout& l, int j) const;

  // Finds a home for a cluster of survivor groups (see the header's policy).
  void Place(Layout& l, const Group& cluster);

  // Appends each node of `pool` to the pipeline whose growth by one node
  // gives the least iteration time (ties: the smallest pipeline, then the
  // first), among those with a template one node larger; what no pipeline
  // can take stays in `pool`. (Always the smallest, as it once was, left a
  // node that came back in a 16-node pipeline while the 23-node one it had
  // left stayed short: the layout drifted from the plan, ob-sim showed.)
  void Grow(Layout& l, std::vector<int>& pool);

  // Spare survivors and unused added nodes: new pipelines when there are ≥ n0
  // (the pipeline count with the best iteration time), or grown into the
  // pipelines there are, whichever leaves fewer nodes idle and then runs
  // faster; else borrow to form one; the rest stay idle.
  void FinishPool(Layout& l);

  // FinishPool's two ways: new pipelines first (when allowed), then grow.
  void PlacePool(Layout& l, std::vector<int> pool, bool new_pipelines);

 private:
  // Place's ways to home an undersized cluster: the pipeline each touches
  // (-1: none) and the bytes it adds to the layout's fetches.
  enum PlaceKind { kComplete, kBorrow, kJoin, kSpread };
  struct PlaceOption {
    PlaceKind kind;
    int pipe;
    int64_t delta;
  };
  // Every way open to `cluster` in `l`; kSpread's layout in *spread.
  std::vector<PlaceOption> PlaceOptions(const Layout& l, const Group& cluster, Layout* spread);
  // Of the options that copy the fewest bytes, the fastest (the first of equals).
  const PlaceOption& Fastest(const Layout& l, const Group& cluster, const std::vector<PlaceOption>& options,
                             const Layout& spread);
  void Apply(Layout& l, const Group& cluster, const PlaceOption& how, Layout& spread) const;

  uint64_t SpanBytes(Span s) const {
    return s.last < s.first ? 0 : prefix_[s.last + 1] - prefix_[s.first];
  }

  const Problem& p_;
  const TemplateSet& ts_;
  const int n0_;
  std::unordered_map<int, Held> held_;
  std::vector<uint64_t> prefix_;
  std::map<std::vector<int>, double> times_;  // iteration time by sorted sizes
};

}  // namespace ob::plan::detail
