#include "ob/ckpt/hf.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "ob/io/dir_lock.h"
#include "ob/io/file.h"
#include "ob/io/json.h"
#include "ob/io/message.h"
#include "ob/model/config.h"
#include "ob/model/llama_config.h"

namespace ob::ckpt {
namespace {

// The block parameters HuggingFace keeps as Conv1D, weight [in, out].
bool IsConv1DWeight(const std::string& param) {
  return param == "attn.c_attn.weight" || param == "attn.c_proj.weight" || param == "mlp.c_fc.weight" ||
         param == "mlp.c_proj.weight";
}

const char* const kBlockParams[] = {
    "ln_1.weight",      "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",      "ln_2.bias",
    "mlp.c_fc.weight",  "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};

// A [rows, cols] matrix of `elem`-byte elements, transposed.
std::vector<char> Transpose(const std::vector<char>& src, int64_t rows, int64_t cols, size_t elem) {
  std::vector<char> dst(src.size());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      std::memcpy(&dst[static_cast<size_t>(j * rows + i) * elem], &src[static_cast<size_t>(i * cols + j) * elem],
                  elem);
    }
  }
  return dst;
}

// The shape of every HuggingFace tensor of `m`, by HF name, in file order.
std::vector<std::pair<std::string, std::vector<int64_t>>> HfShapes(const pb::ModelConfig& m) {
  const int64_t h = m.n_embd(), v = m.vocab_size(), s = m.n_positions();
  std::vector<std::pair<std::string, std::vector<int64_t>>> out = {{"transformer.wte.weight", {v, h}},
                                                                   {"transformer.wpe.weight", {s, h}}};
  for (uint32_t i = 0; i < m.n_layer(); ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    out.push_back({p + "ln_1.weight", {h}});
    out.push_back({p + "ln_1.bias", {h}});
    out.push_back({p + "attn.c_attn.weight", {h, 3 * h}});
    out.push_back({p + "attn.c_attn.bias", {3 * h}});
    out.push_back({p + "attn.c_proj.weight", {h, h}});
    out.push_back({p + "attn.c_proj.bias", {h}});
    out.push_back({p + "ln_2.weight", {h}});
    out.push_back({p + "ln_2.bias", {h}});
    out.push_back({p + "mlp.c_fc.weight", {h, 4 * h}});
    out.push_back({p + "mlp.c_fc.bias", {4 * h}});
    out.push_back({p + "mlp.c_proj.weight", {4 * h, h}});
    out.push_back({p + "mlp.c_proj.bias", {h}});
  }
  out.push_back({"transformer.ln_f.weight", {h}});
  out.push_back({"transformer.ln_f.bias", {h}});
  return out;
}

// ob's name of a HuggingFace tensor of a model of `n_layer` blocks.
std::string ObName(const std::string& hf, uint32_t n_layer) {
  if (hf == "transformer.wte.weight") return "tied";
  if (hf == "transformer.wpe.weight") return "0.wpe.weight";
  if (hf.rfind("transformer.ln_f.", 0) == 0) return std::to_string(n_layer + 1) + "." + hf.substr(12);
  const std::string rest = hf.substr(std::strlen("transformer.h."));
  const size_t dot = rest.find('.');
  return std::to_string(std::stoi(rest.substr(0, dot)) + 1) + rest.substr(dot);
}

// The parameter name of an ob tensor name ("3.attn.c_attn.weight" -> "attn.c_attn.weight").
std::string Param(const std::string& ob) {
  const size_t dot = ob.find('.');
  return dot == std::string::npos ? ob : ob.substr(dot + 1);
}

// One tensor of a Hugging Face file: its name and shape there, its ob
// name, and whether the two are transposes (GPT-2's Conv1D).
struct HfTensor {
  std::string hf, ob;
  std::vector<int64_t> shape;
  bool transpose = false;
};

bool IsLlama(const pb::ModelConfig& m) { return m.family() == pb::FAMILY_LLAMA; }

// Every tensor of `m` in HF's file order. The Llama family (LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM):
//   model.embed_tokens.weight [V, h]            ob "tied", or "0.wte.weight" untied
//   model.layers.<i>.input_layernorm.weight      "<i+1>.ln_1.weight"
//   model.layers.<i>.self_attn.{q,k,v}_proj.weight (.bias: Qwen2)  "<i+1>.attn.…"
//   model.layers.<i>.self_attn.{q,k}_norm.weight (Qwen3)
//   model.layers.<i>.self_attn.o_proj.weight
//   model.layers.<i>.post_attention_layernorm.weight   "<i+1>.ln_2.weight"
//   model.layers.<i>.mlp.{gate,up,down}_proj.weight
//   model.norm.weight                            "<L+1>.ln_f.weight"
//   lm_head.weight [V, h] (untied only)          "<L+1>.lm_head.weight"
// all [out, in] as torch's Linear, as ob's: nothing is transposed.
std::vector<HfTensor> HfLayout(const pb::ModelConfig& m) {
  std::vector<HfTensor> out;
  const uint32_t L = m.n_layer();
  if (!IsLlama(m)) {
    for (auto& [hf, shape] : HfShapes(m)) {
      const std::string ob = ObName(hf, L);
      out.push_back({hf, ob, shape, IsConv1DWeight(Param(ob)) && ob != "tied"});
    }
    return out;
  }
  const int64_t h = m.n_embd(), v = m.vocab_size(), d = m.head_dim(), q = int64_t{m.n_head()} * d,
                kv = int64_t{m.n_kv_head()} * d, inner = m.intermediate_size();
  out.push_back({"model.embed_tokens.weight", m.untied() ? "0.wte.weight" : "tied", {v, h}});
  for (uint32_t i = 0; i < L; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".", o = std::to_string(i + 1) + ".";
    out.push_back({p + "input_layernorm.weight", o + "ln_1.weight", {h}});
    for (const auto& [name, rows] : {std::pair<std::string, int64_t>{"q_proj", q}, {"k_proj", kv}, {"v_proj", kv}}) {
      out.push_back({p + "self_attn." + name + ".weight", o + "attn." + name + ".weight", {rows, h}});
      if (m.qkv_bias()) out.push_back({p + "self_attn." + name + ".bias", o + "attn." + name + ".bias", {rows}});
    }
    if (m.qk_norm()) {
      out.push_back({p + "self_attn.q_norm.weight", o + "attn.q_norm.weight", {d}});
      out.push_back({p + "self_attn.k_norm.weight", o + "attn.k_norm.weight", {d}});
    }
    out.push_back({p + "self_attn.o_proj.weight", o + "attn.o_proj.weight", {h, q}});
    out.push_back({p + "post_attention_layernorm.weight", o + "ln_2.weight", {h}});
    out.push_back({p + "mlp.gate_proj.weight", o + "mlp.gate_proj.weight", {inner, h}});
    out.push_back({p + "mlp.up_proj.weight", o + "mlp.up_proj.weight", {inner, h}});
    out.push_back({p + "mlp.down_proj.weight", o + "mlp.down_proj.weight", {h, inner}});
  }
  out.push_back({"model.norm.weight", std::to_string(L + 1) + ".ln_f.weight", {h}});
  if (m.untied()) out.push_back({"lm_head.weight", std::to_string(L + 1) + ".lm_head.weight", {v, h}});
  return out;
}

// The shortest decimal that reads back as `x`.
std::string JsonReal(double x) {
  char buf[40];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

// A JSON object of (key, value text) pairs, one a line, as HF writes
// config.json.
std::string JsonObject(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string out = "{\n";
  for (size_t i = 0; i < fields.size(); ++i) {
    out += "  ";
    io::AppendJsonString(&out, fields[i].first);
    out += ": " + fields[i].second + (i + 1 < fields.size() ? ",\n" : "\n");
  }
  return out + "}\n";
}

std::string Quoted(const std::string& s) {
  std::string out;
  io::AppendJsonString(&out, s);
  return out;
}

std::string LlamaConfigJson(const pb::ModelConfig& m) {
  auto n = [](uint64_t v) { return std::to_string(v); };
  const std::string type = m.hf_model_type().empty() ? "llama" : m.hf_model_type();
  const std::string arch = type == "mistral" ? "MistralForCausalLM"
                           : type == "qwen2" ? "Qwen2ForCausalLM"
                           : type == "qwen3" ? "Qwen3ForCausalLM"
                                             : "LlamaForCausalLM";
  std::string rope = "null";
  if (m.rope_type() == "linear") {
    rope = "{\"rope_type\": \"linear\", \"factor\": " + JsonReal(m.rope_factor()) + "}";
  } else if (m.rope_type() == "llama3") {
    rope = "{\"rope_type\": \"llama3\", \"factor\": " + JsonReal(m.rope_factor()) + ", \"low_freq_factor\": " +
           JsonReal(m.rope_low_freq_factor()) + ", \"high_freq_factor\": " + JsonReal(m.rope_high_freq_factor()) +
           ", \"original_max_position_embeddings\": " + n(m.rope_original_context()) + "}";
  }
  return JsonObject({{"architectures", "[" + Quoted(arch) + "]"},
                     {"model_type", Quoted(type)},
                     {"vocab_size", n(m.vocab_size())},
                     {"hidden_size", n(m.n_embd())},
                     {"intermediate_size", n(m.intermediate_size())},
                     {"num_hidden_layers", n(m.n_layer())},
                     {"num_attention_heads", n(m.n_head())},
                     {"num_key_value_heads", n(m.n_kv_head())},
                     {"head_dim", n(m.head_dim())},
                     {"max_position_embeddings", n(m.n_positions())},
                     {"rope_theta", JsonReal(m.rope_theta())},
                     {"rope_scaling", rope},
                     {"rms_norm_eps", JsonReal(m.norm_eps())},
                     {"tie_word_embeddings", m.untied() ? "false" : "true"},
                     {"hidden_act", Quoted("silu")},
                     {"attention_bias", "false"},
                     {"attention_dropout", "0.0"},
                     {"mlp_bias", "false"},
                     {"use_sliding_window", "false"},
                     {"initializer_range", "0.02"},
                     {"torch_dtype", Quoted("float32")}});
}

std::string ConfigJson(const pb::ModelConfig& m) {
  auto n = [](uint64_t v) { return std::to_string(v); };
  return JsonObject({{"architectures", "[" + Quoted("GPT2LMHeadModel") + "]"},
                     {"model_type", Quoted("gpt2")},
                     {"vocab_size", n(m.vocab_size())},
                     {"n_positions", n(m.n_positions())},
                     {"n_ctx", n(m.n_positions())},
                     {"n_embd", n(m.n_embd())},
                     {"n_layer", n(m.n_layer())},
                     {"n_head", n(m.n_head())},
                     {"n_inner", "null"},
                     {"activation_function", Quoted("gelu_new")},
                     {"layer_norm_epsilon", "1e-05"},
                     {"tie_word_embeddings", "true"},
                     {"resid_pdrop", "0.0"},
                     {"embd_pdrop", "0.0"},
                     {"attn_pdrop", "0.0"},
                     {"initializer_range", "0.02"},
                     {"bos_token_id", n(m.vocab_size() - 1)},
                     {"eos_token_id", n(m.vocab_size() - 1)},
                     {"torch_dtype", Quoted("float32")}});
}

// The fp32 value of an IEEE half (F16) or a bfloat16 (BF16): exact, as
// every value of either is one of fp32's.
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf, NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;  // ±0
  } else {  // subnormal: normalise
    exp = 113;
    while ((man & 0x400u) == 0) man <<= 1, --exp;
    bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A tensor's bytes as fp32 (F32 as it is; F16 and BF16 widened exactly);
// kDataErr for any other dtype, and for a value that is not finite (a model
// holding one cannot train: its first loss would be NaN).
Result<std::vector<char>> AsFloat32(std::vector<char> bytes, DType dtype, const std::string& what) {
  if (dtype != DType::kF32) {
    if (dtype != DType::kF16 && dtype != DType::kBF16)
      return Status::DataErr(what + " is " + DTypeName(dtype) + "; ob imports F32, F16 or BF16");
    std::vector<char> wide(bytes.size() * 2);
    for (size_t i = 0; i < bytes.size() / 2; ++i) {
      uint16_t h;
      std::memcpy(&h, &bytes[2 * i], 2);
      float f;
      if (dtype == DType::kBF16) {
        const uint32_t bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(&f, &bits, 4);
      } else {
        f = HalfToFloat(h);
      }
      std::memcpy(&wide[4 * i], &f, 4);
    }
    bytes = std::move(wide);
  }
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < bytes.size() / 4; ++i) {
    float f;
    std::memcpy(&f, &bytes[4 * i], 4);
    if (!std::isfinite(f) && bad++ == 0) first = i;
  }
  if (bad > 0) {
    return Status::DataErr(what + " holds " + std::to_string(bad) + " value(s) that are not finite (the first at element " +
                           std::to_string(first) + ")");
  }
  return bytes;
}

}  // namespace

