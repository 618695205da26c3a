// Activation recomputation (model/recompute.h): selective and full give the
// bits of none, in fp32 and bf16, whole and segment by segment, for both
// model families and with tensor parallelism (ranks as threads, one Gloo
// group); the backward replays the forward's random state.
// LibTorch first: its logging defines a CHECK that Catch's must replace.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ob/model/compute_copies.h"
#include "ob/model/gpt.h"
#include "ob/model/recompute.h"
#include "ob/model/tensor_parallel.h"
#include "ob/torch_compat.h"

using namespace ob::model;

namespace {

constexpr uint64_t kSeed = 11;
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
  std::map<std::string, torch::Tensor> grads;  // summed over the steps' backwards
};

// Two forward-backward passes (gradients accumulate), every layer in mode
// `r`; `segments`: layer by layer and segment by segment, each from a
// detached input, as a worker runs an overlapped micro-batch.
Run Train(GptStage& stage, const GptConfig& cfg, Recompute r, bool bf16, bool segments) {
  for (const auto& layer : stage->layers()) layer->set_recompute(r);
  auto gen = ob::compat::MakeCpuGenerator(5);
  std::unique_ptr<ComputeCopies> copies;
  if (bf16) copies = stage->MakeComputeCopies(torch::kBFloat16);
  Run out;
  for (int pass = 0; pass < 2; ++pass) {
    auto ids = torch::randint(cfg.vocab_size, {kBatch, kSeq}, gen, torch::kLong);
    auto targets = torch::randint(cfg.vocab_size, {kBatch, kSeq}, gen, torch::kLong);
    if (copies) copies->Refresh();
    ComputeCopies::Scope use(copies.get());
    ob::compat::AutocastCacheScope cache(bf16);
    torch::Tensor loss;
    std::vector<torch::Tensor> ins, outs;
    {
      ob::compat::AutocastGuard autocast(torch::Device(torch::kCPU), bf16);
      if (!segments) {
        loss = stage->forward(ids, targets);
      } else {
        torch::Tensor x = ids;
        for (const auto& layer : stage->layers()) {
          for (int s = 0; s < layer->num_segments(); ++s) {
            torch::Tensor xin = x.is_floating_point() ? x.detach().requires_grad_(true) : x;
            ins.push_back(xin);
            x = layer->forward_segment(s, xin, targets);
            outs.push_back(x);
          }
        }
        loss = x;
      }
    }
    loss = loss.to(torch::kFloat);
    out.losses.push_back(loss.item<double>());
    if (!segments) {
      loss.backward();
    } else {
      torch::Tensor grad;
      for (size_t k = outs.size(); k-- > 0;) {
        if (grad.defined()) {
          torch::autograd::backward({outs[k]}, {grad});
        } else {
          loss.backward();
        }
        grad = ins[k].is_floating_point() ? ins[k].grad() : torch::Tensor();
      }
    }
  }
  for (const auto& p : stage->named_parameters()) out.grads[p.key()] = p.value().grad().clone();
  return out;
}

void SameBits(const Run& a, const Run& b, const std::string& what) {
  INFO(what);
  REQUIRE(a.losses.size() == b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) CHECK(a.losses[i] == b.losses[i]);
  REQUIRE(a.grads.size() == b.grads.size());
  for (const auto& [name, g] : a.grads) {
    INFO(name);
    REQUIRE(b.grads.count(name));
    CHECK(torch::equal(g, b.grads.at(name)));
  }
}

}  // namespace

TEST_CASE("recompute: the modes' names, and one line for another word") {
  for (Recompute r : kRecomputeModes) CHECK(*ParseRecompute(RecomputeName(r)) == r);
  auto bad = ParseRecompute("partial");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() == "recomputation 'partial': expected none, selective or full");
}

TEST_CASE("recompute: selective and full give none's losses and gradients bit for bit") {
  torch::set_num_threads(1);
  for (const GptConfig& cfg : {Gpt(), Named("llama-tiny"), Named("qwen3-tiny")}) {
    for (bool bf16 : {false, true}) {
      for (bool segments : {false, true}) {
        const std::string where = std::string(cfg.llama() ? "llama family" : "gpt-2") + (bf16 ? ", bf16" : ", fp32") +
                                  (segments ? ", segment by segment" : ", whole");
        GptStage base(cfg, 0, cfg.num_layers() - 1, kSeed);
        const Run none = Train(base, cfg, Recompute::kNone, bf16, segments);
        for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
          GptStage stage(cfg, 0, cfg.num_layers() - 1, kSeed);
          SameBits(none, Train(stage, cfg, r, bf16, segments), where + ", " + RecomputeName(r));
        }
      }
    }
  }
}

