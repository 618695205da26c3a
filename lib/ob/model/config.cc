// GptConfig presets, config files and the design/formulas.md shape formulas.
#include "ob/model/config.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <type_traits>

#include "ob/io/file.h"
#include "ob/io/message.h"
#include "ob/io/text.h"
#include "ob/log.h"
#include "ob/model/llama_config.h"

namespace ob::model {
namespace {

struct PresetShape {
  const char* name;
  int n_layer, n_embd, n_head, n_positions, vocab_size;
};

// GPT-2 shapes are the released checkpoints'; GPT-3 shapes follow Table 2.1
// of Brown et al. 2020 (2048 context, GPT-2's 50257-token vocabulary).
constexpr int kGpt2Vocab = 50257;
constexpr PresetShape kPresets[] = {
    // Byte vocabulary, small enough for unit tests on two cores.
    {"gpt-tiny", 4, 128, 4, 64, 256},
    {"gpt2", 12, 768, 12, 1024, kGpt2Vocab},
    {"gpt2-medium", 24, 1024, 16, 1024, kGpt2Vocab},
    {"gpt2-large", 36, 1280, 20, 1024, kGpt2Vocab},
    {"gpt2-xl", 48, 1600, 25, 1024, kGpt2Vocab},
    {"gpt3-350m", 24, 1024, 16, 2048, kGpt2Vocab},
    // The paper lists 24 heads of 128 for d_model 2048, which cannot both
    // hold; we keep d_head 128, hence 16 heads.
    {"gpt3-1.3b", 24, 2048, 16, 2048, kGpt2Vocab},
    {"gpt3-2.7b", 32, 2560, 32, 2048, kGpt2Vocab},
    {"gpt3-6.7b", 32, 4096, 32, 2048, kGpt2Vocab},
    // The paper's d_model 5140 is not divisible by its 40 heads; 5120 = 40 x 128.
    {"gpt3-13b", 40, 5120, 40, 2048, kGpt2Vocab},
    {"gpt3-175b", 96, 12288, 96, 2048, kGpt2Vocab},
};

GptConfig FromShape(const PresetShape& p) {
  GptConfig c;
  c.name = p.name;
  c.n_layer = p.n_layer;
  c.n_embd = p.n_embd;
  c.n_head = p.n_head;
  c.n_positions = p.n_positions;
  c.vocab_size = p.vocab_size;
  return c;
}

using io::EndsWith;

// Reads one positive integer field; `keys` are accepted spellings, first wins.
Status ReadField(const YAML::Node& root, const std::string& path,
                 std::initializer_list<const char*> keys, int* out) {
  const char* field = *keys.begin();
  YAML::Node node;
  for (const char* k : keys) {
    if (root[k]) {
      node = root[k];
      field = k;
      break;
    }
  }
  if (!node || node.IsNull()) {
    return Status::Config(path + ": field '" + field + "' is missing");
  }
  const std::string where = path + ":" + std::to_string(node.Mark().line + 1) +
                            ": field '" + field + "'";
  if (!node.IsScalar()) return Status::Config(where + " is not an integer");
  long long v = 0;
  try {
    v = node.as<long long>();
  } catch (const YAML::Exception&) {
    return Status::Config(where + " is not an integer: '" + node.Scalar() + "'");
  }
  if (v <= 0) {
    return Status::Config(where + " must be positive, got " + node.Scalar());
  }
  if (v > std::numeric_limits<int>::max()) {
    return Status::Config(where + " is too large: " + node.Scalar());
  }
  *out = static_cast<int>(v);
  return Status::Ok();
}

// A key given twice: yaml-cpp keeps both and reads the first.
Status CheckUniqueKeys(const YAML::Node& root, const std::string& path) {
  std::map<std::string, int> line_of;
  for (const auto& kv : root) {
    if (!kv.first.IsScalar()) continue;
    const std::string key = kv.first.Scalar();
    const int line = kv.first.Mark().line + 1;
    auto [it, fresh] = line_of.emplace(key, line);
    if (!fresh) {
      return Status::Config(path + ":" + std::to_string(line) + ": key '" + key + "' is given twice (line " +
                            std::to_string(it->second) + " too): which one is meant?");
    }
  }
  return Status::Ok();
}

// HuggingFace GPT-2 keys that would make another model than ob's GPT-2.
Status CheckArchitecture(const YAML::Node& root, const std::string& path, const GptConfig& c) {
  auto at = [&](const char* key) {
    return path + ":" + std::to_string(root[key].Mark().line + 1) + ": " + key + " ";
  };
  auto present = [&](const char* key) { return root[key] && !root[key].IsNull(); };
  auto scalar = [&](const char* key) { return root[key].IsScalar() ? root[key].Scalar() : std::string("(not a value)"); };
  // The key's value as *out's type; false when it is not one.
  auto as = [&](const char* key, auto* out) {
    try {
      *out = root[key].as<std::remove_pointer_t<decltype(out)>>();
      return true;
    } catch (const YAML::Exception&) {
      return false;
    }
  };
  if (present("model_type") && scalar("model_type") != "gpt2") {
    return Status::Config(at("model_type") + "'" + scalar("model_type") +
                          "': ob trains GPT-2 (model_type gpt2) and the Llama family (llama, mistral, qwen2, qwen3)");
  }
  if (present("activation_function")) {
    const std::string act = scalar("activation_function");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
      return Status::Config(at("activation_function") + "'" + act +
                            "': ob's GPT-2 uses gelu_new (GELU, tanh approximation)");
    }
  }
  long long inner = 0;
  if (present("n_inner") && (!root["n_inner"].IsScalar() || !as("n_inner", &inner) || inner != 4LL * c.n_embd)) {
    return Status::Config(at("n_inner") + scalar("n_inner") + ": ob's MLP is 4 x n_embd (" +
                          std::to_string(4LL * c.n_embd) + ")");
  }
  double eps = 0;
  if (present("layer_norm_epsilon") && (!as("layer_norm_epsilon", &eps) || eps != 1e-5)) {
    return Status::Config(at("layer_norm_epsilon") + scalar("layer_norm_epsilon") + ": ob's LayerNorm uses 1e-05");
  }
  struct Flag {
    const char* key;
    bool ours;
    const char* why;
  };
  for (const Flag& f : {Flag{"tie_word_embeddings", true, "ob's GPT-2 ties the LM head to the token embedding"},
                        Flag{"scale_attn_weights", true, "ob's attention scales by 1/sqrt(head size)"},
                        Flag{"scale_attn_by_inverse_layer_idx", false, "ob's attention does not scale by layer"},
                        Flag{"add_cross_attention", false, "ob's GPT-2 is a decoder without cross-attention"}}) {
    bool v = f.ours;
    if (!present(f.key)) continue;
    if (!as(f.key, &v)) return Status::Config(at(f.key) + "is '" + scalar(f.key) + "', not true or false");
    if (v != f.ours) return Status::Config(at(f.key) + scalar(f.key) + ": " + f.why);
  }
  std::string dropout;
  for (const char* key : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) {
    double p = 0;
    if (present(key) && (!as(key, &p) || p != 0)) {
      dropout += (dropout.empty() ? "" : ", ") + std::string(key) + " " + scalar(key);
    }
  }
  if (!dropout.empty()) {
    OB_LOG(Warn) << path << ": " << dropout << ": ob trains without dropout; ignored";
  }
  return Status::Ok();
}

}  // namespace