Status ExportHf(const std::string& ckpt_path, const std::string& out_dir, const Progress& progress,
                uint64_t max_shard_bytes) {
  OB_RETURN_IF_ERROR(Verify(ckpt_path, progress));
  OB_ASSIGN_OR_RETURN(pb::Manifest m, LoadManifest(ckpt_path));
  const pb::ModelConfig& model = m.model();
  if (model.n_layer() == 0) return Status::DataErr(ckpt_path + ": the manifest names no model");
  // Every weight of the checkpoint by ob name, from whichever file holds it.
  std::map<std::string, std::pair<std::string, SafetensorsEntry>> where;
  std::map<std::string, SafetensorsHeader> headers;
  for (const auto& f : m.files()) {
    const std::string path = io::JoinPath(ckpt_path, f.path());
    OB_ASSIGN_OR_RETURN(SafetensorsHeader h, ReadSafetensorsHeader(path));
    for (const auto& e : h.tensors) {
      if (IsMoment(e.name)) continue;
      where[e.name] = {path, e};
    }
    headers[path] = std::move(h);
  }
  std::vector<std::vector<char>> buffers;
  std::vector<TensorView> views;
  const auto layout = HfLayout(model);
  buffers.reserve(layout.size());
  for (const HfTensor& t : layout) {
    auto it = where.find(t.ob);
    if (it == where.end()) return Status::DataErr(ckpt_path + ": no tensor " + t.ob + " (for " + t.hf + ")");
    const auto& [path, e] = it->second;
    std::vector<int64_t> want = t.shape;
    if (t.transpose) std::swap(want[0], want[1]);
    if (e.shape != want) return Status::DataErr(path + ": " + t.ob + " is not of " + t.hf + "'s shape");
    std::vector<char> bytes(e.end - e.begin);
    OB_RETURN_IF_ERROR(ReadTensor(path, headers.at(path), e, bytes.data()));
    if (t.transpose) bytes = Transpose(bytes, e.shape[0], e.shape[1], DTypeSize(e.dtype));
    buffers.push_back(std::move(bytes));
    views.push_back({t.hf, e.dtype, t.shape, buffers.back().data(), buffers.back().size()});
    where.erase(it);
  }
  for (const auto& [name, w] : where) {
    // A tied head's own copy (a stage holding the head but not the embed
    // saves none; older checkpoints may): the token table, not written.
    if (!model.untied() && name == std::to_string(model.n_layer() + 1) + ".lm_head.weight") continue;
    return Status::DataErr(w.first + ": tensor " + name + " has no place in the model");
  }
  OB_RETURN_IF_ERROR(io::MakeDirs(out_dir, "export directory"));
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"ob.step", std::to_string(m.step())}};
  // Shards of at most max_shard_bytes, tensors in file order (one larger
  // than that alone), as Hugging Face's save_pretrained cuts them.
  std::vector<std::vector<TensorView>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (const TensorView& v : views) {
    if (max_shard_bytes > 0 && !shards.back().empty() && in_shard + v.bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(v);
    in_shard += v.bytes;
    total += v.bytes;
  }
  // Nothing of an earlier export left to mix with this one.
  for (const char* stale : {"model.safetensors", "model.safetensors.index.json"}) {
    ::unlink(io::JoinPath(out_dir, stale).c_str());
  }
  if (shards.size() == 1) {
    OB_RETURN_IF_ERROR(WriteSafetensors(io::JoinPath(out_dir, "model.safetensors"), views, meta, nullptr, nullptr));
  } else {
    std::string index = "{\n  \"metadata\": {\"total_size\": " + std::to_string(total) + "},\n  \"weight_map\": {";
    for (size_t i = 0; i < shards.size(); ++i) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      OB_RETURN_IF_ERROR(WriteSafetensors(io::JoinPath(out_dir, name), shards[i], meta, nullptr, nullptr));
      for (const TensorView& v : shards[i]) {
        index += std::string(i == 0 && &v == &shards[i].front() ? "\n    " : ",\n    ");
        io::AppendJsonString(&index, v.name);
        index += ": \"" + std::string(name) + "\"";
      }
    }
    index += "\n  }\n}\n";
    OB_RETURN_IF_ERROR(io::WriteFile(io::JoinPath(out_dir, "model.safetensors.index.json"), index));
  }
  return io::WriteFile(io::JoinPath(out_dir, "config.json"), IsLlama(model) ? LlamaConfigJson(model) : ConfigJson(model));
}

