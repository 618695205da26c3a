// The Llama family's presets and Hugging Face config.json files.
#include "ob/model/llama_config.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <limits>

#include "ob/log.h"

namespace ob::model {
namespace {

struct LlamaShape {
  const char* name;
  const char* hf_type;
  int n_layer, hidden, heads, kv_heads, head_dim, inner, vocab, positions;
  double theta;
  double rope_factor;  // llama3 scaling with low 1 and high 4 when > 0
  int rope_original;   // its original_max_position_embeddings
  double eps;
  bool tied, qk_norm;
};

// The published config.json files' shapes (Hugging Face meta-llama/Llama-3.x
// and Qwen/Qwen3-*). The tiny ones are ours, for tests and the quick start: GQA (2 kv heads for
// 4), llama-tiny untied with llama3 scaling over an original context of 16
// (so every branch of it is used at sequence 32), qwen3-tiny tied with q/k
// norms and a head size that is not hidden / heads.
constexpr int kLlama3Vocab = 128256, kQwen3Vocab = 151936;
constexpr LlamaShape kLlamaShapes[] = {
    {"llama-tiny", "llama", 4, 128, 4, 2, 32, 352, 256, 64, 500000, 8, 16, 1e-5, false, false},
    {"qwen3-tiny", "qwen3", 4, 128, 4, 2, 64, 384, 256, 64, 1e6, 0, 0, 1e-6, true, true},
    // llama-tiny's blocks with Llama 3's vocabulary, tied as Llama 3.2's:
    // for a quick start on text through Llama 3's tokenizer.json.
    {"llama3-tiny", "llama", 4, 128, 4, 2, 32, 352, kLlama3Vocab, 256, 500000, 32, 8192, 1e-5, true, false},
    {"llama3.2-1b", "llama", 16, 2048, 32, 8, 64, 8192, kLlama3Vocab, 131072, 500000, 32, 8192, 1e-5, true, false},
    {"llama3.2-3b", "llama", 28, 3072, 24, 8, 128, 8192, kLlama3Vocab, 131072, 500000, 32, 8192, 1e-5, true, false},
    {"llama3.1-8b", "llama", 32, 4096, 32, 8, 128, 14336, kLlama3Vocab, 131072, 500000, 8, 8192, 1e-5, false, false},
    {"llama3.1-70b", "llama", 80, 8192, 64, 8, 128, 28672, kLlama3Vocab, 131072, 500000, 8, 8192, 1e-5, false, false},
    {"llama3.1-405b", "llama", 126, 16384, 128, 8, 128, 53248, kLlama3Vocab, 131072, 500000, 8, 8192, 1e-5, false, false},
    {"qwen3-0.6b", "qwen3", 28, 1024, 16, 8, 128, 3072, kQwen3Vocab, 40960, 1e6, 0, 0, 1e-6, true, true},
    {"qwen3-8b", "qwen3", 36, 4096, 32, 8, 128, 12288, kQwen3Vocab, 40960, 1e6, 0, 0, 1e-6, false, true},
    {"qwen3-32b", "qwen3", 64, 5120, 64, 8, 128, 25600, kQwen3Vocab, 40960, 1e6, 0, 0, 1e-6, false, true},
};

GptConfig FromLlamaShape(const LlamaShape& p) {
  GptConfig c;
  c.family = Family::kLlama;
  c.name = p.name;
  c.hf_type = p.hf_type;
  c.n_layer = p.n_layer;
  c.n_embd = p.hidden;
  c.n_head = p.heads;
  c.n_kv_head = p.kv_heads;
  c.head_size = p.head_dim;
  c.n_inner = p.inner;
  c.vocab_size = p.vocab;
  c.n_positions = p.positions;
  c.rope_theta = p.theta;
  if (p.rope_factor > 0) {
    c.rope.type = "llama3";
    c.rope.factor = p.rope_factor;
    c.rope.low_freq_factor = 1;
    c.rope.high_freq_factor = 4;
    c.rope.original_context = p.rope_original;
  }
  c.norm_eps = p.eps;
  c.tied = p.tied;
  c.qk_norm = p.qk_norm;
  return c;
}

const char* const kLlamaTypes[] = {"llama", "mistral", "qwen2", "qwen3"};

std::string LlamaScalar(const YAML::Node& n) { return n.IsScalar() ? n.Scalar() : std::string("(not a value)"); }

std::string LlamaAt(const std::string& path, const YAML::Node& n, const std::string& field) {
  return path + ":" + std::to_string(n.Mark().line + 1) + ": field '" + field + "'";
}

bool LlamaPresent(const YAML::Node& root, const char* key) { return root[key] && !root[key].IsNull(); }

// A positive integer field; `fallback` when absent (0: required).
Status LlamaInt(const YAML::Node& root, const std::string& path, const char* key, int fallback, int* out) {
  if (!LlamaPresent(root, key)) {
    if (fallback > 0) {
      *out = fallback;
      return Status::Ok();
    }
    return Status::Config(path + ": field '" + key + "' is missing");
  }
  long long v = 0;
  try {
    v = root[key].as<long long>();
  } catch (const YAML::Exception&) {
    return Status::Config(LlamaAt(path, root[key], key) + " is not an integer: '" + LlamaScalar(root[key]) + "'");
  }
  if (v <= 0 || v > std::numeric_limits<int>::max()) {
    return Status::Config(LlamaAt(path, root[key], key) + " must be a positive integer, got " + LlamaScalar(root[key]));
  }
  *out = static_cast<int>(v);
  return Status::Ok();
}

Status LlamaReal(const YAML::Node& node, const std::string& path, const std::string& key, double* out) {
  try {
    *out = node.as<double>();
  } catch (const YAML::Exception&) {
    return Status::Config(LlamaAt(path, node, key) + " is not a number: '" + LlamaScalar(node) + "'");
  }
  if (!std::isfinite(*out) || *out <= 0) return Status::Config(LlamaAt(path, node, key) + " must be positive");
  return Status::Ok();
}

Status LlamaBool(const YAML::Node& root, const std::string& path, const char* key, bool fallback, bool* out) {
  *out = fallback;
  if (!LlamaPresent(root, key)) return Status::Ok();
  try {
    *out = root[key].as<bool>();
  } catch (const YAML::Exception&) {
    return Status::Config(LlamaAt(path, root[key], key) + " is '" + LlamaScalar(root[key]) + "', not true or false");
  }
  return Status::Ok();
}

// rope_scaling (or rope_parameters, which also holds rope_theta).
Status ReadLlamaRope(const YAML::Node& root, const std::string& path, GptConfig* c) {
  const char* key = LlamaPresent(root, "rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (LlamaPresent(root, "rope_theta")) OB_RETURN_IF_ERROR(LlamaReal(root["rope_theta"], path, "rope_theta", &c->rope_theta));
  if (!LlamaPresent(root, key)) return Status::Ok();
  const YAML::Node r = root[key];
  if (!r.IsMap()) return Status::Config(LlamaAt(path, r, key) + " is not a mapping");
  if (LlamaPresent(r, "rope_theta")) {
    OB_RETURN_IF_ERROR(LlamaReal(r["rope_theta"], path, std::string(key) + ".rope_theta", &c->rope_theta));
  }
  const char* tk = LlamaPresent(r, "rope_type") ? "rope_type" : "type";
  const std::string type = LlamaPresent(r, tk) ? LlamaScalar(r[tk]) : "default";
  const std::string field = std::string(key) + "." + tk;
  if (type == "default") return Status::Ok();
  if (type != "linear" && type != "llama3") {
    return Status::Config(LlamaAt(path, r[tk], field) + " is '" + type +
                          "': ob builds rotary scaling of type linear and llama3 only");
  }
  c->rope.type = type;
  if (!LlamaPresent(r, "factor")) return Status::Config(path + ": field '" + std::string(key) + ".factor' is missing");
  OB_RETURN_IF_ERROR(LlamaReal(r["factor"], path, std::string(key) + ".factor", &c->rope.factor));
  if (type == "llama3") {
    for (const char* k : {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      if (!LlamaPresent(r, k)) return Status::Config(path + ": field '" + std::string(key) + "." + k + "' is missing");
    }
    OB_RETURN_IF_ERROR(LlamaReal(r["low_freq_factor"], path, std::string(key) + ".low_freq_factor", &c->rope.low_freq_factor));
    OB_RETURN_IF_ERROR(
        LlamaReal(r["high_freq_factor"], path, std::string(key) + ".high_freq_factor", &c->rope.high_freq_factor));
    OB_RETURN_IF_ERROR(LlamaInt(r, path, "original_max_position_embeddings", 0, &c->rope.original_context));
  }
  return Status::Ok();
}

}  // namespace

const std::vector<std::string>& LlamaPresetNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& p : kLlamaShapes) v.emplace_back(p.name);
    return v;
  }();
  return names;
}

