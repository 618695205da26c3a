// Re-instantiation after losing (or gaining) nodes (design/recovery.md): a new
// instantiation from the stored templates, which layers each node must fetch
// and from which surviving node, and the new batch split. Torch-free, pure;
// must take milliseconds at 1,024 nodes.
//
// Policy: pipelines that lost no node are kept as they are (same nodes, same
// template). A damaged pipeline with n' ≥ n0 survivors is re-laid out on the
// template for n'. Survivor groups smaller than n0 are completed by borrowing
// nodes from the largest pipeline (if it keeps ≥ n0), merged with each other,
// or dissolved into other pipelines — whichever valid choice copies the
// fewest bytes (weights + optimizer state), ties broken by iteration time.
// Added nodes form new pipelines when there are ≥ n0 of them, or join the
// pipelines where they speed the iteration most, whichever is faster. When
// nodes are only added (failed ones come back), the layout Instantiate
// would choose for the nodes there are replaces that when it is more than
// 0.5% faster, keeping whole the pipelines of the sizes it has: repairs
// bring the run back to its plan. Nodes no valid choice can use stay idle (listed in
// Recovery::idle) rather than failing the recovery. Beyond f failures a layer
// may have no surviving replica: those layers are listed and no
// instantiation is returned.
//
// Details. A node holds the layers of every stage its template puts on it
// (stages i·k .. i·k + k − 1 at node position i). Undersized groups are
// merged in every way (up to 5 groups; beyond, three representative ways);
// each merged group of < n0 nodes picks, by (bytes, iteration time), among:
// completion with added nodes, borrowing from any pipeline that keeps ≥ n0
// (the largest is usually the fastest), joining one pipeline, or spreading
// over the smallest ones; whole outcomes are ranked by (nodes left idle,
// bytes copied, iteration time). Added and leftover nodes, when ≥ n0, form
// the number of new pipelines with the best iteration time (sizes differing
// by ≤ 1). Survivors keep their order within a pipeline; newcomers go last.
// Each missing layer is fetched from the holder in the fetching node's old
// pipeline if it survived (for an added node: the old pipeline its new one
// continues), else from the holder sending the fewest bytes so far.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ob/plan/instantiation.h"
#include "ob/plan/problem.h"
#include "ob/plan/templates.h"

namespace ob::plan {

struct LayerFetch {
  int node = 0;          // who needs the layer
  int layer = 0;         // global layer index
  int from_node = 0;     // a surviving node that holds it
  uint64_t bytes = 0;    // weights + optimizer state (Problem::layers[layer].state_bytes)
};

struct Recovery {
  bool ok = false;                   // false: lost_layers is non-empty, or < n0 nodes remain
  Instantiation next;                // valid when ok
  std::vector<LayerFetch> fetches;   // what each node must copy before the next step
  uint64_t bytes_copied = 0;
  std::vector<int> idle;             // nodes of the new node set that no pipeline uses; pass
                                     // them back as `added` to use them later
  std::vector<int> lost_layers;      // layers with no surviving replica (sorted)
  std::string reason;                // why not ok, one line
};

// `lost` and `added` are node ids; added ids must be new (≥ N or reused ids
// of nodes lost earlier). The node set after the change is
// (nodes of `current`) − lost + added; lost ids not in `current` and added
// ids already in it are ignored, and an id both lost and added counts as a
// fresh node holding nothing. Idle nodes of an earlier recovery are not in
// `current`: pass them in `added` to use them. Deterministic; fails (ok =
// false) only as stated above, when `current` is not an instantiation of
// `ts`, or when M is smaller than the pipelines that must be kept.
Recovery Reinstantiate(const Problem& p, const TemplateSet& ts, const Instantiation& current,
                       const std::vector<int>& lost, const std::vector<int>& added = {});

// Whether taking a slow (not failed) node out pays, for a straggler
// (design/watch.md): the re-instantiation without `node` (the nodes in `idle` may
// join it) against `current` with the pipeline that holds `node` running
// `slowdown` times slower (an upper bound on its cost when only that node's
// stage is slow). It pays when it is faster by more than 2% (a recovery
// costs a pause, and a marginal gain is within the measurement's noise) and
// still keeps f + 1 pipelines: a slow replica still survives failures, so
// speed is never bought with the plan's fault tolerance.
struct Exclusion {
  bool pays = false;
  double slowed_seconds = 0;    // iteration time of `current` with the slowdown
  double without_seconds = 0;   // iteration time without `node`; 0 when there is no recovery
  std::string reason;           // one line: the comparison, or why it cannot be done
};
Exclusion WeighExclusion(const Problem& p, const TemplateSet& ts, const Instantiation& current,
                         int node, double slowdown, const std::vector<int>& idle = {});

// Checks an instantiation: every pipeline's template exists and its node
// count matches, no node twice, ≥ 1 pipeline, micro-batches ≥ 1 each and
// summing to M, and every stage fits in memory. "" when valid, else why.
std::string Validate(const Problem& p, const TemplateSet& ts, const Instantiation& inst);

// The memory check of `inst` in one line, for the master's events.log at
// every generation: each template in use, its stages' predicted peaks and
// recomputation modes against the GPU's capacity, then "every stage fits"
// or Validate's reason, e.g. "template 2: 13.9 MiB none, 14.0 MiB none;
// template 1: 14.5 MiB full; of 16.4 MiB: every stage fits".
std::string MemoryCheckText(const Problem& p, const TemplateSet& ts, const Instantiation& inst);

}  // namespace ob::plan
