// GptConfig: presets, design/formulas.md parameter formulas, config.json / YAML files.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "ob/model/config.h"
#include "ob/model/llama_config.h"

using ob::Code;
using ob::model::GptConfig;

namespace {

// A file under the test's temporary directory, removed on destruction.
struct TempFile {
  std::string path;
  TempFile(const std::string& name, const std::string& text) {
    path = "/tmp/ob_config_test_" + std::to_string(getpid()) + "_" + name;
    std::ofstream(path) << text;
  }
  ~TempFile() { std::remove(path.c_str()); }
};

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

GptConfig MustPreset(const std::string& name) {
  auto c = ob::model::Preset(name);
  REQUIRE(c.ok());
  return *c;
}

}  // namespace

TEST_CASE("gpt2 has 124439808 parameters", "[config]") {
  auto c = MustPreset("gpt2");
  CHECK(c.n_layer == 12);
  CHECK(c.n_embd == 768);
  CHECK(c.n_head == 12);
  CHECK(c.n_positions == 1024);
  CHECK(c.vocab_size == 50257);
  CHECK(ob::model::ExactParams(c) == 124439808);
  CHECK(ob::model::BlockParams(c) == 12LL * 768 * 768 + 13 * 768);
}

TEST_CASE("every preset is valid and its exact count is within 1% of the formula", "[config]") {
  const auto& names = ob::model::PresetNames();
  REQUIRE(names.size() == 22);
  CHECK(names.front() == "gpt-tiny");
  CHECK(names[10] == "gpt3-175b");
  CHECK(names.back() == "qwen3-32b");
  int64_t previous = 0;
  for (const auto& name : names) {
    INFO(name);
    // A family starts anew.
    if (name == "llama-tiny" || name == "qwen3-tiny" || name == "llama3-tiny" || name == "llama3.2-1b" ||
        name == "qwen3-0.6b") {
      previous = 0;
    }
    auto c = MustPreset(name);
    CHECK(c.name == name);
    CHECK(c.Validate().ok());
    const double exact = static_cast<double>(ob::model::ExactParams(c));
    const double formula = static_cast<double>(ob::model::FormulaParams(c));
    CHECK(std::abs(exact - formula) <= 0.01 * formula);
    if (name != "gpt3-350m") CHECK(exact > previous);  // each family by size
    previous = static_cast<int64_t>(exact);
    CHECK(c.ToProto().n_embd() == static_cast<uint32_t>(c.n_embd));
    auto back = GptConfig::FromProto(c.ToProto());
    CHECK(back.name == c.name);
    CHECK(back.n_layer == c.n_layer);
    CHECK(back.vocab_size == c.vocab_size);
    CHECK(back.ToProto().SerializeAsString() == c.ToProto().SerializeAsString());
  }
  auto tiny = MustPreset("gpt-tiny");
  CHECK(tiny.vocab_size == 256);
  CHECK(tiny.num_layers() == 6);
}

TEST_CASE("gpt3 presets have the paper's shapes and 175b is 175e9 +- 1%", "[config]") {
  struct Shape { const char* name; int layers, hidden, heads; double billions; };
  const Shape shapes[] = {
      {"gpt3-350m", 24, 1024, 16, 0.35}, {"gpt3-1.3b", 24, 2048, 16, 1.3},
      {"gpt3-2.7b", 32, 2560, 32, 2.7},  {"gpt3-6.7b", 32, 4096, 32, 6.7},
      {"gpt3-13b", 40, 5120, 40, 13.0},  {"gpt3-175b", 96, 12288, 96, 175.0},
  };
  for (const auto& s : shapes) {
    INFO(s.name);
    auto c = MustPreset(s.name);
    CHECK(c.n_layer == s.layers);
    CHECK(c.n_embd == s.hidden);
    CHECK(c.n_head == s.heads);
    CHECK(c.n_positions == 2048);
    CHECK(c.vocab_size == 50257);
    // The paper's names are rounded; all are within 10% (175b within 1%).
    const double n = static_cast<double>(ob::model::ExactParams(c));
    CHECK(std::abs(n - s.billions * 1e9) <= 0.10 * s.billions * 1e9);
  }
  const double n175 = static_cast<double>(ob::model::ExactParams(MustPreset("gpt3-175b")));
  CHECK(std::abs(n175 - 175e9) <= 0.01 * 175e9);
}

