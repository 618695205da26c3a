// The analytic profile must equal the design/formulas.md formulas, written out here
// again independently of lib/ob/profile/analytic.cc.
#include <catch2/catch.hpp>

#include <chrono>

#include "ob/profile/analytic.h"

using ob::model::GptConfig;

namespace {

GptConfig Gpt3_175b() {
  auto c = ob::model::Preset("gpt3-175b");
  REQUIRE(c.ok());
  return *c;
}

ob::profile::AnalyticOptions Options(const char* gpu, std::vector<int> mbs = {1}) {
  ob::profile::AnalyticOptions o;
  auto g = ob::profile::FindGpu(gpu);
  REQUIRE(g.ok());
  o.gpu = *g;
  o.microbatches = std::move(mbs);
  return o;
}

}  // namespace

TEST_CASE("gpt3-175b analytic profile: 175B parameters and design/formulas.md, design/profile.md per layer") {
  const GptConfig c = Gpt3_175b();
  const double h = 12288, s = 2048, V = 50257, a = 96, L = 96;
  CHECK(c.n_embd == h);
  CHECK(c.n_layer == L);

  auto t0 = std::chrono::steady_clock::now();
  auto p = ob::profile::AnalyticProfile(c, Options("a100-80gb", {1, 2}));
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(p.ok());
  CHECK(took < 1.0);
  REQUIRE(p->layers_size() == 98);

  double params = 0, flops_per_token = 0;
  for (const auto& l : p->layers()) {
    params += static_cast<double>(l.parameter_count() - l.tied_parameter_count());
    flops_per_token += (l.costs(0).forward_flops() + l.costs(0).backward_flops()) / s;
  }
  CHECK(params == Approx(175e9).epsilon(0.01));

  const auto& embed = p->layers(0);
  const auto& block = p->layers(1);
  const auto& head = p->layers(97);
  CHECK(embed.parameter_count() == static_cast<uint64_t>(V * h + s * h));
  CHECK(block.parameter_count() == static_cast<uint64_t>(12 * h * h + 13 * h));
  CHECK(head.parameter_count() == static_cast<uint64_t>(V * h + 2 * h));
  CHECK(head.tied_parameter_count() == static_cast<uint64_t>(V * h));

  // Model state as ob-launch keeps it under bf16: 18 bytes per parameter,
  // the fp32 weight and its bf16 copy, the fp32 gradient (what the
  // all-reduce moves too), two fp32 moments.
  for (const auto& l : p->layers()) {
    CHECK(l.parameter_bytes() == 6 * l.parameter_count());
    CHECK(l.gradient_bytes() == 4 * l.parameter_count());
    CHECK(l.optimizer_state_bytes() == 8 * l.parameter_count());
    for (const auto& a : l.allreduce()) CHECK(a.bytes() == l.gradient_bytes());
  }

  for (int mb : {0, 1}) {
    const double b = mb + 1;
    INFO("micro-batch " << b);
    const auto& bc = block.costs(mb);
    CHECK(bc.microbatch() == b);
    // 6N + 12·h·s per token for a block, forward a third.
    const double block_train = b * s * (6 * (12 * h * h + 13 * h) + 12 * h * s);
    CHECK(bc.forward_flops() == Approx(block_train / 3));
    CHECK(bc.backward_flops() == Approx(block_train * 2 / 3));
    // s·b·h·(34 + 5·a·s/h) bytes at 16 bits, without fused attention.
    CHECK(bc.activation_bytes() == static_cast<uint64_t>(s * b * h * (34 + 5 * a * s / h)));
    CHECK(bc.output_bytes() == static_cast<uint64_t>(b * s * h * 2));
    // The head keeps the fp32 logits s·b·V·4 (and its LayerNorm input).
    CHECK(head.costs(mb).activation_bytes() == static_cast<uint64_t>(s * b * V * 4 + s * b * h * 2));
    CHECK(head.costs(mb).forward_flops() == Approx(b * s * 6 * (V * h + 2 * h) / 3));
    CHECK(embed.costs(mb).forward_flops() == 0);
    // Times: compute-bound layers run at peak × efficiency.
    CHECK(bc.forward_seconds() == Approx(block_train / 3 / (312e12 * 0.45)));
    CHECK(embed.costs(mb).forward_seconds() > 0);
  }
  // Whole model: 6·N + 12·L·h·s per token (design/formulas.md), less the position
  // table's lookups, within 1%.
  const double N = V * h + s * h + L * (12 * h * h + 13 * h);
  CHECK(flops_per_token == Approx(6 * N + 12 * L * h * s).epsilon(0.01));

  // Ring all-reduce of the fp32 gradient over 1, 2, 4, 8 GPUs.
  REQUIRE(block.allreduce_size() == 4);
  CHECK(block.allreduce(0).seconds() == 0);
  const double bytes = 4 * (12 * h * h + 13 * h);
  CHECK(block.allreduce(3).group_size() == 8);
  CHECK(block.allreduce(3).seconds() == Approx(2.0 * 7 / 8 * bytes / 230e9 + 14 * 5e-6));
}

