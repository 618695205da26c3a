// The orders of the schedules that split the backward (zb_h1.cc,
// zb_h2.cc): found by running the whole pipeline once at its own op costs
// (StageCosts: F, B and W a stage, the transfers between stages), each
// stage taking, whenever it is free, the first of these that it can: the
// B whose output gradient has arrived (the previous stage waits for it),
// the next F whose input has arrived while the stage holds fewer than
// Limits::activations micro-batches before their B and fewer than
// Limits::held before their W, else its oldest W. W thus fills what would
// be idle time, and the limits bound the memory. At unit costs (F = B = W,
// transfers free) the orders are those of the zero-bubble paper's
// hand-made schedules in shape; at a pipeline's own costs (W cheaper than
// F, say, or a slower stage) they keep the stages busy where unit-cost
// orders would not. The costs are taken in steps of 1/4096 of the largest
// (each op at least one step), so that equal plans give equal orders
// whatever the arithmetic, and any order holds for any costs: it only
// fixes what runs after what. Where the order made at unit costs is
// faster at the pipeline's own costs (list scheduling has such
// anomalies), or the other's stage programs could deadlock on rendezvous
// channels (program.h), the unit-cost one is kept; and beyond 1,024
// stage-micro-batches (S × m) orders are made at unit costs, so that
// planning hundreds of long templates stays fast (their shapes share the
// cache). Internal to lib/ob/schedule; thread-safe (a
// cache under a lock).
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "ob/schedule/schedule.h"

namespace ob::schedule::detail {

// Per virtual stage (schedule.h, Chain; the stage itself with one chunk).
struct Limits {
  int activations = 1;  // micro-batches after their F and before their B
  int held = 1;         // micro-batches after their F and before their W
};
using LimitsOf = Limits (*)(const Chain& chain, int virtual_stage);

// Stage `stage`'s order at unit costs; `key` names the schedule for the
// cache. REQUIRES: 0 <= stage < chain.stages; every limit >= 1.
std::vector<Op> GreedyOrder(std::string_view key, LimitsOf limits, const Chain& chain, int stage, int microbatches,
                            bool split = true);
// Every stage's, made for `costs` (one per virtual stage), shared from
// the cache.
std::shared_ptr<const PipelineOrders> GreedyOrders(std::string_view key, LimitsOf limits, const Chain& chain,
                                                   const std::vector<StageCosts>& costs, int microbatches,
                                                   bool split = true);

}  // namespace ob::schedule::detail