pb::ModelConfig GptConfig::ToProto() const {
  pb::ModelConfig p;
  p.set_name(name);
  p.set_n_layer(n_layer);
  p.set_n_embd(n_embd);
  p.set_n_head(n_head);
  p.set_n_positions(n_positions);
  p.set_vocab_size(vocab_size);
  if (llama()) {
    p.set_family(pb::FAMILY_LLAMA);
    p.set_n_kv_head(kv_heads());
    p.set_head_dim(head_dim());
    p.set_intermediate_size(mlp_width());
    p.set_rope_theta(rope_theta);
    p.set_rope_type(rope.type);
    if (!rope.type.empty()) {
      p.set_rope_factor(rope.factor);
      if (rope.type == "llama3") {
        p.set_rope_low_freq_factor(rope.low_freq_factor);
        p.set_rope_high_freq_factor(rope.high_freq_factor);
        p.set_rope_original_context(rope.original_context);
      }
    }
    p.set_norm_eps(norm_eps);
    p.set_untied(!tied);
    p.set_qkv_bias(qkv_bias);
    p.set_qk_norm(qk_norm);
    p.set_hf_model_type(hf_type);
  }
  return p;
}

GptConfig GptConfig::FromProto(const pb::ModelConfig& p) {
  GptConfig c;
  c.name = p.name();
  c.n_layer = static_cast<int>(p.n_layer());
  c.n_embd = static_cast<int>(p.n_embd());
  c.n_head = static_cast<int>(p.n_head());
  c.n_positions = static_cast<int>(p.n_positions());
  c.vocab_size = static_cast<int>(p.vocab_size());
  if (p.family() == pb::FAMILY_LLAMA) {
    c.family = Family::kLlama;
    c.n_kv_head = static_cast<int>(p.n_kv_head());
    c.head_size = static_cast<int>(p.head_dim());
    c.n_inner = static_cast<int>(p.intermediate_size());
    c.rope_theta = p.rope_theta();
    c.rope.type = p.rope_type();
    if (!c.rope.type.empty()) {
      c.rope.factor = p.rope_factor();
      if (c.rope.type == "llama3") {
        c.rope.low_freq_factor = p.rope_low_freq_factor();
        c.rope.high_freq_factor = p.rope_high_freq_factor();
        c.rope.original_context = static_cast<int>(p.rope_original_context());
      }
    }
    c.norm_eps = p.norm_eps();
    c.tied = !p.untied();
    c.qkv_bias = p.qkv_bias();
    c.qk_norm = p.qk_norm();
    c.hf_type = p.hf_model_type();
  }
  return c;
}

