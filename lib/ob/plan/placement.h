// Bandwidth-aware placement (design/plan.md): which physical node takes which
// position of which pipeline, given a measured bandwidth matrix. Torch-free.
//
// Cost of a placement: each pipeline's stage times are recomputed with the
// real link between consecutive nodes (BoundarySeconds at that link's
// bandwidth and latency, in both directions: the activation src→dst, its
// gradient dst→src); boundaries between stages of one node keep the
// template's nominal figure. This gives each pipeline its own bottleneck and
// total. The data-parallel all-reduce of each layer runs as a ring over the
// nodes holding it, in pipeline order, at the ring's slowest directed link:
// 2·(P−1)/P·gradient bytes / slowest + 2·(P−1)·(largest latency on the ring);
// a node's all-reduce is the sum over the layers it holds (they share its
// link). Iteration = max over pipelines of Σw + (m − 1)·max w + the slowest
// all-reduce among its nodes. With one pipeline there is no all-reduce.
//
// Search: the best of the given order, greedy pipeline chains along fast
// links, and a greedy ring-first layout, each polished by pairwise descent
// (plans of ≤ 64 nodes); then simulated annealing for `moves` moves (swaps of
// two nodes, or of the node lists of two same-size pipelines; Metropolis
// acceptance, geometric cooling) and a final descent. Seeded, so the same
// inputs and seed give the same placement unless the wall-clock limit cuts
// the run short. Never worse than the given order under this cost.
// Speed: 20000 moves on 16 nodes take a few milliseconds.
#pragma once

#include <cstdint>
#include <vector>

#include "ob/plan/instantiation.h"
#include "ob/plan/problem.h"
#include "ob/plan/templates.h"
#include "ob/profile.pb.h"
#include "ob/status.h"

namespace ob::plan {

struct BandwidthMatrix {
  int nodes = 0;
  std::vector<double> bytes_per_s;   // [src * nodes + dst]; diagonal unused
  std::vector<double> latency;       // seconds, same layout
  double Bandwidth(int src, int dst) const { return bytes_per_s[src * nodes + dst]; }
  double Latency(int src, int dst) const { return latency[src * nodes + dst]; }
  // Over the off-diagonal entries (mean of the middle two when even); 0 for
  // fewer than two nodes.
  double MedianBandwidth() const;
  double MedianLatency() const;
};

// From ob-profile --net's matrix. kDataErr if it does not have exactly
// `nodes` hosts ("bandwidth matrix has 3 hosts, the cluster 16"), misses a
// link or has one twice, a link's host index is out of range, or a bandwidth
// is not positive or a latency negative (the messages name the pair, e.g.
// "h1 -> h0").
Result<BandwidthMatrix> MatrixFromProfile(const pb::NetworkMatrix& m, int nodes);

// Iteration time of `inst` on these links (see above). REQUIRES: every
// pipeline's template is in `ts` with as many nodes as the pipeline, and
// node ids are < bw.nodes.
double PlacedIterationSeconds(const Problem& p, const TemplateSet& ts, const Instantiation& inst,
                              const BandwidthMatrix& bw);

struct PlacementOptions {
  uint64_t seed = 1;
  long moves = 20000;            // annealing moves (deterministic budget)
  double time_limit_s = 5.0;     // wall-clock cap; stops early if reached
};

// `inst` with its pipelines' node lists re-assigned over the same node ids;
// templates, micro-batches and iteration_seconds (the instantiation's
// nominal figure) are kept: PlacedIterationSeconds gives the placed one.
// REQUIRES: as for PlacedIterationSeconds.
Instantiation Place(const Problem& p, const TemplateSet& ts, const Instantiation& inst,
                    const BandwidthMatrix& bw, const PlacementOptions& opts);

}  // namespace ob::plan