TEST_CASE("unknown preset is a config error listing the known names", "[config]") {
  auto r = ob::model::Preset("gpt5");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kConfig);
  CHECK(Contains(r.status().message(), "unknown model 'gpt5'"));
  CHECK(Contains(r.status().message(), "gpt-tiny"));
  CHECK(Contains(r.status().message(), "gpt3-175b"));
  CHECK(ob::model::ResolveModel("gpt5").status().code() == Code::kConfig);
  CHECK(ob::model::ResolveModel("gpt2-xl").ok());
}

TEST_CASE("config.json and YAML files parse", "[config]") {
  TempFile json("model.json", R"({
    "architectures": ["GPT2LMHeadModel"],
    "activation_function": "gelu_new",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 512,
    "vocab_size": 50257,
    "layer_norm_epsilon": 1e-05
  })");
  auto c = ob::model::ResolveModel(json.path);
  REQUIRE(c.ok());
  CHECK(c->name == json.path);
  CHECK(c->n_layer == 12);
  CHECK(c->n_embd == 768);
  CHECK(c->n_head == 12);
  CHECK(c->n_positions == 512);  // n_positions wins over n_ctx
  CHECK(c->vocab_size == 50257);

  TempFile yaml("model.yaml", "# a small model\nn_layer: 2\nn_embd: 64\nn_head: 2\n"
                              "n_ctx: 32\nvocab_size: 256\n");
  auto y = ob::model::ResolveModel(yaml.path);
  REQUIRE(y.ok());
  CHECK(y->n_layer == 2);
  CHECK(y->n_embd == 64);
  CHECK(y->n_head == 2);
  CHECK(y->n_positions == 32);  // n_ctx accepted
  CHECK(y->vocab_size == 256);

  TempFile yml("model.yml", "{n_layer: 1, n_embd: 8, n_head: 1, n_positions: 4, vocab_size: 3}");
  CHECK(ob::model::ResolveModel(yml.path).ok());
}

TEST_CASE("a HuggingFace config that asks for another architecture than ob's GPT-2 is refused", "[config]") {
  const std::string shape = "n_layer: 2\nn_embd: 64\nn_head: 2\nn_positions: 32\nvocab_size: 256\n";
  // GPT-2's own config.json (dropout 0.1, which ob does not apply, is only
  // warned of), and what ob-ckpt export writes.
  TempFile gpt2("gpt2.json", R"({"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1, "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_inner": null, "n_layer": 12,
    "n_positions": 1024, "scale_attn_weights": true, "tie_word_embeddings": true, "vocab_size": 50257,
    "reorder_and_upcast_attn": false, "scale_attn_by_inverse_layer_idx": false})");
  CHECK(ob::model::LoadConfigFile(gpt2.path).ok());
  TempFile tanh("tanh.yaml", shape + "activation_function: gelu_pytorch_tanh\nn_inner: 256\n");
  CHECK(ob::model::LoadConfigFile(tanh.path).ok());
  struct Case { const char* line; const char* says; };
  const Case cases[] = {
      {"model_type: gpt_neox", "model_type 'gpt_neox': ob trains GPT-2 (model_type gpt2) and the Llama family"},
      {"activation_function: relu", "activation_function 'relu': ob's GPT-2 uses gelu_new"},
      {"activation_function: gelu", "activation_function 'gelu': "},
      {"n_inner: 128", "n_inner 128: ob's MLP is 4 x n_embd (256)"},
      {"n_inner: wide", "n_inner wide: ob's MLP is 4 x n_embd"},
      {"tie_word_embeddings: false", "tie_word_embeddings false: ob's GPT-2 ties the LM head"},
      {"tie_word_embeddings: maybe", "tie_word_embeddings is 'maybe', not true or false"},
      {"layer_norm_epsilon: 1e-6", "layer_norm_epsilon 1e-6: ob's LayerNorm uses 1e-05"},
      {"scale_attn_weights: false", "scale_attn_weights false: "},
      {"scale_attn_by_inverse_layer_idx: true", "scale_attn_by_inverse_layer_idx true: "},
      {"add_cross_attention: true", "add_cross_attention true: "},
  };
  for (const auto& k : cases) {
    INFO(k.line);
    TempFile f("arch.yaml", shape + k.line + "\n");
    auto r = ob::model::LoadConfigFile(f.path);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kConfig);
    CHECK(Contains(r.status().message(), f.path + ":6: " + k.says));
  }
}

