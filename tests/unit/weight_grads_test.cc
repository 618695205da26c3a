// The backward split for the zero-bubble schedules (model/weight_grads.h):
// input gradients first for two micro-batches, then their weight
// gradients, give the losses and every gradient of two whole backwards bit
// for bit, for both model families, fp32 and bf16, with and without
// recomputation; and between its B and its W a micro-batch's dense
// weights have no gradient yet, held in what W keeps.
// LibTorch first: its logging defines a CHECK that Catch's must replace.
#include <torch/torch.h>

#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ob/model/compute_copies.h"
#include "ob/model/gpt.h"
#include "ob/model/recompute.h"
#include "ob/model/weight_grads.h"
#include "ob/torch_compat.h"

using namespace ob::model;

namespace {

constexpr uint64_t kSeed = 7;
constexpr int kBatch = 2, kSeq = 16;

GptConfig Gpt() {
  GptConfig c;
  c.n_layer = 3;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_positions = 32;
  c.vocab_size = 53;
  return c;
}

GptConfig Named(const std::string& name) {
  auto c = Preset(name);
  REQUIRE(c.ok());
  return *c;
}

struct Run {
  std::vector<double> losses;
  std::map<std::string, torch::Tensor> grads;
};

// Two micro-batches through the whole model. split: B0 B1 W0 W1 (what a
// zero-bubble stage may run), else two whole backwards.
Run Train(const GptConfig& cfg, Recompute r, bool bf16, bool split) {
  GptStage stage(cfg, 0, cfg.num_layers() - 1, kSeed);
  for (const auto& layer : stage->layers()) layer->set_recompute(r);
  auto gen = ob::compat::MakeCpuGenerator(5);
  std::unique_ptr<ComputeCopies> copies;
  if (bf16) copies = stage->MakeComputeCopies(torch::kBFloat16);
  if (copies) copies->Refresh();
  ComputeCopies::Scope use(copies.get());
  ob::compat::AutocastCacheScope cache(bf16);
  Run out;
  std::vector<WeightGradients> kept(2);
  for (int j = 0; j < 2; ++j) {
    auto ids = torch::randint(cfg.vocab_size, {kBatch, kSeq}, gen, torch::kLong);
    auto targets = torch::randint(cfg.vocab_size, {kBatch, kSeq}, gen, torch::kLong);
    torch::Tensor loss;
    {
      ob::compat::AutocastGuard autocast(torch::Device(torch::kCPU), bf16);
      loss = stage->forward(ids, targets);
    }
    loss = loss.to(torch::kFloat);
    out.losses.push_back(loss.item<double>());
    if (!split) {
      loss.backward();
      continue;
    }
    DeferWeightGradients defer(&kept[j]);
    loss.backward();
  }
  if (split) {
    // Between B and W: the dense weights have nothing yet; W holds it.
    int dense = 0;
    for (const auto& p : stage->named_parameters()) {
      const std::string& name = p.key();
      if (name.find("c_attn.weight") == std::string::npos && name.find("q_proj.weight") == std::string::npos) continue;
      ++dense;
      CHECK_FALSE(p.value().grad().defined());
    }
    CHECK(dense == cfg.n_layer);
    CHECK(kept[0].size() > 0);
    CHECK(kept[0].bytes() > 0);
    kept[0].Run();
    kept[1].Run();
    CHECK(kept[0].empty());
  }
  for (const auto& p : stage->named_parameters()) out.grads[p.key()] = p.value().grad().clone();
  return out;
}

}  // namespace

TEST_CASE("weight gradients kept for later: the same bits as the whole backward") {
  torch::set_num_threads(1);
  for (const GptConfig& cfg : {Gpt(), Named("llama-tiny"), Named("qwen3-tiny")}) {
    for (bool bf16 : {false, true}) {
      for (Recompute r : {Recompute::kNone, Recompute::kFull}) {
        INFO((cfg.llama() ? "llama family" : "gpt-2") << (bf16 ? ", bf16, " : ", fp32, ") << RecomputeName(r));
        const Run whole = Train(cfg, r, bf16, false), split = Train(cfg, r, bf16, true);
        REQUIRE(whole.losses.size() == split.losses.size());
        for (size_t i = 0; i < whole.losses.size(); ++i) CHECK(whole.losses[i] == split.losses[i]);
        REQUIRE(whole.grads.size() == split.grads.size());
        for (const auto& [name, g] : whole.grads) {
          INFO(name);
          REQUIRE(split.grads.count(name));
          CHECK(torch::equal(g, split.grads.at(name)));
        }
      }
    }
  }
}

TEST_CASE("weight gradients: one unit at a time, the rest kept") {
  torch::set_num_threads(1);
  torch::Tensor w = torch::zeros({3, 2}).requires_grad_(true), x = torch::ones({4, 2});
  WeightGradients kept;
  kept.SetUnit(0);
  kept.Keep(WeightGradients::Kind::kAdd, w, torch::full({3, 2}, 1.0));
  kept.SetUnit(1);
  kept.Keep(WeightGradients::Kind::kWeight, w, torch::ones({4, 3}), x);
  kept.Run(1);
  REQUIRE(kept.size() == 1);
  CHECK(torch::equal(w.grad(), torch::full({3, 2}, 4.0)));
  kept.Run();
  CHECK(kept.empty());
  CHECK(torch::equal(w.grad(), torch::full({3, 2}, 5.0)));
}
