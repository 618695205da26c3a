// The worker runtime against the single-process reference (issue 4,
// acceptance 2): pipelines of StageWorkers, one thread per rank sharing an
// in-memory store, must train like ob::model::train_steps.
#include "torch_catch.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ob/model/config.h"
#include "ob/model/data.h"
#include "ob/model/gpt.h"
#include "ob/model/tensor_parallel.h"
#include "ob/model/train.h"
#include "ob/runtime/stage_worker.h"
#include "ob/runtime/topology.h"
#include "ob/torch_compat.h"
#include "runtime_testing.h"

using ob::model::GptConfig;
using ob::model::GptStage;
using ob::model::TrainOptions;
using ob::runtime::StageWorker;
using ob::runtime::StepResult;

namespace {

using namespace ob::runtime::testing;

// Pipelines given as lists of stage layer ranges, with micro-batch counts.
struct PipelineSpec {
  std::vector<std::pair<int, int>> stages;
  int microbatches;
};

// One template per pipeline size; a pipeline of n stages uses the template
// for n nodes. REQUIRES: pipelines of equal size have equal stages.
// Every stage split over `tp` ranks.
std::pair<ob::plan::TemplateSet, ob::plan::Instantiation> Plan(
    const std::vector<PipelineSpec>& specs, int tp = 1) {
  std::map<int, const PipelineSpec*> by_size;
  for (const auto& s : specs) by_size[static_cast<int>(s.stages.size())] = &s;
  ob::plan::TemplateSet ts;
  ts.min_nodes = by_size.begin()->first;
  for (int n = ts.min_nodes; n <= by_size.rbegin()->first; ++n) {
    ob::plan::Template t;
    t.nodes = n;
    if (by_size.count(n)) {
      for (auto [first, last] : by_size[n]->stages) t.stages.push_back({first, last, tp});
    }
    ts.templates.push_back(t);
  }
  ob::plan::Instantiation inst;
  int node = 0;
  for (const auto& s : specs) {
    ob::plan::PipelineInstance p;
    p.template_nodes = static_cast<int>(s.stages.size());
    for (size_t k = 0; k < s.stages.size(); ++k) p.nodes.push_back(node++);
    p.microbatches = s.microbatches;
    inst.pipelines.push_back(p);
  }
  return {ts, inst};
}

struct Run {
  std::vector<std::unique_ptr<StageWorker>> workers;    // by rank
  std::vector<std::vector<StepResult>> results;         // [rank][step]
};

// Runs every rank of the plan on its own thread: create the worker, then
// `steps` calls of Step (or one ForwardBackward when steps == 0).
// `tweak` adjusts the shared training options (precision, overlap, steps).
Run RunPipelines(const std::vector<PipelineSpec>& specs, int steps,
                 const std::function<void(TrainOptions*)>& tweak = {}, int tp = 1) {
  torch::set_num_threads(1);
  auto [ts, inst] = Plan(specs, tp);
  auto topo = ob::runtime::BuildTopology(ts, inst, kMicrobatch);
  REQUIRE(topo.ok());
  const int world = topo->world_size();
  auto opts = Options(topo->total_microbatches);
  if (tweak) tweak(&opts);
  const auto data = Text();
  auto store = ob::compat::MakeHashStore();

  Run run;
  run.workers.resize(world);
  run.results.resize(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      auto w = StageWorker::Create(Small(), *topo, rank, store, opts, data,
                                   std::chrono::seconds(30));
      if (!w.ok()) {
        errors[rank] = w.status().message();
        return;
      }
      run.workers[rank] = std::move(*w);
      for (int step = 0; step < std::max(steps, 1); ++step) {
        auto r = steps == 0 ? run.workers[rank]->ForwardBackward(step)
                            : run.workers[rank]->Step(step);
        if (!r.ok()) {
          errors[rank] = r.status().message();
          return;
        }
        run.results[rank].push_back(*r);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < world; ++rank) {
    INFO("rank " << rank << ": " << errors[rank]);
    REQUIRE(errors[rank].empty());
  }
  return run;
}

// Name of a worker parameter in the whole model: a last stage's own LM head
// copy is the embed's token table.
std::string ReferenceName(const GptConfig& cfg, const std::string& name) {
  if (name == std::to_string(cfg.num_layers() - 1) + ".lm_head.weight") return "0.wte.weight";
  return name;
}

// Runs the pipelines and the reference for kSteps and compares losses (relative,
// returned) and final parameters (the shards of a stage's TP ranks merged).
double CompareTraining(const std::vector<PipelineSpec>& specs, const char* label, int tp = 1) {
  int total = 0;
  for (const auto& s : specs) total += s.microbatches;
  GptStage reference{nullptr};
  auto ref = ob::model::train_steps(Small(), Text(), Options(total), &reference);
  REQUIRE(ref.ok());
  Run run = RunPipelines(specs, kSteps, {}, tp);

  double max_rel = 0, max_norm = 0;
  for (int step = 0; step < kSteps; ++step) {
    const StepResult& r0 = run.results[0][step];
    for (const auto& per_rank : run.results) {
      // Every rank reports the same loss and norm, bit for bit.
      REQUIRE(per_rank[step].loss == r0.loss);
      REQUIRE(per_rank[step].grad_norm == r0.grad_norm);
      REQUIRE(per_rank[step].lr == r0.lr);
    }
    const double want = (*ref)[step].loss;
    const double rel = std::abs(r0.loss - want) / std::abs(want);
    max_rel = std::max(max_rel, rel);
    INFO(label << " step " << step << ": loss " << r0.loss << " vs " << want);
    CHECK(rel < 1e-4);
    CHECK(std::abs(r0.grad_norm - (*ref)[step].grad_norm) < 1e-4 * (*ref)[step].grad_norm);
    CHECK(r0.lr == (*ref)[step].lr);
    max_norm = std::max(max_norm, r0.grad_norm);
  }
  CHECK(max_norm > Options(total).grad_clip);  // clipping was exercised
  CHECK(run.results[0].back().loss < run.results[0].front().loss);  // it learns

  std::map<std::string, torch::Tensor> want;
  for (const auto& p : reference->named_parameters()) want[p.key()] = p.value();
  double max_diff = 0;
  std::string max_name;
  size_t compared = 0;
  for (size_t first = 0; first < run.workers.size(); first += tp) {  // TP rank 0 of each stage
    for (const auto& p : run.workers[first]->stage()->named_parameters()) {
      const auto& name = ReferenceName(Small(), p.key());
      REQUIRE(want.count(name));
      std::vector<torch::Tensor> shards;
      for (int r = 0; r < tp; ++r) {
        REQUIRE(run.workers[first + r]->info().tp_rank == r);
        shards.push_back(run.workers[first + r]->stage()->named_parameters()[p.key()]);
      }
      const torch::Tensor whole = ob::model::MergeShards(p.key().substr(p.key().find('.') + 1), shards);
      const double d = (whole - want[name]).abs().max().item<double>();
      if (d > max_diff) {
        max_diff = d;
        max_name = p.key();
      }
      ++compared;
    }
  }
  CHECK(max_diff < 1e-5);
  std::printf("# %s: max relative loss difference %.3g, max parameter difference %.3g "
              "(%zu tensors; %s), largest grad norm %.3g\n", label, max_rel, max_diff, compared,
              max_name.c_str(), max_norm);
  return max_rel;
}

}  // namespace

TEST_CASE("one single-stage pipeline trains like the reference", "[runtime]") {
  CompareTraining({{{{0, 5}}, 4}}, "1x1");
}

TEST_CASE("two pipelines of two stages train like the reference", "[runtime]") {
  CompareTraining({{{{0, 2}, {3, 5}}, 2}, {{{0, 2}, {3, 5}}, 2}}, "2x2");
}

TEST_CASE("a 2-stage and a 3-stage pipeline with different boundaries train like the reference",
          "[runtime]") {
  CompareTraining({{{{0, 1}, {2, 3}, {4, 5}}, 3}, {{{0, 2}, {3, 5}}, 2}}, "3+2");
}

// Issue 11, acceptance 1 at the worker level: tensor parallelism inside
// each stage, the tied embedding and the vocabulary-parallel cross-entropy
// (V = 256 split in 2 or 4) included.
TEST_CASE("one stage split over 2 TP ranks trains like the reference", "[runtime][tp]") {
  CompareTraining({{{{0, 5}}, 4}}, "1x1 tp2", 2);
}

TEST_CASE("two pipelines of two stages, each split over 2 TP ranks, train like the reference",
          "[runtime][tp]") {
  CompareTraining({{{{0, 2}, {3, 5}}, 2}, {{{0, 2}, {3, 5}}, 2}}, "2x2 tp2", 2);
}

TEST_CASE("one stage split over 4 TP ranks trains like the reference", "[runtime][tp]") {
  CompareTraining({{{{0, 5}}, 4}}, "1x1 tp4", 4);
}

TEST_CASE("the tied embedding gradient is the sum over first and last stages", "[runtime]") {
  const std::vector<PipelineSpec> specs = {{{{0, 1}, {2, 3}, {4, 5}}, 3}, {{{0, 2}, {3, 5}}, 2}};
  const int total = 5;
  Run run = RunPipelines(specs, /*steps=*/0);

  // Reference gradient: the whole model, each micro-batch's loss weighted 1/M.
  const auto cfg = Small();
  const auto data = Text();
  const auto opts = Options(total);
  GptStage model(cfg, 0, cfg.num_layers() - 1, opts.seed);
  double loss = 0;
  for (int g = 0; g < total; ++g) {
    auto [x, y] = ob::model::MakeBatch(data, opts.seed, 0, g * kMicrobatch, kMicrobatch, kSeqLen);
    auto l = model->forward(x, y);
    (l * (1.0 / total)).backward();
    loss += l.item<double>() / total;
  }
  const torch::Tensor wte_grad = model->tied_weights().front().grad();
  CHECK(std::abs(run.results[0][0].loss - loss) < 1e-5 * loss);

  int tied_checked = 0;
  for (const auto& w : run.workers) {
    for (const auto& tied : w->stage()->tied_weights()) {
      INFO("rank " << w->info().rank);
      CHECK(torch::allclose(tied.grad(), wte_grad, /*rtol=*/1e-4, /*atol=*/1e-7));
      ++tied_checked;
    }
  }
  CHECK(tied_checked == 4);  // first and last stage of both pipelines

  // Every other parameter's summed gradient equals the reference's too.
  std::map<std::string, torch::Tensor> want;
  for (const auto& p : model->named_parameters()) want[p.key()] = p.value().grad();
  for (const auto& w : run.workers) {
    for (const auto& p : w->stage()->named_parameters()) {
      INFO(p.key());
      CHECK(torch::allclose(p.value().grad(), want[ReferenceName(cfg, p.key())], 1e-4, 1e-7));
    }
  }
}

TEST_CASE("workers refuse options that do not match the plan", "[runtime]") {
  auto [ts, inst] = Plan({{{{0, 5}}, 2}});
  auto topo = ob::runtime::BuildTopology(ts, inst, kMicrobatch);
  REQUIRE(topo.ok());
  auto store = ob::compat::MakeHashStore();
  auto opts = Options(3);  // the plan has 2 micro-batches
  auto w = StageWorker::Create(Small(), *topo, 0, store, opts, Text());
  CHECK(w.status().code() == ob::Code::kConfig);
  GptConfig other = Small();
  other.n_layer = 3;
  w = StageWorker::Create(other, *topo, 0, store, Options(2), Text());
  CHECK(w.status().code() == ob::Code::kConfig);
}

// Rank 0 of a one-stage pipeline of `cfg` after step 0, its result in *r.
static std::unique_ptr<StageWorker> StepOfOneStage(const GptConfig& cfg, StepResult* r) {
  auto [ts, inst] = Plan({{{{0, cfg.num_layers() - 1}}, 2}});
  auto topo = ob::runtime::BuildTopology(ts, inst, kMicrobatch);
  REQUIRE(topo.ok());
  torch::set_num_threads(1);
  auto w = StageWorker::Create(cfg, *topo, 0, ob::compat::MakeHashStore(), Options(2), Text());
  REQUIRE(w.ok());
  auto step = (*w)->Step(0);
  REQUIRE(step.ok());
  *r = *step;
  return std::move(*w);
}

TEST_CASE("every gradient starts 64 bytes aligned in its bucket, whatever the parameters' sizes",
          "[runtime]") {
  // A GPU's reductions (the gradient norm's) sum in an order that depends
  // on the address's alignment, and every layout must sum alike: sizes of
  // 20 values (80 bytes) would put packed views off 64-byte boundaries.
  GptConfig cfg = Small();
  cfg.n_layer = 2;
  cfg.n_embd = 20;
  cfg.vocab_size = 250;
  StepResult r;
  auto w = StepOfOneStage(cfg, &r);
  CHECK(std::isfinite(r.grad_norm));
  CHECK(r.grad_norm > 0);
  int checked = 0;
  for (const auto& p : w->stage()->named_parameters()) {
    INFO(p.key());
    REQUIRE(p.value().grad().defined());
    CHECK(reinterpret_cast<uintptr_t>(p.value().grad().data_ptr()) % 64 == 0);
    ++checked;
  }
  CHECK(checked > 10);
}

TEST_CASE("a block's MLP and attention gradients are in different buckets, its MLP's issued first",
          "[runtime][overlap]") {
  // The last backward finishes a block's MLP half before its attention
  // half: in separate buckets the MLP's gradients go on the wire while the
  // attention's backward runs (in one, a stage's lowest block was exposed
  // whole). Small layers still share buckets across layers.
  GptConfig cfg = Small();
  StepResult r;
  auto w = StepOfOneStage(cfg, &r);
  auto bucket_of = [](const torch::Tensor& p) { return p.grad().storage().unsafeGetStorageImpl(); };
  auto addr = [](const torch::Tensor& p) { return reinterpret_cast<uintptr_t>(p.grad().data_ptr()); };
  int blocks = 0, shared_across = 0;
  for (int l = 1; l <= cfg.n_layer; ++l) {
    const auto layer = w->stage()->layer(l);
    const auto params = layer->named_parameters();
    INFO("layer " << l);
    CHECK(bucket_of(params["mlp.c_fc.weight"]) != bucket_of(params["attn.c_attn.weight"]));
    CHECK(bucket_of(params["mlp.c_fc.weight"]) == bucket_of(params["ln_2.weight"]));
    CHECK(bucket_of(params["attn.c_attn.weight"]) == bucket_of(params["ln_1.weight"]));
    if (l < cfg.n_layer) {
      // The attention half of the block above and this block's MLP half
      // finish one after the other: they may share a bucket.
      const auto above = w->stage()->layer(l + 1)->named_parameters();
      if (bucket_of(params["mlp.c_fc.weight"]) == bucket_of(above["attn.c_attn.weight"])) ++shared_across;
    }
    // Lower units sit first in a bucket; within it, views in parameter order.
    CHECK(addr(params["ln_2.weight"]) < addr(params["mlp.c_fc.weight"]));
    ++blocks;
  }
  CHECK(blocks == cfg.n_layer);
  CHECK(shared_across > 0);  // the small model's halves are packed across layers
}

TEST_CASE("overlapped all-reduces give the losses of the schedule without overlap",
          "[runtime][overlap]") {
  // Two pipelines of two stages with different boundaries, so that buckets
  // of several layer groups are handed over during the last backward.
  const std::vector<PipelineSpec> specs{{{{0, 2}, {3, 5}}, 2}, {{{0, 3}, {4, 5}}, 3}};
  Run on = RunPipelines(specs, kSteps, [](TrainOptions* o) { o->overlap_allreduce = true; });
  Run off = RunPipelines(specs, kSteps, [](TrainOptions* o) { o->overlap_allreduce = false; });
  for (int step = 0; step < kSteps; ++step) {
    const double a = on.results[0][step].loss, b = off.results[0][step].loss;
    INFO("step " << step << ": " << a << " vs " << b);
    CHECK(std::abs(a - b) <= 1e-6 * std::abs(b));
    CHECK(std::abs(on.results[0][step].grad_norm - off.results[0][step].grad_norm) <=
          1e-6 * off.results[0][step].grad_norm);
  }
}

TEST_CASE("bf16 with tensor parallelism trains like bf16 without it", "[runtime][precision][tp]") {
  // Under bf16 the residual stream and its gradient cross the TP group's
  // all-reduces in bf16 (Gloo's sum of bf16 tensors).
  const std::vector<PipelineSpec> specs{{{{0, 5}}, 2}};
  auto bf16 = [](TrainOptions* o) { o->precision = ob::model::Precision::kBf16; };
  Run tp = RunPipelines(specs, kSteps, bf16, /*tp=*/2);
  Run one = RunPipelines(specs, kSteps, bf16);
  double max_rel = 0;
  for (int step = 0; step < kSteps; ++step) {
    const double a = tp.results[0][step].loss, b = one.results[0][step].loss;
    INFO("step " << step << ": " << a << " vs " << b);
    REQUIRE(std::isfinite(a));
    CHECK(tp.results[1][step].loss == a);
    max_rel = std::max(max_rel, std::abs(a - b) / b);
  }
  std::printf("# bf16, tp 2 vs tp 1: max relative loss difference %.3g\n", max_rel);
  CHECK(max_rel < 0.01);
  CHECK(tp.results[0].back().loss < tp.results[0].front().loss);
}

// bf16 autocast computes each gradient from bf16 operands, then sums it in
// fp32: every parameter's gradient of one step is fp32's within bf16's
// rounding, whichever fused path made it (the linears' accumulation into
// the buckets, the MLP, the layer norms' own backward, the tied table
// summed over two stages). Measured (LibTorch 1.13, 2026-11-29): 1.6-3.6%
// relative, noise-like (norms within 0.7%, cosines above 0.9994): at
// initialisation the gradients are sums of nearly cancelling terms, and
// the residual stream is stored in bf16. A gradient doubled, dropped or
// taken from another tensor is off by 50% or more.
TEST_CASE("one step's gradients in bf16 are fp32's within bf16's rounding, parameter by parameter",
          "[runtime][precision]") {
  const std::vector<PipelineSpec> specs{{{{0, 2}, {3, 5}}, 2}, {{{0, 2}, {3, 5}}, 2}};
  auto with = [](ob::model::Precision p) { return [p](TrainOptions* o) { o->precision = p; }; };
  Run fp32 = RunPipelines(specs, /*steps=*/0, with(ob::model::Precision::kFp32));
  Run bf16 = RunPipelines(specs, /*steps=*/0, with(ob::model::Precision::kBf16));
  double worst = 0;
  std::string worst_name;
  size_t compared = 0, differ = 0;
  for (size_t rank = 0; rank < fp32.workers.size(); ++rank) {
    auto want = fp32.workers[rank]->stage()->named_parameters();
    for (const auto& p : bf16.workers[rank]->stage()->named_parameters()) {
      INFO("rank " << rank << " " << p.key());
      const torch::Tensor g = p.value().grad(), w = want[p.key()].grad();
      REQUIRE(g.defined());
      REQUIRE(g.scalar_type() == torch::kFloat);
      REQUIRE(w.norm().item<double>() > 0);
      const double rel = (g - w).norm().item<double>() / w.norm().item<double>();
      CHECK(rel < 0.08);
      CHECK(std::abs(g.norm().item<double>() / w.norm().item<double>() - 1) < 0.03);
      if (rel > worst) {
        worst = rel;
        worst_name = p.key();
      }
      differ += rel > 0;
      ++compared;
    }
  }
  std::printf("# bf16 vs fp32 gradients of step 0: largest relative difference %.3g (%s), %zu tensors\n", worst,
              worst_name.c_str(), compared);
  CHECK(compared > 20);
  CHECK(differ == compared);  // bf16 did run
}

// At the suite's learning rate (3e-3, Options) this 64-wide model has loss
// spikes, and where bf16's rounding moves one a few steps the two curves
// part by several per cent: the mean loss of steps 190-199 was bf16 -4.1%
// to +2.6% off fp32 over seeds 1, 2, 3 and 1.6% over seed 1234 (LibTorch
// 1.13, 2026-12-02), so which precision came out lower was the seed's doing,
// and summation order alone moved the gap by a per cent. At 1e-3 it trains
// without spikes: steps 90-99 within 0.54% over seeds 1, 2, 3, 7 and 1234,
// and the test checks there, at step 100 as issue 13 asks. (The process
// test launch_bf16 checks gpt-tiny on 2 hosts x 2 stages.)
TEST_CASE("bf16 autocast on the CPU trains within 2% of fp32 at step 100",
          "[runtime][precision]") {
  const std::vector<PipelineSpec> specs{{{{0, 2}, {3, 5}}, 2}, {{{0, 2}, {3, 5}}, 2}};
  constexpr int kLong = 100;
  auto longer = [](ob::model::Precision p) {
    return [p](TrainOptions* o) {
      o->steps = kLong;
      o->lr = 1e-3;
      o->precision = p;
    };
  };
  Run fp32 = RunPipelines(specs, kLong, longer(ob::model::Precision::kFp32));
  Run bf16 = RunPipelines(specs, kLong, longer(ob::model::Precision::kBf16));
  // The mean of the last ten steps: one step's loss moves by a per cent
  // with the batch alone. (The process test launch_bf16.sh checks step 100
  // itself on gpt-tiny, as issue 13 asks.)
  auto tail_mean = [&](const Run& run) {
    double sum = 0;
    for (int k = kLong - 10; k < kLong; ++k) sum += run.results[0][k].loss;
    return sum / 10;
  };
  const double a = tail_mean(bf16), b = tail_mean(fp32);
  std::printf("# bf16 vs fp32, mean loss of steps %d-%d: %.5f vs %.5f (%.2f%%)\n", kLong - 10,
              kLong - 1, a, b, 100 * std::abs(a - b) / b);
  CHECK(std::abs(a - b) <= 0.02 * b);
  CHECK(a < bf16.results[0].front().loss * 0.8);  // it learns
  CHECK(a != b);  // bf16 did run: fp32 would be bit-identical
  // Every rank agrees on the loss, bit for bit, in bf16 too.
  for (const auto& per_rank : bf16.results) {
    CHECK(per_rank.back().loss == bf16.results[0].back().loss);
  }
}