TEST_CASE("bad config files are config errors naming file and field", "[config]") {
  const std::string good_rest = "n_embd: 64\nn_head: 2\nn_positions: 32\nvocab_size: 256\n";
  struct Case { const char* what; std::string text; const char* field; };
  const Case cases[] = {
      {"missing", good_rest, "n_layer"},
      {"negative", "n_layer: -2\n" + good_rest, "n_layer"},
      {"zero", "n_layer: 0\n" + good_rest, "n_layer"},
      {"non-integer", "n_layer: 2.5\n" + good_rest, "n_layer"},
      {"string", "n_layer: two\n" + good_rest, "n_layer"},
      {"list", "n_layer: [1, 2]\n" + good_rest, "n_layer"},
      {"missing vocab", "n_layer: 2\nn_embd: 64\nn_head: 2\nn_positions: 32\n", "vocab_size"},
      {"indivisible", "n_layer: 2\nn_embd: 64\nn_head: 3\nn_positions: 32\nvocab_size: 9\n",
       "n_head"},
  };
  for (const auto& k : cases) {
    INFO(k.what);
    TempFile f("bad.yaml", k.text);
    auto r = ob::model::LoadConfigFile(f.path);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kConfig);
    CHECK(Contains(r.status().message(), f.path));
    CHECK(Contains(r.status().message(), k.field));
  }

  TempFile broken("broken.json", "{\"n_layer\": 2,\n \"n_embd\": [64,\n");
  auto b = ob::model::LoadConfigFile(broken.path);
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().code() == Code::kConfig);
  CHECK(Contains(b.status().message(), broken.path + ":"));

  // A key twice: which one was meant? (yaml-cpp reads the first.)
  TempFile twice("twice.json", "{\"n_layer\": 2, \"n_embd\": 64, \"n_head\": 2,\n \"n_positions\": 32, "
                               "\"vocab_size\": 256, \"n_embd\": 66}");
  auto t = ob::model::LoadConfigFile(twice.path);
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().code() == Code::kConfig);
  CHECK(Contains(t.status().message(), twice.path + ":2: key 'n_embd' is given twice (line 1 too)"));
  // A depth no model has (a typo): refused before a profile of 10^8
  // records fills the memory.
  TempFile deep("deep.yaml", "n_layer: 100000000\n" + good_rest);
  auto d = ob::model::LoadConfigFile(deep.path);
  REQUIRE_FALSE(d.ok());
  CHECK(Contains(d.status().message(), "field 'n_layer' is 100000000, more than the 4096 blocks"));
  TempFile deepest("deepest.yaml", "n_layer: 4096\n" + good_rest);
  CHECK(ob::model::LoadConfigFile(deepest.path).ok());

  TempFile scalar("scalar.yaml", "just a string\n");
  CHECK(ob::model::LoadConfigFile(scalar.path).status().code() == Code::kConfig);
}

