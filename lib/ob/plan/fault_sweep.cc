#include "ob/plan/fault_sweep.h"

namespace ob::plan {

Result<TemplateSet> FaultSweep::Templates(const Problem& p) {
  auto it = any_.find(p.tp);
  if (it == any_.end()) it = any_.emplace(p.tp, BuildTemplatesForAnyFaults(p)).first;
  if (!it->second.ok()) return it->second.status();
  return CutTemplatesForFaults(p, *it->second);
}

Result<Instantiation> FaultSweep::Instantiate(const Problem& p, const TemplateSet& ts) {
  if (!InstantiationIgnoresFaults(p, ts)) return plan::Instantiate(p, ts);
  const std::pair<int, size_t> key{p.tp, ts.templates.size()};
  if (auto it = kept_.find(key); it != kept_.end()) return it->second;
  Result<Instantiation> made = plan::Instantiate(p, ts);
  if (made.ok()) kept_.emplace(key, *made);
  return made;
}

}  // namespace ob::plan
