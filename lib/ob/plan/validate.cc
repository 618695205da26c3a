// The checks of an instantiation (see recovery.h): Validate, and the
// memory check MemoryCheckText states for the master's events.log.
#include "ob/plan/recovery.h"

#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "ob/io/text.h"

namespace ob::plan {

std::string MemoryCheckText(const Problem& p, const TemplateSet& ts, const Instantiation& inst) {
  const bool mib = p.cluster.gpu_memory < (uint64_t{1} << 30);
  auto size = [&](uint64_t bytes) {
    return mib ? io::Format("%.1f MiB", static_cast<double>(bytes) / (1 << 20))
               : io::Format("%.1f GiB", static_cast<double>(bytes) / (1 << 30));
  };
  std::string out;
  std::set<int> seen;
  for (const PipelineInstance& pipe : inst.pipelines) {
    if (!seen.insert(pipe.template_nodes).second) continue;
    const Template* t = ts.ForNodes(pipe.template_nodes);
    if (t == nullptr) continue;  // Validate names it
    out += (out.empty() ? "template " : "; template ") + std::to_string(t->nodes) + ":";
    for (int i = 0; i < static_cast<int>(t->stages.size()); ++i) {
      const StageShape& s = t->stages[i];
      out += (i == 0 ? " " : ", ") + size(StageMemoryOf(p, *t, i, pipe.microbatches)) + " " +
             model::RecomputeName(s.recompute);
    }
  }
  const std::string why = Validate(p, ts, inst);
  return out + "; of " + size(p.cluster.gpu_memory) + ": " + (why.empty() ? "every stage fits" : why);
}

std::string Validate(const Problem& p, const TemplateSet& ts, const Instantiation& inst) {
  if (inst.pipelines.empty()) return "no pipelines";
  std::unordered_map<int, size_t> owner;
  std::unordered_set<int> checked;
  long long sum = 0;
  const int layers = p.num_layers();
  for (size_t j = 0; j < inst.pipelines.size(); ++j) {
    const auto& pipe = inst.pipelines[j];
    const std::string who = "pipeline " + std::to_string(j);
    const Template* t = ts.ForNodes(pipe.template_nodes);
    if (!t) return who + ": no template for " + std::to_string(pipe.template_nodes) + " nodes";
    if (static_cast<int>(pipe.nodes.size()) != pipe.template_nodes ||
        t->nodes != pipe.template_nodes)
      return who + " has " + std::to_string(pipe.nodes.size()) + " nodes, its template " +
             std::to_string(t->nodes);
    for (int node : pipe.nodes) {
      if (node < 0) return who + ": negative node id " + std::to_string(node);
      auto [it, fresh] = owner.emplace(node, j);
      if (!fresh)
        return "node " + std::to_string(node) + " is in pipelines " + std::to_string(it->second) +
               " and " + std::to_string(j);
    }
    if (pipe.microbatches < 1)
      return who + " has " + std::to_string(pipe.microbatches) + " micro-batches";
    sum += pipe.microbatches;
    if (!checked.insert(pipe.template_nodes).second) continue;
    // The template itself: k·n stages covering every layer once, each fitting.
    const int stages = static_cast<int>(t->stages.size());
    if (stages < t->nodes || (!t->mixed() && stages != t->nodes * t->stages_per_node) ||
        t->NodeOf(stages - 1) != t->nodes - 1)
      return who + ": template has " + std::to_string(stages) + " stages for " +
             std::to_string(t->nodes) + " nodes";
    // With chunks the slices cover the layers, slice k on its stage.
    const std::vector<StageShape>& cover = t->Virtual();
    if (t->chunks > 1 && static_cast<int>(cover.size()) != stages * t->chunks)
      return who + ": template has " + std::to_string(cover.size()) + " slices for " + std::to_string(stages) +
             " stages of " + std::to_string(t->chunks) + " chunks";
    int next = 0;
    for (size_t k = 0; k < cover.size(); ++k) {
      const StageShape& s = cover[k];
      if (s.first != next || s.last < s.first || s.last >= layers)
        return who + ": " + (t->chunks > 1 ? "slice " : "stage ") + std::to_string(k) + " does not start at layer " +
               std::to_string(next);
      next = s.last + 1;
    }
    for (int i = 0; i < stages; ++i) {
      const uint64_t bytes = StageMemoryOf(p, *t, i, pipe.microbatches);
      if (bytes > p.cluster.gpu_memory) {
        std::string layers_text;
        for (const auto& [first, last] : t->LayersOf(i))
          layers_text += (layers_text.empty() ? "" : ",") + std::to_string(first) + "-" + std::to_string(last);
        return who + ": stage " + std::to_string(i) + " (layers " + layers_text + ") needs " + std::to_string(bytes) +
               " bytes per GPU, more than " + std::to_string(p.cluster.gpu_memory);
      }
    }
    if (next != layers)
      return who + ": template covers layers 0-" + std::to_string(next - 1) + " of " +
             std::to_string(layers);
  }
  if (sum != p.microbatches)
    return "micro-batches sum to " + std::to_string(sum) + ", not M = " +
           std::to_string(p.microbatches);
  return "";
}

}  // namespace ob::plan
