// ob-ckpt-bench: the checkpoint engine against a synchronous torch.save and
// against the disk itself, in one run (issue 5, acceptance 6; see
// bench/README.md). One worker holds a whole model (gpt2 by default) after
// a real AdamW step, so its state is weights + two moments.
//
//   ob-ckpt-bench [--model gpt2] [--dir DIR] [--python /usr/bin/python3]
//
// Figures:
//   stall    the training thread's time in Checkpointer::AfterStep at a
//            checkpoint step (the per-step host snapshot, which in-place
//            recovery takes anyway, is shown apart)
//   torch    the same state (same shapes, float32) saved with torch.save by
//            Debian's python3-torch; the training thread waits for all of it
//   persist  the background save's bytes / seconds (fsynced files), against
//            dd if=/dev/zero bs=1M conv=fsync of the same size
//   load     LoadStageSnapshot of the whole model with a cold page cache,
//            against dd of the same size to /dev/null, cold too (caches are
//            dropped when /proc/sys/vm/drop_caches is writable, else both
//            read warm: said in the output)
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ob/ckpt/checkpoint.h"
#include "ob/io/file.h"
#include "ob/manifest.pb.h"
#include "ob/model/config.h"
#include "ob/model/data.h"
#include "ob/runtime/checkpointer.h"
#include "ob/runtime/stage_worker.h"
#include "ob/runtime/topology.h"
#include "ob/torch_compat.h"

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
constexpr int kRounds = 5;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs a shell command, returning its wall time (-1 on failure).
double Timed(const std::string& cmd) {
  const auto t0 = Clock::now();
  if (std::system(cmd.c_str()) != 0) return -1;
  return Since(t0);
}

bool DropCaches() {
  std::system("sync");
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (!f) return false;
  f << "3\n";
  return static_cast<bool>(f);
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "ob-ckpt-bench: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "gpt2", dir = "/tmp/ob-ckpt-bench", python = "/usr/bin/python3";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--model") model = argv[i + 1];
    else if (k == "--dir") dir = argv[i + 1];
    else if (k == "--python") python = argv[i + 1];
    else return Fail("unknown option " + k);
  }
  torch::set_num_threads(2);
  auto cfg = ob::model::Preset(model);
  if (!cfg.ok()) return Fail(cfg.status().message());
  ob::io::RemoveTree(dir);
  std::filesystem::create_directories(dir);

  // One rank, one stage holding every layer.
  const int L = cfg->num_layers();
  ob::plan::TemplateSet ts;
  ts.min_nodes = 1;
  ob::plan::Template t;
  t.nodes = 1;
  t.stages.push_back({0, L - 1, 1});
  ts.templates.push_back(t);
  ob::plan::Instantiation inst;
  inst.pipelines.push_back({1, {0}, 1});
  auto topo = ob::runtime::BuildTopology(ts, inst, 1);
  if (!topo.ok()) return Fail(topo.status().message());
  ob::model::TrainOptions opts;
  opts.global_batch = 1;
  opts.microbatch = 1;
  opts.seq_len = 64;
  opts.steps = kRounds + 1;
  auto data = ob::model::TokenSource::Synthetic(cfg->vocab_size, 1);
  auto arena = ob::runtime::SnapshotArena::Anonymous();
  if (!arena.ok()) return Fail(arena.status().message());
  auto w = ob::runtime::StageWorker::Create(*cfg, *topo, 0, ob::compat::MakeHashStore(), opts, data,
                                            std::chrono::seconds(60), arena->get());
  if (!w.ok()) return Fail(w.status().message());
  auto step = (*w)->Step(0);  // a real AdamW step: the moments exist
  if (!step.ok()) return Fail(step.status().message());

  // Saves of steps 0, 1, 2 (the worker steps between them), alternating
  // with dd of the same size; the medians are compared (this disk's speed
  // varies from one write to the next).
  ob::runtime::Checkpointer saver(dir, 1, *topo, 0);
  ob::runtime::Checkpointer::Done done;
  double waited = 0, stall = 0;
  std::vector<double> persist, dd_write;
  uint64_t mib = 0;
  for (int round = 0; round < kRounds; ++round) {
    if (round > 0) {
      auto again = (*w)->Step(round);
      if (!again.ok()) return Fail(again.status().message());
    }
    // Alternate which goes first: this disk (a VM's) writes in bursts.
    auto dd = [&] {
      std::system("sync");
      if (mib > 0) {
        dd_write.push_back(mib * 1048576.0 / Timed("dd if=/dev/zero of=" + dir + "/dd.bin bs=1M count=" +
                                                    std::to_string(mib) + " conv=fsync status=none"));
      }
    };
    if (round % 2 == 1) dd();
    std::system("sync");
    const auto t_stall = Clock::now();
    saver.AfterStep(**w, round, kRounds, &done, &waited);
    stall = std::max(stall, Since(t_stall));
    if (!saver.Finish(**w, &done) || !done.error.empty()) return Fail("save failed: " + done.error);
    persist.push_back(done.bytes / done.seconds);
    ob::pb::Manifest base;
    base.set_step(round);
    auto committed = ob::ckpt::Commit(dir, round, base, L);
    if (!committed.ok()) return Fail(committed.status().message());
    (void)ob::ckpt::Prune(dir, 1);  // as a long run keeps only its latest few
    mib = (done.bytes + (1 << 20) - 1) >> 20;
    if (round % 2 == 0) dd();
  }
  const double persist_bw = Median(persist), dd_write_bw = Median(dd_write);
  std::printf("# persist MB/s by round:");
  for (double b : persist) std::printf(" %.0f", b / 1e6);
  std::printf("; dd:");
  for (double b : dd_write) std::printf(" %.0f", b / 1e6);
  std::printf("\n");

  // The peer: torch.save of tensors shaped like the state.
  {
    std::ofstream shapes(dir + "/shapes.txt");
    for (const auto& [key, s] : (*w)->SnapshotAt(kRounds - 1)->tensors) {
      for (auto d : s.value.sizes()) shapes << d << " ";
      shapes << "\n";
    }
  }
  const std::string py = R"(
