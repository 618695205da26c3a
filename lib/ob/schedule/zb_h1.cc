// ZB-H1 (after Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024):
// the backward split into B and W (schedule.h), each stage ordered by
// greedy.h with at most S − i micro-batches before their B, as 1F1B holds,
// and at most S before their W: no stage holds more micro-batches than
// 1F1B's first stage does, and those past their B only what W reads. W
// fills the fill-and-drain waits: with equal F, B and W the idle time
// falls from 1F1B's (S − 1)·3 to about (S − 1)·1.5 at m = 2S, the paper's
// "about a third" for its own placement of W.
#include "ob/schedule/greedy.h"
#include "ob/schedule/schedule.h"

namespace ob::schedule {
namespace zb_h1 {  // named: a unity build puts the schedules in one file

detail::Limits Limits(const Chain& chain, int stage) {
  const int stages = chain.stages;
  return {stages - stage, stages};
}

std::vector<Op> Order(const Chain& chain, int stage, int microbatches) {
  return detail::GreedyOrder("zb-h1", &Limits, chain, stage, microbatches);
}

std::shared_ptr<const PipelineOrders> Orders(const Chain& chain, const std::vector<StageCosts>& costs,
                                             int microbatches) {
  return detail::GreedyOrders("zb-h1", &Limits, chain, costs, microbatches);
}

}  // namespace zb_h1

extern const Schedule kZbH1{
    "zb-h1",
    "zero bubble, 1F1B's memory: the backward split, weight gradients fill the waits; "
    "a stage holds at most S micro-batches, those past B only what W reads",
    true,
    &zb_h1::Order,
    &zb_h1::Orders,
};

}  // namespace ob::schedule