TEST_CASE("an unreadable config file is a no-input error naming it", "[config]") {
  const std::string path = "/nonexistent/dir/model.json";
  auto r = ob::model::ResolveModel(path);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kNoInput);
  CHECK(Contains(r.status().message(), path));
  CHECK(Contains(r.status().message(), "No such file"));
}

TEST_CASE("Validate rejects non-positive fields and indivisible heads", "[config]") {
  GptConfig c = MustPreset("gpt-tiny");
  CHECK(c.Validate().ok());
  c.n_head = 3;
  CHECK(c.Validate().code() == Code::kConfig);
  CHECK(Contains(c.Validate().message(), "n_head"));
  c = MustPreset("gpt-tiny");
  c.vocab_size = 0;
  CHECK(Contains(c.Validate().message(), "vocab_size"));
}

TEST_CASE("one architecture whatever its name, and another named field by field", "[config]") {
  ob::pb::ModelConfig a = MustPreset("gpt-tiny").ToProto(), b = a;
  b.set_name("/data/jobs/7/model.yaml");  // the same shape from a config file
  CHECK(ob::model::ArchitectureDifference(a, b, "there", "here").empty());
  b.set_n_head(8);
  b.set_vocab_size(512);
  CHECK(ob::model::ArchitectureDifference(a, b, "there", "in the plan") ==
        "n_head 4 there, 8 in the plan, vocab_size 256 there, 512 in the plan");
}

// --- The Llama family (llama_config.h) -------------------------------------

TEST_CASE("Llama 3 and Qwen3 presets count their published parameters", "[config][llama]") {
  // Llama 3.1 8B: 8,030,261,248 (Meta's model card: 8.03B); untied head.
  auto l8 = MustPreset("llama3.1-8b");
  CHECK(l8.llama());
  CHECK(l8.kv_heads() == 8);
  CHECK(l8.head_dim() == 128);
  CHECK(ob::model::ExactParams(l8) == 8030261248);
  // Qwen3-0.6B: 0.44B without the (tied) embedding, 0.6B with it (Qwen's
  // model card); head_dim 128 though hidden / heads is 64.
  auto q = MustPreset("qwen3-0.6b");
  CHECK(q.head_dim() == 128);
  CHECK(q.tied);
  CHECK(q.qk_norm);
  CHECK(q.n_layer * ob::model::BlockParams(q) == 440466432);
  CHECK(ob::model::ExactParams(q) == 596049920);
  // Llama 3.1 70B and 405B within 1% of their names.
  CHECK(std::abs(static_cast<double>(ob::model::ExactParams(MustPreset("llama3.1-70b"))) - 70.55e9) < 0.01 * 70.55e9);
  CHECK(std::abs(static_cast<double>(ob::model::ExactParams(MustPreset("llama3.1-405b"))) - 405.85e9) < 0.01 * 405.85e9);
  // GPT-2's proto is what it was before the family existed.
  auto g = MustPreset("gpt2").ToProto();
  CHECK(g.family() == ob::pb::FAMILY_GPT2);
  CHECK(g.n_kv_head() == 0);
  CHECK(g.rope_theta() == 0);
}

TEST_CASE("llama3 rope scaling as Hugging Face computes it", "[config][llama]") {
  auto c = MustPreset("llama3.1-8b");  // theta 5e5, d 128, factor 8, low 1, high 4, original 8192
  auto f = ob::model::RopeInverseFrequencies(c);
  REQUIRE(f.size() == 64);
  CHECK(f[0] == Approx(1.0));  // wavelength 2π, far below 8192/4: kept
  // The lowest frequency, wavelength ~2.5e6 > 8192: divided by 8.
  CHECK(f[63] == Approx(std::pow(500000.0, -126.0 / 128.0) / 8).epsilon(1e-6));
  // Between the two wavelengths (2048 and 8192): the smooth blend.
  for (int i = 0; i < 64; ++i) {
    const double raw = std::pow(500000.0, -2.0 * i / 128.0), wavelen = 2 * M_PI / raw;
    INFO(i);
    if (wavelen < 2048) CHECK(f[i] == Approx(raw).epsilon(1e-6));
    if (wavelen > 8192) CHECK(f[i] == Approx(raw / 8).epsilon(1e-6));
    if (wavelen >= 2048 && wavelen <= 8192) {
      const double a = (8192 / wavelen - 1) / 3;
      CHECK(f[i] == Approx((1 - a) * raw / 8 + a * raw).epsilon(1e-6));
    }
  }
  auto linear = c;
  linear.rope.type = "linear";
  linear.rope.factor = 4;
  CHECK(ob::model::RopeInverseFrequencies(linear)[10] == Approx(std::pow(500000.0, -20.0 / 128.0) / 4).epsilon(1e-6));
}

