// Planner speed (issue 2 of 5, acceptance 3): the whole plan for gpt3-175b
// (analytic profile on H100s, 8 GPUs per node) at N = 16, 128 and 1,024
// nodes with f = 4 (the largest f each N admits when 4 does not fit), and
// the re-instantiation after one node failure.
//
//   build/bench/ob-plan-bench [repeats]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "ob/io/message.h"
#include "ob/model/config.h"
#include "ob/plan/instantiation.h"
#include "ob/plan/plan_io.h"
#include "ob/plan/recovery.h"
#include "ob/plan/templates.h"
#include "ob/profile/analytic.h"

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 5;
  auto cfg = ob::model::Preset("gpt3-175b");
  auto gpu = ob::profile::FindGpu("h100");
  ob::profile::AnalyticOptions ao;
  ao.gpu = *gpu;
  auto profile = ob::profile::AnalyticProfile(*cfg, ao);
  if (!profile.ok()) {
    std::fprintf(stderr, "%s\n", profile.status().message().c_str());
    return 1;
  }
  std::printf("# ob-plan speed: gpt3-175b, analytic h100 profile, 8 GPUs/node, global batch 1536\n");
  std::printf("# %6s %3s %5s %9s %10s %12s %12s %12s %12s\n", "nodes", "f", "n0", "templates",
              "pipelines", "templates", "instantiate", "whole plan", "reinstantiate");
  std::printf("# %6s %3s %5s %9s %10s %12s %12s %12s %12s\n", "", "", "", "", "", "(ms)", "(ms)",
              "(ms)", "(ms, median)");
  for (int nodes : {16, 128, 1024}) {
    for (int f = 4; f >= 0; --f) {
      ob::plan::Cluster c;
      c.nodes = nodes;
      c.gpus_per_node = 8;
      c.gpu_memory = gpu->memory_bytes;
      c.overhead_bytes = 1ull << 30;
      c.overhead_fraction = 0.05;
      auto p = ob::plan::MakeProblem(*profile, c, f, 1536, 1);
      if (!p.ok()) return 1;
      std::vector<double> t_templates, t_inst, t_whole;
      ob::Result<ob::plan::TemplateSet> ts = ob::Status::Internal("unset");
      ob::Result<ob::plan::Instantiation> inst = ob::Status::Internal("unset");
      for (int r = 0; r < repeats; ++r) {
        auto t0 = Clock::now();
        ts = ob::plan::BuildTemplates(*p);
        t_templates.push_back(Since(t0));
        if (!ts.ok()) break;
        auto t1 = Clock::now();
        inst = ob::plan::Instantiate(*p, *ts);
        t_inst.push_back(Since(t1));
        if (!inst.ok()) break;
        ob::plan::PlanMeta meta;
        meta.global_batch = 1536;
        meta.profile = &*profile;
        std::string bytes = ob::io::SerializeMessage(ob::plan::ToProto(*p, *ts, *inst, meta),
                                                     ob::io::kPlanFormatVersion);
        t_whole.push_back(Since(t0));
      }
      if (!ts.ok() || !inst.ok()) continue;  // this f does not fit: try a smaller one
      std::mt19937_64 rng(7);
      std::vector<double> t_re;
      for (int r = 0; r < 100; ++r) {
        int lost = static_cast<int>(rng() % nodes);
        auto t0 = Clock::now();
        auto rec = ob::plan::Reinstantiate(*p, *ts, *inst, {lost});
        t_re.push_back(Since(t0));
        if (!rec.ok) {
          std::fprintf(stderr, "re-instantiation failed: %s\n", rec.reason.c_str());
          return 1;
        }
      }
      std::printf("  %6d %3d %5d %9zu %10zu %12.1f %12.1f %12.1f %12.3f\n", nodes, f,
                  ts->min_nodes, ts->templates.size(), inst->pipelines.size(),
                  Median(t_templates) * 1e3, Median(t_inst) * 1e3, Median(t_whole) * 1e3,
                  Median(t_re) * 1e3);
      break;
    }
  }
  std::printf("# targets: whole plan at 1024 nodes <= 2000 ms; re-instantiation <= 10 ms\n");
  return 0;
}