TEST_CASE("MFU's two counts: PaLM's 6N + 12·L·(a·d)·s and llm.c's 6N + 6·L·(a·d)·s, summed over the layers") {
  using ob::pb::LayerKind;
  auto model = [](const GptConfig& c, int s, auto per_layer) {
    double total = per_layer(c, ob::pb::LAYER_EMBED, s) + per_layer(c, ob::pb::LAYER_HEAD, s);
    for (int l = 0; l < c.n_layer; ++l) total += per_layer(c, ob::pb::LAYER_BLOCK, s);
    return total;
  };
  // gpt2-medium, s = 1024, from the published shapes (24 layers, width
  // 1024, 50257 tokens, 1024 positions, tied head).
  const GptConfig m = *ob::model::Preset("gpt2-medium");
  const double h = 1024, L = 24, V = 50257, P = 1024, s = 1024, block = 12 * h * h + 13 * h;
  // PaLM: N without the embedding (the tied matrix counted at the head, with
  // the final norm), the attention 12·L·h·s.
  CHECK(model(m, 1024, ob::profile::TrainingFlopsPerToken) ==
        Approx(6 * (L * block + V * h + 2 * h) + 12 * L * h * s));
  // llm.c: every parameter (the position table too, the tied matrix once),
  // the attention halved.
  const double all = V * h + P * h + L * block + 2 * h;
  CHECK(static_cast<double>(ob::model::ExactParams(m)) == all);
  CHECK(model(m, 1024, ob::profile::LlmcFlopsPerToken) == Approx(6 * all + 6 * L * h * s));
  CHECK(model(m, 1024, ob::profile::LlmcFlopsPerToken) / model(m, 1024, ob::profile::TrainingFlopsPerToken) ==
        Approx(0.9403).epsilon(1e-3));
  // llama3.2-1b (16 layers, 32 heads of 64, 8 kv heads, MLP 8192, tied):
  // N every parameter, 1.236e9 as published; the attention over a·d = 2048.
  const GptConfig ll = *ob::model::Preset("llama3.2-1b");
  const double n_all = static_cast<double>(ob::model::ExactParams(ll));
  CHECK(n_all == Approx(1.2358e9).epsilon(1e-3));
  CHECK(model(ll, 2048, ob::profile::LlmcFlopsPerToken) == Approx(6 * n_all + 6 * 16 * 2048.0 * 2048));
  // Tied and without a position table, its N is the same in both counts:
  // only the attention's term differs.
  CHECK(model(ll, 2048, ob::profile::TrainingFlopsPerToken) == Approx(6 * n_all + 12 * 16 * 2048.0 * 2048));
}

TEST_CASE("fused attention drops the 5as/h term, and fp32 doubles activations") {
  auto c = ob::model::Preset("gpt2");
  REQUIRE(c.ok());
  const double h = 768, s = 1024, a = 12;
  auto o = Options("h100");
  o.fused_attention = true;
  auto fused = ob::profile::AnalyticProfile(*c, o);
  REQUIRE(fused.ok());
  CHECK(fused->layers(1).costs(0).activation_bytes() == static_cast<uint64_t>(s * h * 34));
  o.fused_attention = false;
  o.fp32 = true;
  auto fp32 = ob::profile::AnalyticProfile(*c, o);
  REQUIRE(fp32.ok());
  CHECK(fp32->layers(1).costs(0).activation_bytes() ==
        static_cast<uint64_t>(2 * s * h * (34 + 5 * a * s / h)));
  CHECK(fp32->layers(1).optimizer_state_bytes() == 8 * fp32->layers(1).parameter_count());
  CHECK(fp32->layers(1).parameter_bytes() == 4 * fp32->layers(1).parameter_count());
  CHECK(fp32->layers(1).gradient_bytes() == 4 * fp32->layers(1).parameter_count());
}

