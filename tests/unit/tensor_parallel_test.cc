// Tensor parallelism (model/tensor_parallel.h): t ranks as threads of this
// process, one Gloo group; GptStage built with the group against the
// unsharded GptStage.
// LibTorch first: its logging defines a CHECK that Catch's must replace.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ob/model/gpt.h"
#include "ob/model/tensor_parallel.h"
#include "ob/torch_compat.h"

using namespace ob::model;

namespace {

constexpr uint64_t kSeed = 7;
constexpr int kBatch = 2, kSeq = 8, kSteps = 3;
constexpr double kLr = 1e-3;  // ob-launch's default peak

GptConfig Config(int heads, int embd, int vocab) {
  GptConfig c;
  c.n_layer = 2;
  c.n_embd = embd;
  c.n_head = heads;
  c.n_positions = 16;
  c.vocab_size = vocab;
  return c;
}

struct Run {
  std::vector<double> losses;
  std::map<std::string, torch::Tensor> grads;   // after step 0's backward
  std::map<std::string, torch::Tensor> params;  // after kSteps AdamW steps
  torch::Tensor input_grad;                     // step 0, when the input is activations
};

// The same inputs everywhere: ids (a stage with the embed) or activations,
// targets, and for a stage without the head a fixed projection to a scalar.
struct Inputs {
  torch::Tensor input, targets, probe;
};
Inputs MakeInputs(const GptConfig& cfg, int first, int last) {
  auto gen = ob::compat::MakeCpuGenerator(99);
  Inputs in;
  in.input = first == 0 ? torch::randint(cfg.vocab_size, {kBatch, kSeq}, gen, torch::kLong)
                        : torch::randn({kBatch, kSeq, cfg.n_embd}, gen);
  in.targets = torch::randint(cfg.vocab_size, {kBatch, kSeq}, gen, torch::kLong);
  in.probe = torch::randn({kBatch, kSeq, cfg.n_embd}, gen);
  (void)last;
  return in;
}

template <typename Stage>
Run Train(Stage& stage, const GptConfig& cfg, int first, int last) {
  const Inputs in = MakeInputs(cfg, first, last);
  const bool head = last == cfg.num_layers() - 1;
  torch::optim::AdamW opt(stage->parameters(), torch::optim::AdamWOptions(kLr));
  Run r;
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    torch::Tensor x = in.input;
    if (first != 0) x = x.clone().requires_grad_(true);
    torch::Tensor out = stage->forward(x, in.targets);
    torch::Tensor loss = head ? out : (out * in.probe).sum();
    loss.backward();
    r.losses.push_back(loss.template item<double>());
    if (step == 0) {
      for (const auto& p : stage->named_parameters()) r.grads[p.key()] = p.value().grad().clone();
      if (first != 0) r.input_grad = x.grad().clone();
    }
    opt.step();
  }
  for (const auto& p : stage->named_parameters()) r.params[p.key()] = p.value().detach().clone();
  return r;
}

std::string LayerParam(const std::string& name) { return name.substr(name.find('.') + 1); }

double RelDiff(const torch::Tensor& a, const torch::Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  const double scale = std::max(b.abs().max().item<double>(), 1e-12);
  return (a - b).abs().max().item<double>() / scale;
}