std::optional<GptConfig> LlamaPreset(const std::string& name) {
  for (const auto& p : kLlamaShapes) {
    if (name == p.name) return FromLlamaShape(p);
  }
  return std::nullopt;
}

Status ValidateLlama(const GptConfig& c, const std::string& who) {
  const std::pair<const char*, int> fields[] = {
      {"num_key_value_heads", c.kv_heads()}, {"head_dim", c.head_dim()}, {"intermediate_size", c.mlp_width()}};
  for (const auto& [field, value] : fields) {
    if (value <= 0) {
      return Status::Config(who + ": field '" + field + "' must be positive, got " + std::to_string(value));
    }
  }
  if (c.n_head % c.kv_heads() != 0) {
    return Status::Config(who + ": field 'num_attention_heads' (" + std::to_string(c.n_head) +
                          ") is not a multiple of 'num_key_value_heads' (" + std::to_string(c.kv_heads()) + ")");
  }
  if (c.head_dim() % 2 != 0) {
    return Status::Config(who + ": field 'head_dim' is " + std::to_string(c.head_dim()) +
                          ": the rotation pairs dimensions i and i + head_dim/2, so it must be even");
  }
  if (!(c.rope_theta > 0) || !(c.norm_eps > 0)) {
    return Status::Config(who + ": rope_theta and rms_norm_eps must be positive");
  }
  if (!c.rope.type.empty()) {
    if (c.rope.type != "linear" && c.rope.type != "llama3") {
      return Status::Config(who + ": rope type '" + c.rope.type + "': ob builds linear and llama3 only");
    }
    if (!(c.rope.factor > 0) || (c.rope.type == "llama3" && (c.rope.original_context <= 0 ||
                                                             !(c.rope.high_freq_factor > c.rope.low_freq_factor)))) {
      return Status::Config(who + ": rope scaling '" + c.rope.type +
                            "' needs factor > 0, original context > 0 and high_freq_factor > low_freq_factor");
    }
  }
  return Status::Ok();
}