TEST_CASE("fp32 is priced at the CUDA cores' fp32 peak, not the tensor cores' bf16 peak") {
  // ob trains fp32 without TF32: an H100's products run at 67 TFLOP/s, not
  // 989, and a plan priced at 989 predicted fp32 steps 15 times too fast.
  auto c = ob::model::Preset("gpt2");
  REQUIRE(c.ok());
  const double h = 768, s = 1024;
  const double block_train = s * (6 * (12 * h * h + 13 * h) + 12 * h * s);
  auto o = Options("h100");
  auto bf16 = ob::profile::AnalyticProfile(*c, o);
  o.fp32 = true;
  auto fp32 = ob::profile::AnalyticProfile(*c, o);
  REQUIRE(bf16.ok());
  REQUIRE(fp32.ok());
  CHECK(bf16->device().peak_tflops() == 989);
  CHECK(fp32->device().peak_tflops() == 67);  // the peak of the profile's dtype (profile.proto)
  CHECK(bf16->layers(1).costs(0).backward_seconds() == Approx(block_train * 2 / 3 / (989e12 * 0.40)));
  CHECK(fp32->layers(1).costs(0).backward_seconds() == Approx(block_train * 2 / 3 / (67e12 * 0.40)));
  // Every GPU of the table has both peaks, fp32's below bf16's.
  for (const auto& name : ob::profile::GpuNames()) {
    auto g = ob::profile::FindGpu(name);
    REQUIRE(g.ok());
    INFO(name);
    CHECK(g->fp32_tflops > 0);
    CHECK(g->fp32_tflops < g->peak_tflops / 3);
  }
  // A GPU given by its figures has only the peak it was given.
  o.gpu.fp32_tflops = 0;
  auto none = ob::profile::AnalyticProfile(*c, o);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().message() == "--peak-tflops must be positive (fp32 peak of GPU 'h100')");
}

TEST_CASE("named GPUs and overrides") {
  for (const char* g : {"a100-40gb", "a100-80gb", "h100", "h200", "a100", "H100"}) {
    INFO(g);
    CHECK(ob::profile::FindGpu(g).ok());
  }
  auto h200 = ob::profile::FindGpu("h200");
  CHECK(h200->memory_bytes > ob::profile::FindGpu("h100")->memory_bytes);
  auto bad = ob::profile::FindGpu("tpu-v9");
  CHECK(bad.status().code() == ob::Code::kConfig);
  CHECK_THAT(bad.status().message(), Catch::Contains("h100"));

  // CUDA's names for the devices, as a measured profile and the worker see
  // them (MFU was blank on an H200: "NVIDIA H200" is no short name).
  for (auto [cuda, key] : {std::pair{"NVIDIA H100 80GB HBM3", "h100"}, {"NVIDIA H200", "h200"},
                           {"NVIDIA A100-SXM4-40GB", "a100-40gb"}, {"NVIDIA A100-SXM4-80GB", "a100-80gb"},
                           {"NVIDIA B200", "b200"}, {"Tesla V100-SXM2-32GB", "v100"}}) {
    INFO(cuda);
    auto g = ob::profile::GpuForDevice(cuda);
    REQUIRE(g.ok());
    CHECK(g->name == key);
  }
  for (const char* other : {"NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA GeForce RTX 4090", ""}) {
    INFO(other);
    CHECK(ob::profile::GpuForDevice(other).status().code() == ob::Code::kUnavailable);
  }

  auto c = ob::model::Preset("gpt-tiny");
  auto o = Options("h100");
  o.gpu.efficiency = 0;
  CHECK(ob::profile::AnalyticProfile(*c, o).status().code() == ob::Code::kConfig);
  o = Options("h100");
  o.seq_len = c->n_positions * 2;
  CHECK(ob::profile::AnalyticProfile(*c, o).status().code() == ob::Code::kConfig);
}
