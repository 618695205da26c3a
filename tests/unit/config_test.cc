// GptConfig: presets, design §8 parameter formulas, config.json / YAML files.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "ob/model/config.h"

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
  REQUIRE(names.size() == 11);
  CHECK(names.front() == "gpt-tiny");
  CHECK(names.back() == "gpt3-175b");
  int64_t previous = 0;
  for (const auto& name : names) {
    INFO(name);
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
      {"model_type: llama", "model_type 'llama': ob trains GPT-2's architecture"},
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