Status GptConfig::Validate() const {
  const std::string who = name.empty() ? std::string("model") : name;
  const std::pair<const char*, int> fields[] = {
      {"n_layer", n_layer}, {"n_embd", n_embd}, {"n_head", n_head},
      {"n_positions", n_positions}, {"vocab_size", vocab_size}};
  for (const auto& [field, value] : fields) {
    if (value <= 0) {
      return Status::Config(who + ": field '" + field + "' must be positive, got " +
                            std::to_string(value));
    }
  }
  if (llama()) {
    OB_RETURN_IF_ERROR(ValidateLlama(*this, who));
  } else if (n_embd % n_head != 0) {
    return Status::Config(who + ": field 'n_embd' (" + std::to_string(n_embd) +
                          ") is not divisible by 'n_head' (" + std::to_string(n_head) + ")");
  }
  if (n_layer > kMaxLayers) {
    return Status::Config(who + ": field 'n_layer' is " + std::to_string(n_layer) + ", more than the " +
                          std::to_string(kMaxLayers) + " blocks ob profiles and plans");
  }
  return Status::Ok();
}

const std::vector<std::string>& PresetNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& p : kPresets) v.emplace_back(p.name);
    for (const auto& n : LlamaPresetNames()) v.push_back(n);
    return v;
  }();
  return names;
}

Result<GptConfig> Preset(const std::string& name) {
  for (const auto& p : kPresets) {
    if (name == p.name) return FromShape(p);
  }
  if (std::optional<GptConfig> c = LlamaPreset(name)) return *c;
  std::string known;
  for (const auto& n : PresetNames()) known += (known.empty() ? "" : ", ") + n;
  return Status::Config("unknown model '" + name + "' (known: " + known +
                        "; or a .json/.yaml config file)");
}

Result<GptConfig> LoadConfigFile(const std::string& path) {
  OB_ASSIGN_OR_RETURN(std::string text, io::ReadFile(path));
  return ParseConfig(text, path);
}

