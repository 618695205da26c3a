// WeighExclusion (see recovery.h): whether taking a slow node out pays,
// against the re-instantiation without it.
#include "ob/plan/recovery.h"

#include <algorithm>
#include <string>

#include "ob/io/text.h"

namespace ob::plan {

Exclusion WeighExclusion(const Problem& p, const TemplateSet& ts, const Instantiation& current,
                         int node, double slowdown, const std::vector<int>& idle) {
  Exclusion x;
  const PipelineInstance* home = nullptr;
  for (const auto& pipe : current.pipelines) {
    const Template* t = ts.ForNodes(pipe.template_nodes);
    if (!t) {
      x.reason = "the instantiation has no template for " + std::to_string(pipe.template_nodes) +
                 " nodes";
      return x;
    }
    const bool holds = std::find(pipe.nodes.begin(), pipe.nodes.end(), node) != pipe.nodes.end();
    if (holds) home = &pipe;
    x.slowed_seconds = std::max(x.slowed_seconds, PipelineSeconds(p, *t, pipe.microbatches) *
                                                      (holds ? std::max(slowdown, 1.0) : 1.0));
  }
  if (!home) {
    x.reason = "node " + std::to_string(node) + " runs no pipeline";
    return x;
  }
  const Recovery r = Reinstantiate(p, ts, current, {node}, idle);
  if (!r.ok) {
    x.reason = "no instantiation without it (" + r.reason + ")";
    return x;
  }
  x.without_seconds = r.next.iteration_seconds;
  const int pipelines = static_cast<int>(r.next.pipelines.size());
  if (pipelines < p.MinPipelines()) {
    x.reason = "without it " + std::to_string(pipelines) + " pipeline" +
               (pipelines == 1 ? "" : "s") + " would remain, fewer than the " +
               std::to_string(p.MinPipelines()) + " that survive f = " + std::to_string(p.faults) +
               " failures";
    return x;
  }
  x.pays = x.without_seconds < x.slowed_seconds / 1.02;
  x.reason = "an iteration takes " + io::Format("%.3g s", x.slowed_seconds) + " at its slowdown " +
             io::Format("%.2fx", slowdown) + ", " + io::Format("%.3g s", x.without_seconds) + " without it on " +
             std::to_string(r.next.nodes_used()) + " nodes";
  return x;
}

}  // namespace ob::plan