Result<std::vector<std::string>> HfWeightFiles(const std::string& dir) {
  const std::string single = io::JoinPath(dir, "model.safetensors"), index = io::JoinPath(dir, "model.safetensors.index.json");
  if (::access(single.c_str(), F_OK) == 0) return std::vector<std::string>{single};
  if (::access(index.c_str(), F_OK) != 0) {
    return Status::NoInput(dir + ": no model.safetensors and no model.safetensors.index.json");
  }
  OB_ASSIGN_OR_RETURN(std::string text, io::ReadFile(index));
  std::vector<std::string> files;
  try {
    const YAML::Node map = YAML::Load(text)["weight_map"];
    if (!map || !map.IsMap() || map.size() == 0) return Status::DataErr(index + ": no weight_map of tensor names to files");
    std::set<std::string> seen;
    for (const auto& kv : map) {
      const std::string f = kv.second.as<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
        return Status::DataErr(index + ": weight_map names '" + f + "', not a file of this directory");
      }
      if (seen.insert(f).second) files.push_back(io::JoinPath(dir, f));
    }
  } catch (const YAML::Exception& e) {
    return Status::DataErr(index + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  return files;
}

Result<pb::ModelConfig> ReadHfConfig(const std::string& config_json) {
  // The checks ob-profile --model makes of the same file (model/config.h):
  // its shape, and nothing that asks for another architecture.
  OB_ASSIGN_OR_RETURN(std::string text, io::ReadFile(config_json));
  Result<model::GptConfig> c = model::ParseConfig(text, config_json);
  if (!c.ok()) {
    return c.status().code() == Code::kConfig ? Status::DataErr(c.status().message()) : c.status();
  }
  pb::ModelConfig m = c->ToProto();
  m.clear_name();
  return m;
}

Status ImportHf(const std::string& config_json, const std::vector<std::string>& files, const pb::ModelConfig& model,
                const std::string& dir, int64_t step, const Progress& progress) {
  OB_ASSIGN_OR_RETURN(pb::ModelConfig hf_model, ReadHfConfig(config_json));
  pb::ModelConfig shape = model;
  shape.clear_name();
  if (shape.SerializeAsString() != hf_model.SerializeAsString()) {
    return Status::DataErr(config_json + ": its shape (" + hf_model.ShortDebugString() + ") is not " +
                           model.name() + "'s (" + shape.ShortDebugString() + ")");
  }
  if (step < 0) return Status::Usage("--step must not be negative");
  if (files.empty()) return Status::NoInput(config_json + ": no safetensors file beside it");
  const bool llama = IsLlama(model);
  std::vector<SafetensorsHeader> headers(files.size());
  struct Found {
    size_t file;
    const SafetensorsEntry* e;
  };
  std::map<std::string, Found> by_name;  // HF names (GPT-2's "transformer." prefixed)
  for (size_t f = 0; f < files.size(); ++f) {
    OB_ASSIGN_OR_RETURN(headers[f], ReadSafetensorsHeader(files[f]));
    for (const auto& e : headers[f].tensors) {
      std::string name = e.name;
      if (!llama) {
        if (name.rfind("transformer.", 0) != 0 && name != "lm_head.weight") name = "transformer." + name;
        const size_t attn = name.rfind(".attn.");
        if (attn != std::string::npos && (name.compare(attn, std::string::npos, ".attn.bias") == 0 ||
                                          name.compare(attn, std::string::npos, ".attn.masked_bias") == 0)) {
          continue;  // causal masks, not weights
        }
      } else if (name.size() > 15 && name.compare(name.size() - 15, 15, ".rotary_emb.inv_freq") == 0) {
        continue;  // older Llama files carry the rotation's frequencies: not weights
      }
      if (!by_name.emplace(name, Found{f, &e}).second) {
        return Status::DataErr(files[f] + ": tensor " + e.name + " is in " + files[by_name.at(name).file] + " too");
      }
    }
  }
  auto read = [&](const Found& found) -> Result<std::vector<char>> {
    const SafetensorsEntry& e = *found.e;
    const std::string& path = files[found.file];
    if (e.dtype != DType::kF32 && e.dtype != DType::kF16 && e.dtype != DType::kBF16) {
      return Status::DataErr(path + ": " + e.name + " is " + DTypeName(e.dtype) + "; ob imports F32, F16 or BF16");
    }
    std::vector<char> raw(e.end - e.begin);
    OB_RETURN_IF_ERROR(ReadTensor(path, headers[found.file], e, raw.data()));
    return AsFloat32(std::move(raw), e.dtype, path + ": " + e.name);
  };
  const uint32_t L = model.n_layer();
  std::vector<std::vector<TensorView>> layers(L + 2);
  std::vector<std::map<std::string, std::string>> metadata(L + 2);
  std::vector<std::vector<char>> buffers;
  const auto layout = HfLayout(model);
  buffers.reserve(3 * layout.size());
  std::vector<char> wte;
  // Progress: the layout's bytes read, then the weights and their two
  // moments written, fp32.
  uint64_t done = 0, total = 0;
  for (const HfTensor& t : layout) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(std::max<int64_t>(d, 0));
    if (auto it = by_name.find(t.hf); it != by_name.end()) total += it->second.e->end - it->second.e->begin;
    total += 12 * numel;
  }
  for (const HfTensor& t : layout) {
    auto it = by_name.find(t.hf);
    if (it == by_name.end()) return Status::DataErr(files.front() + ": no tensor " + t.hf);
    const SafetensorsEntry& e = *it->second.e;
    if (e.shape != t.shape) {
      return Status::DataErr(files[it->second.file] + ": " + e.name + " is not of " +
                             (llama ? model.hf_model_type() : std::string("GPT-2")) + "'s shape");
    }
    OB_ASSIGN_OR_RETURN(std::vector<char> bytes, read(it->second));
    done += e.end - e.begin;
    if (progress) progress(done, total);
    std::vector<int64_t> shape = t.shape;
    if (t.transpose) {
      bytes = Transpose(bytes, t.shape[0], t.shape[1], 4);
      std::swap(shape[0], shape[1]);
    }
    if (t.ob == "tied") wte = bytes;
    const int layer = t.ob == "tied" ? 0 : std::stoi(t.ob.substr(0, t.ob.find('.')));
    buffers.push_back(std::move(bytes));
    const uint64_t n = buffers.back().size();
    layers[layer].push_back({t.ob, DType::kF32, shape, buffers.back().data(), n});
    for (const char* moment : {".exp_avg", ".exp_avg_sq"}) {  // AdamW starts afresh
      buffers.emplace_back(n, 0);
      layers[layer].push_back({t.ob + moment, DType::kF32, shape, buffers.back().data(), n});
    }
    metadata[layer][t.ob + ".adam_step"] = "0";
    by_name.erase(it);
  }
  for (const auto& [name, found] : by_name) {
    if (name == "lm_head.weight" && !model.untied()) {  // tied: must be the embedding
      std::vector<char> head;
      if (found.e->shape == std::vector<int64_t>{model.vocab_size(), model.n_embd()}) {
        OB_ASSIGN_OR_RETURN(head, read(found));
      }
      if (head != wte) return Status::DataErr(files[found.file] + ": lm_head.weight is not the embedding (untied)");
      continue;
    }
    return Status::DataErr(files[found.file] + ": tensor " + found.e->name + " has no place in " +
                           (llama ? "a " + model.hf_model_type() + " model" : std::string("a GPT-2 model")));
  }
  OB_RETURN_IF_ERROR(io::MakeDirs(dir, "checkpoint directory"));
  OB_ASSIGN_OR_RETURN(io::DirLock lock, io::DirLock::Acquire(dir, "ob-ckpt import"));
  if (::access(StepPath(dir, step).c_str(), F_OK) == 0) {
    return Status::Config(StepPath(dir, step) + ": exists; import into another directory or --step");
  }
  OB_RETURN_IF_ERROR(BeginStep(dir, step));
  pb::Manifest part;
  for (uint32_t layer = 0; layer < L + 2; ++layer) {
    metadata[layer]["step"] = std::to_string(step);
    OB_ASSIGN_OR_RETURN(pb::CheckpointFile f, WriteLayer(dir, step, static_cast<int>(layer), layers[layer],
                                                         metadata[layer]));
    *part.add_files() = f;
    for (const TensorView& v : layers[layer]) done += v.bytes;
    if (progress) progress(std::min(done, total), total);
  }
  OB_RETURN_IF_ERROR(WritePart(dir, step, 0, part));
  pb::Manifest base;
  base.set_format_version(io::kManifestFormatVersion);
  *base.mutable_model() = model;
  return Commit(dir, step, base, static_cast<int>(L + 2)).status();
}

}  // namespace ob::ckpt