import sys, time, torch
shapes = [[int(x) for x in l.split()] for l in open(sys.argv[1]) if l.strip()]
state = {"model": {}, "optim": {}}
for i, s in enumerate(shapes):
    state["model"][i] = torch.randn(s)
    state["optim"][i] = {"step": torch.tensor(1.0), "exp_avg": torch.randn(s), "exp_avg_sq": torch.rand(s)}
t0 = time.perf_counter()
torch.save(state, sys.argv[2])
print(time.perf_counter() - t0)
)";
  {
    std::ofstream f(dir + "/save.py");
    f << py;
  }
  double torch_save = -1;
  {
    const std::string cmd = python + " " + dir + "/save.py " + dir + "/shapes.txt " + dir + "/torch.pt";
    FILE* p = popen(cmd.c_str(), "r");
    if (p != nullptr && std::fscanf(p, "%lf", &torch_save) != 1) torch_save = -1;
    if (p != nullptr) pclose(p);
  }

  // Loading, cold if we may drop the page cache, alternating with dd.
  const std::string ckpt = dir + "/" + ob::ckpt::StepDirName(kRounds - 1);
  std::vector<double> load, dd_read;
  bool cold = true;
  for (int round = 0; round < kRounds; ++round) {
    cold = DropCaches() && cold;
    const auto t_load = Clock::now();
    auto loaded = ob::runtime::LoadStageSnapshot(ckpt, 0, L - 1, true);
    if (!loaded.ok()) return Fail(loaded.status().message());
    load.push_back(done.bytes / Since(t_load));
    DropCaches();
    dd_read.push_back(mib * 1048576.0 / Timed("dd if=" + dir + "/dd.bin of=/dev/null bs=1M status=none"));
  }
  const double load_bw = Median(load), dd_read_bw = Median(dd_read);
  const double snapshot = step->snapshot_seconds;
  std::printf("# ob-ckpt-bench: %s, %.0f MiB of state (weights + AdamW moments), %s page cache for loads\n",
              model.c_str(), done.bytes / 1048576.0, cold ? "cold" : "warm");
  std::printf("%-34s %10s %12s\n", "what", "seconds", "MB/s");
  std::printf("%-34s %10.4f %12s\n", "stall at a checkpoint step (ob)", stall, "-");
  std::printf("%-34s %10.4f %12s\n", "per-step host snapshot (ob)", snapshot, "-");
  std::printf("%-34s %10.4f %12s\n", "torch.save, synchronous (peer)", torch_save, "-");
  std::printf("%-34s %10s %12.0f\n", "background persist (ob, fsynced)", "-", persist_bw / 1e6);
  std::printf("%-34s %10s %12.0f\n", "dd conv=fsync, same size", "-", dd_write_bw / 1e6);
  std::printf("%-34s %10s %12.0f\n", "load, whole model (ob)", "-", load_bw / 1e6);
  std::printf("%-34s %10s %12.0f\n", "dd read, same size", "-", dd_read_bw / 1e6);
  std::printf("stall / torch.save = %.4f (target <= 0.05); with the snapshot: %.4f\n", stall / torch_save,
              (stall + snapshot) / torch_save);
  std::printf("persist / dd write = %.2f (target >= 0.8); load / dd read = %.2f (target >= 0.8)"
              " (medians of %d)\n", persist_bw / dd_write_bw, load_bw / dd_read_bw, kRounds);
  ob::io::RemoveTree(dir);
  return 0;
}
