// ZB-V (after Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): two
// chunks a stage in a V (Placement::kVee: chunk 0 down the stages, chunk 1
// back up), the backward split into B and W, each stage ordered by
// greedy.h over the chain of 2S virtual stages. Virtual stage k holds at
// most 2S − k chunk-micro-batches before their B (1F1B's count over the
// chain) and as many before their W: stage s then holds 2S + 1 of them,
// each half a stage's layers, about 1F1B's first stage (S micro-batches)
// on every stage. The turn at the last stage and the way back cost no
// transfer on the turn, and the first forward's way down is half a
// stage's: the fill falls to about (S − 1)·F/2.
#include "ob/schedule/greedy.h"
#include "ob/schedule/schedule.h"

namespace ob::schedule {
namespace zb_v {  // named: a unity build puts the schedules in one file

detail::Limits Limits(const Chain& chain, int k) {
  const int left = chain.size() - k;
  return {left, left};
}

std::vector<Op> Order(const Chain& chain, int stage, int microbatches) {
  return detail::GreedyOrder("zb-v", &Limits, chain, stage, microbatches);
}

std::shared_ptr<const PipelineOrders> Orders(const Chain& chain, const std::vector<StageCosts>& costs,
                                             int microbatches) {
  return detail::GreedyOrders("zb-v", &Limits, chain, costs, microbatches);
}

}  // namespace zb_v

extern const Schedule kZbV{
    "zb-v",
    "zero bubble in a V: two chunks a stage, down and back up, the backward split; "
    "1F1B's first-stage memory on every stage, the fill halved again",
    true,
    &zb_v::Order,
    &zb_v::Orders,
    2,
    2,
    Placement::kVee,
};

}  // namespace ob::schedule
