#include "ob/plan/explain.h"

#include <algorithm>
#include <map>

#include "ob/io/text.h"
#include "ob/plan/problem.h"
#include "ob/schedule/schedule.h"
#include "ob/watch/stats.h"

namespace ob::plan {
namespace {

using io::Format;

double GiB(uint64_t b) { return static_cast<double>(b) / (1ull << 30); }

// Stage i's layer ranges: its own, or with chunks its slices' (in chunk
// order).
std::vector<std::pair<uint32_t, uint32_t>> StageLayers(const pb::PipelineTemplate& t, int i) {
  const auto& st = t.stages(i);
  const schedule::Schedule* sch = schedule::Find(t.schedule());
  if (t.chunks() <= 1 || sch == nullptr || t.slices_size() != t.stages_size() * static_cast<int>(t.chunks()))
    return {{st.first_layer(), st.last_layer()}};
  const schedule::Chain chain = sch->ChainOf(t.stages_size(), static_cast<int>(t.chunks()));
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (int c = 0; c < static_cast<int>(t.chunks()); ++c) {
    const auto& sl = t.slices(chain.At(i, c));
    out.emplace_back(sl.first_layer(), sl.last_layer());
  }
  return out;
}

// "0-3" or, with chunks, "0-3+16-19".
std::string LayersText(const pb::PipelineTemplate& t, int i) {
  std::string r;
  for (const auto& [first, last] : StageLayers(t, i)) {
    if (!r.empty()) r += "+";
    r += first == last ? std::to_string(first) : std::to_string(first) + "-" + std::to_string(last);
  }
  return r;
}

// The template's schedule as --explain shows it: "1f1b", "zb-h1", and with
// a choice of chunks their count, "interleaved/4".
std::string ScheduleText(const pb::PipelineTemplate& t) {
  if (t.schedule().empty()) return "1f1b";
  const schedule::Schedule* sch = schedule::Find(t.schedule());
  if (t.chunks() > 1 && sch != nullptr && sch->min_chunks != sch->max_chunks)
    return t.schedule() + "/" + std::to_string(t.chunks());
  return t.schedule();
}

// "0-3 4-12 13" : the layer ranges of a template's stages.
std::string Ranges(const pb::PipelineTemplate& t, size_t max_chars) {
  std::string out;
  for (int i = 0; i < t.stages_size(); ++i) {
    const auto& s = t.stages(i);
    std::string r = LayersText(t, i);
    if (t.stages_per_node() == 0) r += "/" + std::to_string(s.tensor_parallel());  // mixed degrees
    if (out.size() + r.size() + 1 > max_chars) return out + " ...";
    out += (out.empty() ? "" : " ") + r;
  }
  return out;
}

// What a worker of stage i is predicted to hold: its stage, and on the
// CPU, whose memory is the host's, also its host snapshots (as
// --host-memory counts them).
uint64_t WorkerMemory(const pb::Plan& plan, const pb::PipelineTemplate& t, int i) {
  const auto& s = t.stages(i);
  if (plan.profile().device().kind() != "cpu") return s.memory_bytes();
  uint64_t params = 0;
  for (const auto& [first, last] : StageLayers(t, i))
    for (uint32_t l = first; l <= last && l < static_cast<uint32_t>(plan.profile().layers_size()); ++l)
      params += plan.profile().layers(static_cast<int>(l)).parameter_count();
  return s.memory_bytes() + kSnapshotBytesPerParameter * params / std::max(1u, s.tensor_parallel());
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
  out += Format("# ob plan: %s (%u blocks, hidden %u) on %u nodes x %u GPUs of %.1f GiB\n",
                m.name().c_str(), m.n_layer(), m.n_embd(), plan.nodes(), plan.gpus_per_node(),
                GiB(plan.gpu_memory_bytes()));
  out += Format("# global batch %u sequences = %u micro-batches of %u, sequence %u; f = %u\n",
                plan.global_batch(), plan.microbatches(), plan.microbatch(), plan.sequence_length(),
                plan.faults());
  out += Format("# n0 = %u nodes; templates for %u..%u nodes\n", plan.min_nodes(), plan.min_nodes(),
                plan.min_nodes() + plan.templates_size() - 1);

  std::map<uint32_t, int> used;  // template nodes -> pipelines
  for (const auto& p : in.pipelines()) used[p.template_nodes()]++;

  out += "#\n# templates\n";
  out += Format("# %5s %6s %3s %3s %8s %10s %10s %8s %9s %9s  %s\n", "nodes", "stages", "k", "tp", "schedule",
                "bottleneck", "fill+drain", "update", "mem peak", "capacity", "layers per stage");
  out += Format("# %5s %6s %3s %3s %8s %10s %10s %8s %9s %9s\n", "", "", "", "", "", "(ms)", "(ms)", "(ms)",
                "(GiB)", "(GiB)");
  for (const auto& t : plan.templates()) {
    // A mixed template (stages of several degrees) shows "mix" and each
    // stage's degree after its layers.
    const bool mixed = t.stages_per_node() == 0;
    // fill+drain: what the template's schedule leaves of 1F1B's Σw at its
    // expected share of micro-batches.
    out += Format("  %5u %6d %3s %3s %8s %10.3f %10.3f %8.3f %9.2f %9.2f  %s%s\n", t.nodes(), t.stages_size(),
                  mixed ? "mix" : std::to_string(t.stages_per_node()).c_str(),
                  mixed ? "mix" : std::to_string(t.tensor_parallel()).c_str(),
                  ScheduleText(t).c_str(), t.bottleneck_seconds() * 1e3,
                  (t.total_seconds() - t.saved_seconds()) * 1e3, t.update_seconds() * 1e3, GiB(PeakMemory(t)), GiB(plan.gpu_memory_bytes()),
                  Ranges(t, 48).c_str(), used.count(t.nodes()) ? "  *" : "");
  }

  out += "#\n# stages of the templates in use\n";
  out += Format("# %5s %5s %4s %8s %3s %10s %10s %9s %9s %6s %6s %9s %8s\n", "tmpl", "stage", "node", "layers",
                "tp", "compute", "with xfer", "memory", "capacity", "flight", "for W", "recompute", "saved");
  out += Format("# %5s %5s %4s %8s %3s %10s %10s %9s %9s %6s %6s %9s %8s\n", "", "", "", "", "", "(ms)", "(ms)",
                "(GiB)", "(GiB)", "", "", "", "(GiB)");
  for (const auto& t : plan.templates()) {
    if (!used.count(t.nodes())) continue;
    for (int i = 0; i < t.stages_size(); ++i) {
      const auto& s = t.stages(i);
      const std::string layers = LayersText(t, i);
      out += Format("  %5u %5d %4u %8s %3u %10.3f %10.3f %9.2f %9.2f %6u %6u %9s %8.2f\n", t.nodes(), i, s.node(),
                    layers.c_str(), s.tensor_parallel(), s.compute_seconds() * 1e3, s.seconds() * 1e3,
                    GiB(s.memory_bytes()), GiB(s.memory_capacity_bytes()), s.in_flight(), s.weight_inputs(),
                    model::RecomputeName(static_cast<model::Recompute>(s.recompute())),
                    GiB(s.recompute_saved_bytes()));
    }
  }

  out += "#\n# instantiation\n";
  out += Format("# %8s %5s %13s %10s  %s\n", "pipeline", "nodes", "micro-batches", "time", "hosts");
  out += Format("# %8s %5s %13s %10s\n", "", "", "", "(s)");
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
    out += Format("  %8d %5u %13u %10.4f  %s\n", i, p.template_nodes(), p.microbatches(), p.seconds(),
                  hosts.c_str());
  }
  out += Format("# predicted iteration %.4f s, %.0f tokens/s, bubble (idle) fraction %.3f\n",
                in.iteration_seconds(), in.tokens_per_second(), in.bubble_fraction());
  // What the busiest worker of the templates in use is predicted to hold.
  const bool cpu = plan.profile().device().kind() == "cpu";
  uint64_t peak = 0;
  for (const auto& p : in.pipelines()) {
    for (const auto& t : plan.templates()) {
      if (t.nodes() != p.template_nodes()) continue;
      for (int i = 0; i < t.stages_size(); ++i) peak = std::max(peak, WorkerMemory(plan, t, i));
    }
  }
  out += Format("# predicted peak memory per worker %.1f MiB%s\n", static_cast<double>(peak) / (1 << 20),
                cpu ? " (its stage and its host snapshots)" : "");
  if (in.placed_iteration_seconds() > 0)
    out += Format("# on the measured links: %.4f s placed vs %.4f s in hosts-file order (%.1f%% better)\n",
                  in.placed_iteration_seconds(), in.identity_iteration_seconds(),
                  100.0 * (1.0 - in.placed_iteration_seconds() / in.identity_iteration_seconds()));
  const uint32_t shards = std::max<uint32_t>(1, plan.optimizer_shards());
  if (shards > 1) {
    const int P = in.pipelines_size(), rows = static_cast<int>(plan.faults()) + 1;
    out += Format("# optimizer state sharded (design/shard.md): %d rows of %d to %d pipelines, each rank holding\n"
                  "# 1/%d or less of its layers' moments%s; every shard on f+1 = %d nodes\n",
                  rows, P / rows, (P + rows - 1) / rows, P / rows,
                  plan.profile().dtype() == "bfloat16" ? " and fp32 master weights" : "", rows);
  }
  out += Format("# survives any %u node failures: %d pipelines (>= %s = %u), each holding every layer;\n"
                "# the survivors re-instantiate from the templates above\n",
                plan.faults(), in.pipelines_size(), shards > 1 ? "S(f+1)" : "f+1", shards * (plan.faults() + 1));
  out += ExplainStandby(plan);
  return out;
}

// What the standby master (ob-launch --standby-master, design/master.md)
// costs: the state it mirrors and the records it is sent, estimated from the
// plan (a record is a few hundred bytes; a worker heartbeats twice a second).
std::string ExplainStandby(const pb::Plan& plan) {
  constexpr double kRecordBytes = 300, kHeartbeatBytes = 60, kHeartbeatsPerSecond = 2, kKeyBytes = 200;
  uint64_t ranks = 0;
  for (const auto& p : plan.instantiation().pipelines()) ranks += uint64_t{p.template_nodes()} * plan.gpus_per_node();
  const double plan_kib = static_cast<double>(plan.ByteSizeLong()) / 1024;
  // The store holds the current and previous generations (each the plan)
  // and a few keys a rank.
  const double store_kib = 2 * plan_kib + static_cast<double>(ranks) * 4 * kKeyBytes / 1024;
  const double iter = plan.instantiation().iteration_seconds();
  const double traffic = static_cast<double>(ranks) *
                         ((iter > 0 ? kRecordBytes / iter : 0) + kHeartbeatBytes * kHeartbeatsPerSecond);
  return Format("# with a standby master (ob-launch --standby-master, 3 hosts or more) the master's host fails\n"
                "# like another: its host holds the plan (%.0f KiB) and the store (about %.0f KiB; at most 128 MiB),\n"
                "# and the control channel carries each worker's record once more: %llu ranks, about %.1f KiB/s\n",
                plan_kib, store_kib, static_cast<unsigned long long>(ranks), traffic / 1024);
}

Result<std::string> CompareMeasured(const pb::Plan& plan, const std::vector<pb::Metrics>& records,
                                    const std::string& name) {
  const auto& in = plan.instantiation();
  // The first generation's completed steps after the warm-up.
  uint64_t generation = 0;
  for (const auto& r : records)
    if (!r.heartbeat() && r.step_seconds() > 0 && (generation == 0 || r.generation() < generation))
      generation = r.generation();
  // (pipeline, stage) → step → the slowest rank's forward + backward
  std::map<std::pair<uint32_t, uint32_t>, std::map<uint64_t, double>> compute;
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> memory;
  std::vector<double> iteration;
  uint64_t first = UINT64_MAX, last = 0;
  for (const auto& r : records) {
    if (r.heartbeat() || !(r.step_seconds() > 0) || r.generation() != generation ||
        r.step() < kMeasuredWarmupSteps)
      continue;
    if (r.pipeline() >= static_cast<uint32_t>(in.pipelines_size()))
      return Status::DataErr(name + ": a record of pipeline " + std::to_string(r.pipeline()) +
                             ", and the plan has " + std::to_string(in.pipelines_size()) +
                             ": not a run of this plan");
    if (r.rank() == 0) iteration.push_back(r.step_seconds());
    first = std::min(first, r.step());
    last = std::max(last, r.step());
    const auto key = std::make_pair(r.pipeline(), r.stage());
    double& slowest = compute[key][r.step()];
    slowest = std::max(slowest, r.forward_seconds() + r.backward_seconds());
    memory[key] = std::max({memory[key], r.peak_rss_bytes(), r.peak_memory_bytes()});
  }
  if (iteration.empty())
    return Status::DataErr(name + ": no step of rank 0 after the first " + std::to_string(kMeasuredWarmupSteps) +
                           " of the run's first generation");

  std::string out;
  out += Format("#\n# measured (%s: generation %llu, steps %llu-%llu, medians over the steps)\n", name.c_str(),
                static_cast<unsigned long long>(generation), static_cast<unsigned long long>(first),
                static_cast<unsigned long long>(last));
  out += Format("# %8s %5s %8s %10s %10s %6s %10s %10s %6s\n", "pipeline", "stage", "layers", "compute",
                "measured", "ratio", "memory", "measured", "ratio");
  out += Format("# %8s %5s %8s %10s %10s %6s %10s %10s %6s\n", "", "", "", "(ms)", "(ms)", "", "(MiB)", "(MiB)", "");
  for (int i = 0; i < in.pipelines_size(); ++i) {
    const auto& p = in.pipelines(i);
    const pb::PipelineTemplate* t = nullptr;
    for (const auto& c : plan.templates())
      if (c.nodes() == p.template_nodes()) t = &c;
    if (t == nullptr) continue;
    for (int j = 0; j < t->stages_size(); ++j) {
      const auto& s = t->stages(j);
      const auto key = std::make_pair(static_cast<uint32_t>(i), static_cast<uint32_t>(j));
      const std::string layers = LayersText(*t, j);
      const double predicted = j < p.stage_compute_seconds_size() ? p.stage_compute_seconds(j) * 1e3
                                                                   : s.compute_seconds() * p.microbatches() * 1e3;
      const double predicted_mib = static_cast<double>(WorkerMemory(plan, *t, j)) / (1 << 20);
      auto c = compute.find(key);
      auto m = memory.find(key);
      std::vector<double> steps;
      if (c != compute.end())
        for (const auto& [step, seconds] : c->second) steps.push_back(seconds);
      const double measured = watch::Median(steps) * 1e3;
      const double measured_mib = m == memory.end() ? 0 : static_cast<double>(m->second) / (1 << 20);
      auto ratio = [](double a, double b) { return b > 0 && a > 0 ? Format("%6.2f", a / b) : Format("%6s", "-"); };
      out += Format("  %8d %5d %8s %10.3f %10s %s %10.1f %10s %s\n", i, j, layers.c_str(), predicted,
                    measured > 0 ? Format("%.3f", measured).c_str() : "-", ratio(measured, predicted).c_str(),
                    predicted_mib, measured_mib > 0 ? Format("%.1f", measured_mib).c_str() : "-",
                    ratio(measured_mib, predicted_mib).c_str());
    }
  }
  const double measured = watch::Median(iteration);
  out += Format("# iteration %.4f s measured vs %.4f s predicted (%.2fx)\n", measured, in.iteration_seconds(),
                in.iteration_seconds() > 0 ? measured / in.iteration_seconds() : 0.0);
  return out;
}

}  // namespace ob::plan
