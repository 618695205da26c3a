// The orders of the schedules that split the backward (zb_h1.cc,
// zb_h2.cc): found by running the whole pipeline once at unit op costs
// (F = B = W = 1, transfers free), each stage taking, whenever it is free,
// the first of these that it can: the B whose output gradient has arrived
// (the previous stage waits for it), the next F whose input has arrived
// while the stage holds fewer than Limits::activations micro-batches
// before their B and fewer than Limits::held before their W, else its
// oldest W. W thus fills what would be idle time, and the limits bound
// the memory. The orders are those of the zero-bubble paper's
// hand-made schedules in shape (unit costs are its own assumption), and
// they hold for any costs: the order only fixes what runs after what.
// Internal to lib/ob/schedule; thread-safe (a cache under a lock).
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "ob/schedule/schedule.h"

namespace ob::schedule::detail {

struct Limits {
  int activations = 1;  // micro-batches after their F and before their B
  int held = 1;         // micro-batches after their F and before their W
};
using LimitsOf = Limits (*)(int stage, int stages);

// Stage `stage`'s order; `key` names the schedule for the cache.
// REQUIRES: 0 <= stage < stages; every limit >= 1.
std::vector<Op> GreedyOrder(std::string_view key, LimitsOf limits, int stage, int stages, int microbatches);
// Every stage's, shared from the cache.
std::shared_ptr<const std::vector<std::vector<Op>>> GreedyOrders(std::string_view key, LimitsOf limits, int stages,
                                                                 int microbatches);

}  // namespace ob::schedule::detail
