// ZB-H2 (after Qi et al., ICLR 2024): as ZB-H1, but a stage may hold up to
// 2S − 1 micro-batches before their W (still at most S − i before their
// B), so that W can wait for the drain: with equal F, B and W a pipeline
// idles only the first forward's way down, (S − 1)·F, once m ≳ 2S. More
// memory than 1F1B: what W reads of up to 2S − 1 − (S − i) micro-batches.
#include "ob/schedule/greedy.h"
#include "ob/schedule/schedule.h"

namespace ob::schedule {
namespace zb_h2 {  // named: a unity build puts the schedules in one file

detail::Limits Limits(const Chain& chain, int stage) {
  const int stages = chain.stages;
  return {stages - stage, 2 * stages - 1};
}

std::vector<Op> Order(const Chain& chain, int stage, int microbatches) {
  return detail::GreedyOrder("zb-h2", &Limits, chain, stage, microbatches);
}

std::shared_ptr<const PipelineOrders> Orders(const Chain& chain, const std::vector<StageCosts>& costs,
                                             int microbatches) {
  return detail::GreedyOrders("zb-h2", &Limits, chain, costs, microbatches);
}

}  // namespace zb_h2

extern const Schedule kZbH2{
    "zb-h2",
    "zero bubble, more memory: as zb-h1 with up to 2S - 1 micro-batches before their W; "
    "idle only the first forward's way down",
    true,
    &zb_h2::Order,
    &zb_h2::Orders,
};

}  // namespace ob::schedule
