// Planning one cluster for several f (ob-plan -f auto, design/plan.md).
// Torch-free, pure.
//
// f enters a degree's templates only as the end of their range, N − f·n0
// (templates.h BuildTemplatesForAnyFaults), and an instantiation only as
// the floor f + 1 on the pipeline count. A FaultSweep builds each degree's
// templates once and cuts them to each f's range, and keeps an
// instantiation for the next f where f made no difference to it
// (InstantiationIgnoresFaults: the same templates, a floor no multiset of
// them could go below, and more pipelines possible than micro-batches).
// Its results equal BuildTemplates' and Instantiate's for the same
// problem; ChooseTensorParallelPlan(p, &sweep) uses them.
//
// REQUIRES: every problem given to one FaultSweep differs from the first
// only in faults and tp. Not thread-safe.
#pragma once

#include <map>
#include <utility>

#include "ob/plan/instantiation.h"
#include "ob/plan/templates.h"

namespace ob::plan {

class FaultSweep {
 public:
  Result<TemplateSet> Templates(const Problem& p);
  Result<Instantiation> Instantiate(const Problem& p, const TemplateSet& ts);

 private:
  std::map<int, Result<TemplateSet>> any_;                 // by tp
  std::map<std::pair<int, size_t>, Instantiation> kept_;  // by (tp, templates)
};

}  // namespace ob::plan