bool IsLlamaFamily(const YAML::Node& root) {
  if (!LlamaPresent(root, "model_type")) return false;
  const std::string t = LlamaScalar(root["model_type"]);
  for (const char* k : kLlamaTypes) {
    if (t == k) return true;
  }
  return false;
}

Result<GptConfig> ParseLlamaConfig(const YAML::Node& root, const std::string& path) {
  GptConfig c;
  c.family = Family::kLlama;
  c.name = path;
  c.hf_type = LlamaScalar(root["model_type"]);
  OB_RETURN_IF_ERROR(LlamaInt(root, path, "num_hidden_layers", 0, &c.n_layer));
  OB_RETURN_IF_ERROR(LlamaInt(root, path, "hidden_size", 0, &c.n_embd));
  OB_RETURN_IF_ERROR(LlamaInt(root, path, "num_attention_heads", 0, &c.n_head));
  OB_RETURN_IF_ERROR(LlamaInt(root, path, "num_key_value_heads", c.n_head, &c.n_kv_head));
  OB_RETURN_IF_ERROR(LlamaInt(root, path, "head_dim", c.n_embd / c.n_head > 0 ? c.n_embd / c.n_head : 0, &c.head_size));
  if (!LlamaPresent(root, "head_dim") && c.n_embd % c.n_head != 0) {
    return Status::Config(path + ": field 'hidden_size' (" + std::to_string(c.n_embd) +
                          ") is not divisible by 'num_attention_heads' and no head_dim is given");
  }
  OB_RETURN_IF_ERROR(LlamaInt(root, path, "intermediate_size", 0, &c.n_inner));
  OB_RETURN_IF_ERROR(LlamaInt(root, path, "vocab_size", 0, &c.vocab_size));
  OB_RETURN_IF_ERROR(LlamaInt(root, path, "max_position_embeddings", 0, &c.n_positions));
  OB_RETURN_IF_ERROR(ReadLlamaRope(root, path, &c));
  c.norm_eps = 1e-6;  // LlamaConfig's and Qwen's default
  if (LlamaPresent(root, "rms_norm_eps")) OB_RETURN_IF_ERROR(LlamaReal(root["rms_norm_eps"], path, "rms_norm_eps", &c.norm_eps));
  OB_RETURN_IF_ERROR(LlamaBool(root, path, "tie_word_embeddings", false, &c.tied));
  c.qkv_bias = c.hf_type == "qwen2";  // Qwen2's q, k and v projections always carry biases
  c.qk_norm = c.hf_type == "qwen3";
  // What ob does not build.
  if (LlamaPresent(root, "hidden_act") && LlamaScalar(root["hidden_act"]) != "silu") {
    return Status::Config(LlamaAt(path, root["hidden_act"], "hidden_act") + " is '" + LlamaScalar(root["hidden_act"]) +
                          "': ob's SwiGLU MLP uses silu");
  }
  bool flag = false;
  for (const char* key : {"attention_bias", "mlp_bias", "use_sliding_window"}) {
    OB_RETURN_IF_ERROR(LlamaBool(root, path, key, false, &flag));
    if (flag) {
      return Status::Config(LlamaAt(path, root[key], key) + " is true: ob builds " +
                            (std::string(key) == "use_sliding_window" ? "full causal attention, no sliding window"
                                                                       : "the family without these biases"));
    }
  }
  if (LlamaPresent(root, "sliding_window") && c.hf_type == "mistral") {
    return Status::Config(LlamaAt(path, root["sliding_window"], "sliding_window") + " is " + LlamaScalar(root["sliding_window"]) +
                          ": ob builds full causal attention, no sliding window");
  }
  for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts"}) {
    if (LlamaPresent(root, key)) {
      return Status::Config(LlamaAt(path, root[key], key) + ": mixtures of experts are not built by ob");
    }
  }
  if (LlamaPresent(root, "attention_dropout") && root["attention_dropout"].as<double>(0) != 0) {
    OB_LOG(Warn) << path << ": attention_dropout " << LlamaScalar(root["attention_dropout"])
                 << ": ob trains without dropout; ignored";
  }
  OB_RETURN_IF_ERROR(c.Validate());
  return c;
}

std::vector<double> RopeInverseFrequencies(const GptConfig& c) {
  const int d = c.head_dim();
  std::vector<double> f(d / 2);
  for (int i = 0; i < d / 2; ++i) {
    // As Hugging Face computes it, in fp32.
    const float e = static_cast<float>(2 * i) / static_cast<float>(d);
    f[i] = 1.0f / std::pow(static_cast<float>(c.rope_theta), e);
  }
  if (c.rope.type == "linear") {
    for (double& x : f) x /= c.rope.factor;
  } else if (c.rope.type == "llama3") {
    const double orig = c.rope.original_context, lo = c.rope.low_freq_factor, hi = c.rope.high_freq_factor;
    const double low_wavelen = orig / lo, high_wavelen = orig / hi;
    for (double& x : f) {
      const double wavelen = 2 * M_PI / x;
      if (wavelen > low_wavelen) {
        x /= c.rope.factor;
      } else if (wavelen >= high_wavelen) {
        const double a = (orig / wavelen - lo) / (hi - lo);
        x = (1 - a) * x / c.rope.factor + a * x;
      }
    }
  }
  return f;
}

}  // namespace ob::model