void CompareWithReference(const GptConfig& cfg, int first, int last, int t) {
  torch::set_num_threads(1);
  GptStage ref_stage(cfg, first, last, kSeed);
  const Run ref = Train(ref_stage, cfg, first, last);

  auto store = ob::compat::MakeHashStore();
  std::vector<Run> runs(t);
  std::vector<std::string> errors(t);
  std::vector<std::thread> threads;
  for (int r = 0; r < t; ++r) {
    threads.emplace_back([&, r] {
      try {
        TpGroup g;
        g.rank = r;
        g.size = t;
        g.group = ob::compat::MakeProcessGroup(c10::make_intrusive<c10d::PrefixStore>("tp", store), r, t,
                                               torch::kCPU, std::chrono::seconds(30));
        GptStage stage(cfg, first, last, kSeed, std::make_shared<TpGroup>(g));
        runs[r] = Train(stage, cfg, first, last);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int r = 0; r < t; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    REQUIRE(errors[r].empty());
  }
  INFO("layers " << first << "-" << last << ", t = " << t << ", " << cfg.n_head << " heads, V = " << cfg.vocab_size);
  for (int step = 0; step < kSteps; ++step) {
    for (int r = 0; r < t; ++r) {
      INFO("step " << step << " rank " << r << ": " << runs[r].losses[step] << " vs " << ref.losses[step]);
      CHECK(std::abs(runs[r].losses[step] - ref.losses[step]) <= 1e-5 * std::abs(ref.losses[step]));
    }
  }
  if (first != 0) CHECK(RelDiff(runs[0].input_grad, ref.input_grad) < 1e-5);
  REQUIRE(runs[0].grads.size() == ref.grads.size());
  for (const auto& [name, want] : ref.grads) {
    std::vector<torch::Tensor> grads, params;
    for (int r = 0; r < t; ++r) {
      REQUIRE(runs[r].grads.count(name));
      grads.push_back(runs[r].grads.at(name));
      params.push_back(runs[r].params.at(name));
    }
    const double dg = RelDiff(MergeShards(LayerParam(name), grads), want);
    // Parameters after kSteps AdamW steps: AdamW divides each element's
    // update by that element's own gradient scale, so where a gradient is
    // rounding noise (the k bias's is 0 in exact arithmetic; a weight whose
    // terms cancel) both runs move it by up to lr a step in a direction the
    // noise picks. Those elements are held to that bound; where the
    // gradient is signal (above 1e-4 of the tensor's largest), to 1e-5.
    const torch::Tensor diff = (MergeShards(LayerParam(name), params) - ref.params.at(name)).abs();
    const torch::Tensor g = want.abs();
    const torch::Tensor signal = g > 1e-4 * g.max();
    const double dp = signal.any().item<bool>() ? diff.masked_select(signal).max().item<double>() : 0.0;
    const double noise = diff.max().item<double>();
    INFO(name << ": gradient " << dg << ", parameters " << dp << " (where the gradient is noise: " << noise << ")");
    CHECK(noise <= 2 * kLr * kSteps);
    CHECK(dg < 1e-5);
    CHECK(dp < 1e-5);
  }
}

}  // namespace

TEST_CASE("tensor parallelism: degrees the model takes, and one line for those it does not") {
  const GptConfig cfg = Config(4, 32, 37);
  CHECK(CheckTensorParallel(cfg, 1).ok());
  CHECK(CheckTensorParallel(cfg, 4).ok());
  auto st = CheckTensorParallel(cfg, 3);
  CHECK(st.code() == ob::Code::kConfig);
  CHECK(st.message() == "tensor parallelism 3 does not divide the model's 4 attention heads");
  CHECK(CheckTensorParallel(cfg, 0).code() == ob::Code::kConfig);
  CHECK(CheckTensorParallel(Config(4, 32, 3), 4).code() == ob::Code::kConfig);  // V < t
}

TEST_CASE("shards: every parameter splits and merges back, uneven vocabularies included") {
  const GptConfig cfg = Config(8, 64, 37);
  GptStage full(cfg, 0, cfg.num_layers() - 1, kSeed);
  GptStage head(cfg, 1, cfg.num_layers() - 1, kSeed);  // with its own lm_head.weight
  for (GptStage* stage : {&full, &head}) {
    for (const auto& p : (*stage)->named_parameters()) {
      const std::string name = LayerParam(p.key());
      for (int t : {1, 2, 4, 8}) {
        std::vector<torch::Tensor> shards;
        int64_t rows = 0;
        for (int r = 0; r < t; ++r) {
          shards.push_back(ShardOf(name, p.value(), t, r));
          rows += shards.back().size(0);
        }
        INFO(p.key() << " t = " << t);
        CHECK(SplitsInto(name, p.value(), t));
        CHECK(torch::equal(MergeShards(name, shards), p.value()));
        if (ShardKindOf(name) == ShardKind::kVocabRows) CHECK(rows == cfg.vocab_size);
        if (ShardKindOf(name) == ShardKind::kReplicated) CHECK(torch::equal(shards.back(), p.value()));
      }
    }
  }
  CHECK((VocabRange(37, 4, 0) == std::pair<int64_t, int64_t>(0, 9)));
  CHECK((VocabRange(37, 4, 3) == std::pair<int64_t, int64_t>(27, 37)));
  CHECK(ShardKindOf("attn.c_attn.weight") == ShardKind::kHeadRows);
  CHECK(ShardKindOf("attn.c_proj.bias") == ShardKind::kReplicated);
  // 64-wide: 3 heads of rows, 5 columns or 38 vocabulary shards do not split it.
  CHECK_FALSE(SplitsInto("attn.c_attn.weight", torch::zeros({3 * 64, 64}), 3));
  CHECK_FALSE(SplitsInto("mlp.c_proj.weight", torch::zeros({64, 256}), 5));
  CHECK_FALSE(SplitsInto("wte.weight", torch::zeros({37, 64}), 38));
  CHECK(SplitsInto("ln_f.weight", torch::zeros({64}), 5));
}

TEST_CASE("tp = 2 and 4 train as the unsharded stage: losses, gradients, AdamW steps") {
  // V = 37 divides by neither 2 nor 4; embed and head on one stage (tied),
  // a head alone (its own LM weight), and embed + blocks without the head.
  for (const GptConfig& cfg : {Config(4, 32, 37), Config(8, 64, 37)}) {
    const int L = cfg.num_layers() - 1;
    for (auto [first, last] : {std::pair{0, L}, std::pair{1, L}, std::pair{0, 2}}) {
      for (int t : {1, 2, 4}) CompareWithReference(cfg, first, last, t);
    }
  }
}
