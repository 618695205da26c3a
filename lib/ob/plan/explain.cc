#include "ob/plan/explain.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <map>

#include "ob/plan/problem.h"

namespace ob::plan {
namespace {

std::string Fmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string Fmt(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

double GiB(uint64_t b) { return static_cast<double>(b) / (1ull << 30); }

// "0-3 4-12 13" : the layer ranges of a template's stages.
std::string Ranges(const pb::PipelineTemplate& t, size_t max_chars) {
  std::string out;
  for (const auto& s : t.stages()) {
    std::string r = s.first_layer() == s.last_layer()
                        ? std::to_string(s.first_layer())
                        : std::to_string(s.first_layer()) + "-" + std::to_string(s.last_layer());
    if (out.size() + r.size() + 1 > max_chars) return out + " ...";
    out += (out.empty() ? "" : " ") + r;
  }
  return out;
}

uint64_t PeakMemory(const pb::PipelineTemplate& t) {
  uint64_t m = 0;
  for (const auto& s : t.stages()) m = std::max(m, s.memory_bytes());
  return m;
}

}  // namespace

std::string ExplainPlan(const pb::Plan& plan) {
  const auto& m = plan.model();
  const auto& in = plan.instantiation();
  std::string out;
  out += Fmt("# ob plan: %s (%u blocks, hidden %u) on %u nodes x %u GPUs of %.1f GiB\n",
             m.name().c_str(), m.n_layer(), m.n_embd(), plan.nodes(), plan.gpus_per_node(),
             GiB(plan.gpu_memory_bytes()));
  out += Fmt("# global batch %u sequences = %u micro-batches of %u, sequence %u; f = %u\n",
             plan.global_batch(), plan.microbatches(), plan.microbatch(), plan.sequence_length(),
             plan.faults());
  out += Fmt("# n0 = %u nodes; templates for %u..%u nodes\n", plan.min_nodes(), plan.min_nodes(),
             plan.min_nodes() + plan.templates_size() - 1);

  std::map<uint32_t, int> used;  // template nodes -> pipelines
  for (const auto& p : in.pipelines()) used[p.template_nodes()]++;

  out += "#\n# templates\n";
  out += Fmt("# %5s %6s %3s %3s %10s %10s %9s %9s  %s\n", "nodes", "stages", "k", "tp",
             "bottleneck", "fill+drain", "mem peak", "capacity", "layers per stage");
  out += Fmt("# %5s %6s %3s %3s %10s %10s %9s %9s\n", "", "", "", "", "(ms)", "(ms)", "(GiB)",
             "(GiB)");
  for (const auto& t : plan.templates()) {
    out += Fmt("  %5u %6d %3u %3u %10.3f %10.3f %9.2f %9.2f  %s%s\n", t.nodes(), t.stages_size(),
               t.stages_per_node(), t.tensor_parallel(), t.bottleneck_seconds() * 1e3,
               t.total_seconds() * 1e3, GiB(PeakMemory(t)), GiB(plan.gpu_memory_bytes()),
               Ranges(t, 48).c_str(), used.count(t.nodes()) ? "  *" : "");
  }

  out += "#\n# stages of the templates in use\n";
  out += Fmt("# %5s %5s %4s %8s %3s %10s %10s %9s %9s %6s\n", "tmpl", "stage", "node", "layers",
             "tp", "compute", "with xfer", "memory", "capacity", "flight");
  out += Fmt("# %5s %5s %4s %8s %3s %10s %10s %9s %9s %6s\n", "", "", "", "", "", "(ms)", "(ms)",
             "(GiB)", "(GiB)", "");
  for (const auto& t : plan.templates()) {
    if (!used.count(t.nodes())) continue;
    for (int i = 0; i < t.stages_size(); ++i) {
      const auto& s = t.stages(i);
      std::string layers = std::to_string(s.first_layer()) + "-" + std::to_string(s.last_layer());
      out += Fmt("  %5u %5d %4u %8s %3u %10.3f %10.3f %9.2f %9.2f %6u\n", t.nodes(), i, s.node(),
                 layers.c_str(), s.tensor_parallel(), s.compute_seconds() * 1e3, s.seconds() * 1e3,
                 GiB(s.memory_bytes()), GiB(s.memory_capacity_bytes()), s.in_flight());
    }
  }

  out += "#\n# instantiation\n";
  out += Fmt("# %8s %5s %13s %10s  %s\n", "pipeline", "nodes", "micro-batches", "time", "hosts");
  out += Fmt("# %8s %5s %13s %10s\n", "", "", "", "(s)");
  for (int i = 0; i < in.pipelines_size(); ++i) {
    const auto& p = in.pipelines(i);
    std::string hosts;
    for (const auto& h : p.nodes()) {
      if (hosts.size() > 60) {
        hosts += " ...";
        break;
      }
      hosts += (hosts.empty() ? "" : " ") + h;
    }
    out += Fmt("  %8d %5u %13u %10.4f  %s\n", i, p.template_nodes(), p.microbatches(), p.seconds(),
               hosts.c_str());
  }
  out += Fmt("# predicted iteration %.4f s, %.0f tokens/s, bubble (idle) fraction %.3f\n",
             in.iteration_seconds(), in.tokens_per_second(), in.bubble_fraction());
  // What the busiest worker of the templates in use is predicted to hold:
  // its stage, and on the CPU, whose memory is the host's, also its host
  // snapshots (as --host-memory counts them).
  const bool cpu = plan.profile().device().kind() == "cpu";
  uint64_t peak = 0;
  for (const auto& p : in.pipelines()) {
    for (const auto& t : plan.templates()) {
      if (t.nodes() != p.template_nodes()) continue;
      for (const auto& s : t.stages()) {
        uint64_t params = 0;
        for (uint32_t l = s.first_layer(); cpu && l <= s.last_layer() && l < static_cast<uint32_t>(plan.profile().layers_size()); ++l)
          params += plan.profile().layers(static_cast<int>(l)).parameter_count();
        peak = std::max(peak, s.memory_bytes() + kSnapshotBytesPerParameter * params / std::max(1u, s.tensor_parallel()));
      }
    }
  }
  out += Fmt("# predicted peak memory per worker %.1f MiB%s\n", static_cast<double>(peak) / (1 << 20),
             cpu ? " (its stage and its host snapshots)" : "");
  if (in.placed_iteration_seconds() > 0)
    out += Fmt("# on the measured links: %.4f s placed vs %.4f s in hosts-file order (%.1f%% better)\n",
               in.placed_iteration_seconds(), in.identity_iteration_seconds(),
               100.0 * (1.0 - in.placed_iteration_seconds() / in.identity_iteration_seconds()));
  out += Fmt("# survives any %u node failures: %d pipelines (>= f+1 = %u), each holding every layer;\n"
             "# the survivors re-instantiate from the templates above\n",
             plan.faults(), in.pipelines_size(), plan.faults() + 1);
  return out;
}

}  // namespace ob::plan
