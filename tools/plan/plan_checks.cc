// ob-plan's checks and choices outside the planner proper (plan_checks.h).
#include "plan_checks.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "ob/plan/problem.h"
#include "ob/plan/templates.h"

namespace ob::plan_tool {

// Host memory per node: the workers' snapshots (design §4.6) hold, for every
// stage on the node, 3 copies (the last two steps and one a checkpoint may
// hold) of 12 bytes per parameter (the fp32 weight and both AdamW moments),
// whatever the training precision. Checked for every template, since any
// may be instantiated after failures.
Status CheckHostMemory(const pb::Profile& profile, const plan::TemplateSet& ts, double host_memory_gib) {
  const uint64_t have = static_cast<uint64_t>(host_memory_gib * (1ull << 30));
  for (const auto& t : ts.templates) {
    for (int q = 0; q < t.nodes; ++q) {
      uint64_t params = 0;
      for (int i = t.FirstStageOn(q); i <= t.LastStageOn(q); ++i) {
        for (int l = t.stages[i].first; l <= t.stages[i].last; ++l) {
          params += profile.layers(l).parameter_count();
        }
      }
      const uint64_t need = plan::kSnapshotBytesPerParameter * params;
      if (need > have) {
        char line[256];
        std::snprintf(line, sizeof line,
                      "--host-memory %.1f GiB: a node of the %d-node template holds stages with "
                      "%.0f M parameters, whose snapshots need %.1f GiB of host memory "
                      "(36 bytes per parameter)",
                      host_memory_gib, t.nodes, params / 1e6,
                      static_cast<double>(need) / (1ull << 30));
        return Status::Config(line);
      }
    }
  }
  return Status::Ok();
}

// --shard-optimizer (design/shard.md): off 1; a count, that count; on the
// S of 2, 4 and 8 whose templates fit on the fewest nodes (n0), the
// smallest on a tie; auto the same with 1 first, so that the state is
// sharded only where a pipeline gets shorter. From n0 alone, never from f:
// -f auto's plans of every f share it (FaultSweep).
Result<int> ChooseShards(plan::Problem p, const std::string& mode) {
  if (mode == "off") return 1;
  if (mode != "auto" && mode != "on") {
    int count = 0;
    try {
      size_t used = 0;
      count = std::stoi(mode, &used);
      if (used != mode.size()) throw std::invalid_argument(mode);
    } catch (const std::exception&) {
      count = 0;
    }
    if (count < 1 || count > 64) return Status::Usage("--shard-optimizer " + mode + ": not auto, on, off or a count from 1 to 64");
    return count;
  }
  int best = 0, best_n0 = 0;
  for (int s : {1, 2, 4, 8}) {
    if (s == 1 && mode == "on") continue;
    p.shards = s;
    const int n0 = plan::LeastNodes(p);
    if (n0 > 0 && (best == 0 || n0 < best_n0)) best = s, best_n0 = n0;
  }
  return std::max(1, best);  // none fits: BuildTemplates says why, unsharded
}

}  // namespace ob::plan_tool