Result<GptConfig> ParseConfig(const std::string& text, const std::string& path) {
  // yaml-cpp reads JSON too (JSON is, for these files, a subset of YAML).
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return Status::Config(path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  if (!root.IsMap()) {
    return Status::Config(path + ": expected a mapping of model fields (n_layer, n_embd, ...)");
  }
  OB_RETURN_IF_ERROR(CheckUniqueKeys(root, path));
  if (IsLlamaFamily(root)) return ParseLlamaConfig(root, path);
  GptConfig c;
  c.name = path;
  OB_RETURN_IF_ERROR(ReadField(root, path, {"n_layer"}, &c.n_layer));
  OB_RETURN_IF_ERROR(ReadField(root, path, {"n_embd"}, &c.n_embd));
  OB_RETURN_IF_ERROR(ReadField(root, path, {"n_head"}, &c.n_head));
  OB_RETURN_IF_ERROR(ReadField(root, path, {"n_positions", "n_ctx"}, &c.n_positions));
  OB_RETURN_IF_ERROR(ReadField(root, path, {"vocab_size"}, &c.vocab_size));
  OB_RETURN_IF_ERROR(CheckArchitecture(root, path, c));
  OB_RETURN_IF_ERROR(c.Validate());
  return c;
}

Result<GptConfig> ResolveModel(const std::string& name_or_path) {
  const bool looks_like_file = EndsWith(name_or_path, ".json") ||
                               EndsWith(name_or_path, ".yaml") ||
                               EndsWith(name_or_path, ".yml") ||
                               name_or_path.find('/') != std::string::npos;
  if (looks_like_file) return LoadConfigFile(name_or_path);
  return Preset(name_or_path);
}

int64_t BlockParams(const GptConfig& c) {
  const int64_t h = c.n_embd;
  if (c.llama()) {
    const int64_t q = static_cast<int64_t>(c.n_head) * c.head_dim(), kv = static_cast<int64_t>(c.kv_heads()) * c.head_dim();
    return 2 * h * q + 2 * h * kv + 3 * h * c.mlp_width() + 2 * h + (c.qkv_bias ? q + 2 * kv : 0) +
           (c.qk_norm ? 2 * c.head_dim() : 0);
  }
  return 12 * h * h + 13 * h;
}

int64_t EmbeddingParams(const GptConfig& c) {
  const int64_t table = static_cast<int64_t>(c.vocab_size) * c.n_embd;
  return c.llama() ? table : table + static_cast<int64_t>(c.n_positions) * c.n_embd;
}

int64_t HeadOwnParams(const GptConfig& c) {
  if (!c.llama()) return 2 * static_cast<int64_t>(c.n_embd);
  return c.n_embd + (c.tied ? 0 : static_cast<int64_t>(c.vocab_size) * c.n_embd);
}

int64_t FormulaParams(const GptConfig& c) {
  const int64_t lm = c.llama() && !c.tied ? static_cast<int64_t>(c.vocab_size) * c.n_embd : 0;
  return EmbeddingParams(c) + c.n_layer * BlockParams(c) + lm;
}

int64_t ExactParams(const GptConfig& c) { return EmbeddingParams(c) + c.n_layer * BlockParams(c) + HeadOwnParams(c); }

const char* PrecisionName(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

const char* PrecisionDtype(Precision p) {
  return p == Precision::kBf16 ? "bfloat16" : "float32";
}

Result<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp32" || name == "float32") return Precision::kFp32;
  if (name == "bf16" || name == "bfloat16") return Precision::kBf16;
  return Status::Usage("precision '" + name + "': expected fp32 or bf16");
}

std::string ArchitectureDifference(const pb::ModelConfig& a, const pb::ModelConfig& b, const std::string& here,
                                   const std::string& there) {
  std::string out;
  for (const io::FieldDifference& f : io::FieldDifferences(a, b, {pb::ModelConfig::kNameFieldNumber})) {
    out += (out.empty() ? "" : ", ") + f.name + " " + f.a + " " + here + ", " + f.b + " " + there;
  }
  return out;
}

}  // namespace ob::model