TEST_CASE("recompute: a stage without the embed recomputes from its received input") {
  torch::set_num_threads(1);
  const GptConfig cfg = Named("llama-tiny");
  const int L = cfg.num_layers() - 1;
  auto run = [&](Recompute r) {
    GptStage stage(cfg, 1, L, kSeed);
    for (const auto& layer : stage->layers()) layer->set_recompute(r);
    auto gen = ob::compat::MakeCpuGenerator(3);
    auto x = torch::randn({kBatch, kSeq, cfg.n_embd}, gen).requires_grad_(true);
    auto targets = torch::randint(cfg.vocab_size, {kBatch, kSeq}, gen, torch::kLong);
    stage->forward(x, targets).backward();
    Run out;
    out.grads["input"] = x.grad().clone();
    for (const auto& p : stage->named_parameters()) out.grads[p.key()] = p.value().grad().clone();
    return out;
  };
  const Run none = run(Recompute::kNone);
  SameBits(none, run(Recompute::kSelective), "selective");
  SameBits(none, run(Recompute::kFull), "full");
}

TEST_CASE("recompute: the backward replays the forward's random state") {
  torch::set_num_threads(1);
  auto w = torch::randn({8, 8}).requires_grad_(true);
  auto x0 = torch::randn({4, 8});
  auto fn = [w](const torch::Tensor& x) { return torch::dropout(torch::matmul(x, w), 0.5, /*train=*/true); };
  auto grads = [&](bool checkpointed) {
    w.mutable_grad() = torch::Tensor();
    auto x = x0.clone().requires_grad_(true);
    torch::manual_seed(1234);
    auto y = checkpointed ? Checkpointed(fn, x) : fn(x);
    torch::randn({100});  // the generator moves on before the backward
    (y * y).sum().backward();
    return std::pair{x.grad().clone(), w.grad().clone()};
  };
  const auto [dx, dw] = grads(false);
  const auto [cx, cw] = grads(true);
  CHECK(torch::equal(dx, cx));
  CHECK(torch::equal(dw, cw));
  // Without gradients, or without an input that needs one, fn runs as it is.
  {
    torch::NoGradGuard no_grad;
    CHECK_FALSE(Checkpointed(fn, x0).requires_grad());
  }
  w.mutable_grad() = torch::Tensor();
  Checkpointed(fn, x0).sum().backward();
  CHECK(w.grad().defined());  // the parameter keeps its gradient
}

TEST_CASE("recompute: tensor parallel ranks issue their collectives again, in order, and match none") {
  torch::set_num_threads(1);
  // Every rank of a group runs the same program (whole, or segment by
  // segment as a worker's overlapped micro-batch): the recomputations'
  // collectives then come in the same order on each.
  for (const GptConfig& cfg : {Gpt(), Named("llama-tiny")}) {
   for (bool segments : {false, true}) {
    const int t = 2;
    std::map<Recompute, std::vector<Run>> runs;
    for (Recompute r : kRecomputeModes) {
      auto store = ob::compat::MakeHashStore();
      std::vector<Run> out(t);
      std::vector<std::string> errors(t);
      std::vector<std::thread> threads;
      for (int rank = 0; rank < t; ++rank) {
        threads.emplace_back([&, rank] {
          try {
            TpGroup g;
            g.rank = rank;
            g.size = t;
            g.group = ob::compat::MakeProcessGroup(c10::make_intrusive<c10d::PrefixStore>("tp", store), rank, t,
                                                   torch::kCPU, std::chrono::seconds(30));
            GptStage stage(cfg, 0, cfg.num_layers() - 1, kSeed, std::make_shared<TpGroup>(g));
            out[rank] = Train(stage, cfg, r, false, segments);
          } catch (const std::exception& e) {
            errors[rank] = e.what();
          }
        });
      }
      for (auto& th : threads) th.join();
      for (int rank = 0; rank < t; ++rank) {
        INFO(RecomputeName(r) << " rank " << rank << ": " << errors[rank]);
        REQUIRE(errors[rank].empty());
      }
      runs[r] = out;
    }
    for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
      for (int rank = 0; rank < t; ++rank) {
        SameBits(runs[Recompute::kNone][rank], runs[r][rank],
                 std::string(cfg.llama() ? "llama" : "gpt-2") + (segments ? " by segment" : " whole") +
                     ", tp rank " + std::to_string(rank) + ", " + RecomputeName(r));
      }
    }
   }
  }
}