TEST_CASE("Hugging Face config.json of the Llama family", "[config][llama]") {
  const std::string llama = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": false, "hidden_act": "silu", "attention_bias": false, "mlp_bias": false,
    "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16"})";
  TempFile f("llama.json", llama);
  auto c = ob::model::LoadConfigFile(f.path);
  REQUIRE(c.ok());
  auto preset = MustPreset("llama3.1-8b").ToProto();
  auto read = c->ToProto();
  preset.clear_name();
  read.clear_name();
  CHECK(read.SerializeAsString() == preset.SerializeAsString());
  // The newer rope_parameters (theta inside), and "type" for "rope_type".
  std::string newer = llama;
  newer.replace(newer.find("\"rope_scaling\""), 14, "\"rope_parameters\"");
  newer.replace(newer.find("\"rope_type\": \"llama3\""), 21, "\"type\": \"llama3\", \"rope_theta\": 500000.0");
  TempFile g("newer.json", newer);
  auto c2 = ob::model::LoadConfigFile(g.path);
  REQUIRE(c2.ok());
  auto read2 = c2->ToProto();
  read2.clear_name();
  CHECK(read2.SerializeAsString() == preset.SerializeAsString());
  // Qwen2: q/k/v biases; Qwen3: q/k norms.
  TempFile q2("qwen2.json", R"({"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
    "max_position_embeddings": 64, "tie_word_embeddings": true})");
  auto qc = ob::model::LoadConfigFile(q2.path);
  REQUIRE(qc.ok());
  CHECK(qc->qkv_bias);
  CHECK_FALSE(qc->qk_norm);
  CHECK(qc->head_dim() == 16);
  struct Case { const char* edit; const char* says; };
  const Case cases[] = {
      {R"("rope_type": "yarn")", "rope_scaling.rope_type' is 'yarn'"},
      {R"("rope_type": "dynamic")", "linear and llama3 only"},
      {R"("hidden_act": "gelu")", "hidden_act"},
      {R"("attention_bias": true)", "attention_bias"},
      {R"("num_local_experts": 8)", "mixtures of experts"},
      {R"("use_sliding_window": true)", "sliding window"},
      {R"("num_key_value_heads": 5)", "not a multiple of 'num_key_value_heads'"},
  };
  for (const Case& k : cases) {
    INFO(k.edit);
    std::string text = llama;
    const std::string key = std::string(k.edit).substr(0, std::string(k.edit).find(':'));
    const size_t at = text.find(key + ":");
    if (at != std::string::npos) {
      text.replace(at, text.find_first_of(",}", at) - at, k.edit);
    } else {
      text.insert(1, std::string(k.edit) + ", ");
    }
    TempFile bad("bad.json", text);
    auto r = ob::model::LoadConfigFile(bad.path);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kConfig);
    CHECK_THAT(r.status().message(), Catch::Contains(bad.path) && Catch::Contains(k.says));
  }
  // A missing field names itself.
  std::string missing = llama;
  missing.erase(missing.find("\"intermediate_size\": 14336,"), 27);
  TempFile m("missing.json", missing);
  auto r = ob::model::LoadConfigFile(m.path);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("intermediate_size") && Catch::Contains("missing"));
}
