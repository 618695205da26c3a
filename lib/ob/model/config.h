// GptConfig: the shape of a GPT (design/model.md), from a preset name or a
// HuggingFace-style config.json / YAML file, and the design/formulas.md formulas that
// depend only on the shape. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ob/model.pb.h"
#include "ob/status.h"

namespace ob::model {

// The two families (model.proto ModelFamily): GPT-2's, and Llama's (Llama 3,
// Mistral, Qwen2, Qwen3 as Hugging Face defines them).
enum class Family { kGpt2, kLlama };

// Rotary position scaling (HF rope_scaling / rope_parameters).
struct RopeScaling {
  std::string type;              // "" (none), "linear" or "llama3"
  double factor = 1;
  double low_freq_factor = 1;    // llama3
  double high_freq_factor = 4;   // llama3
  int original_context = 8192;   // llama3: original_max_position_embeddings
};

struct GptConfig {
  std::string name;         // preset name or source file
  int n_layer = 0;          // L
  int n_embd = 0;           // h
  int n_head = 0;           // a (query heads H)
  int n_positions = 0;      // s (context length)
  int vocab_size = 0;       // V

  // The Llama family's own fields (GPT-2 leaves them at these defaults).
  Family family = Family::kGpt2;
  int n_kv_head = 0;        // K; 0: n_head
  int head_size = 0;        // d; 0: n_embd / n_head
  int n_inner = 0;          // MLP width; 0: 4 n_embd
  double rope_theta = 10000;
  RopeScaling rope;
  double norm_eps = 1e-5;
  bool tied = true;         // the LM head is the token table
  bool qkv_bias = false;    // Qwen2
  bool qk_norm = false;     // Qwen3
  std::string hf_type;      // "llama", "mistral", "qwen2", "qwen3"

  bool llama() const { return family == Family::kLlama; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int head_dim() const { return head_size > 0 ? head_size : n_embd / n_head; }
  int mlp_width() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
  // The sequence length a profile trains at unless told (--seq-len):
  // GPT-2's context; for the Llama family at most 8,192, Llama 3's
  // pre-training length (its 131,072-token context is reached by a later
  // long-context stage, and no GPU holds a 70B block's activations at it).
  int default_seq_len() const { return llama() && n_positions > 8192 ? 8192 : n_positions; }
  // `given` when one was given (> 0, e.g. --seq-len), else default_seq_len().
  int seq_len_or_default(int given) const { return given > 0 ? given : default_seq_len(); }

  // Planner layers: embed, block 0..L-1, head.
  int num_layers() const { return n_layer + 2; }

  pb::ModelConfig ToProto() const;
  static GptConfig FromProto(const pb::ModelConfig& p);
  // Checks the shape: every field positive, n_embd divisible by n_head
  // (GPT-2), the heads by the kv heads and an even head size (Llama), at
  // most kMaxLayers blocks.
  Status Validate() const;
  // A profile holds a record per layer and ob-plan's search grows faster
  // than the square of the layers (4000: 98 s for 4 hosts on a 2-core
  // machine): a depth past this is a typo, not a model (the deepest
  // published GPTs have a few hundred blocks).
  static constexpr int kMaxLayers = 4096;
};

// Names of all presets in design/model.md order: gpt-tiny, the GPT-2 family, the
// GPT-3 family, then llama-tiny, qwen3-tiny, Llama 3 and Qwen3, each by size.
const std::vector<std::string>& PresetNames();

// A preset by name ("gpt-tiny", "gpt2", ..., "gpt3-175b"); kConfig if unknown,
// with the list of known names in the message.
Result<GptConfig> Preset(const std::string& name);

// Parses a config.json (n_layer, n_embd, n_head, n_positions, vocab_size;
// HuggingFace's GPT-2 key names) or YAML file with the same keys; a
// config.json whose model_type is llama, mistral, qwen2 or qwen3 is read
// as the Llama family (llama_config.h). A missing,
// non-integer, zero or negative field is kConfig naming file and field; an
// unreadable file is kNoInput. So is a key given twice (which one was
// meant?), and a HuggingFace key that asks for another architecture than
// the GPT-2 ob trains (model_type other than gpt2, activation_function
// other than gelu_new/gelu_pytorch_tanh, n_inner other than 4 x n_embd,
// untied embeddings, layer_norm_epsilon other than 1e-5, unscaled or
// layer-scaled attention, cross-attention): a run would train another model
// than the file describes. Dropout (resid_pdrop, embd_pdrop, attn_pdrop),
// which ob does not apply, is warned of. Other keys are ignored.
Result<GptConfig> LoadConfigFile(const std::string& path);

// The same from the text of such a file; `path` names it in messages.
Result<GptConfig> ParseConfig(const std::string& text, const std::string& path);

// Preset name or path to a .json/.yaml/.yml file.
Result<GptConfig> ResolveModel(const std::string& name_or_path);

// --- design/formulas.md shape formulas -------------------------------------------------

// A block's parameters. GPT-2: 12h^2 + 13h. Llama: q and o 2·h·H·d, k and v
// 2·h·K·d, the MLP 3·h·I, two norms 2h (+ (H + 2K)·d biases, + 2d q/k norms).
int64_t BlockParams(const GptConfig& c);
// GPT-2: V*h + s*h (token and position tables); Llama: V*h.
int64_t EmbeddingParams(const GptConfig& c);
// The head's own: its final norm (GPT-2 2h, Llama h), plus V*h when the LM
// head is untied (otherwise it is the token table, counted in the embed).
int64_t HeadOwnParams(const GptConfig& c);
// design/formulas.md total: V*h + s*h + L*(12h^2 + 13h) for GPT-2; embed + blocks +
// an untied LM head for Llama.
int64_t FormulaParams(const GptConfig& c);
// Exact count of unique parameters of the model ob builds: the formula plus
// the final LayerNorm; the tied embedding is counted once.
int64_t ExactParams(const GptConfig& c);

// How `a` is another architecture than `b`: "n_head 8 here, 4 there"
// for each field that differs ("here" and "there" as the caller names
// them), "" when they are one model. The name is not compared: it is a
// preset's, or the path of the config file it came from, which a copy of
// the file or another working directory changes.
std::string ArchitectureDifference(const pb::ModelConfig& a, const pb::ModelConfig& b, const std::string& here,
                                   const std::string& there);

// The arithmetic of a run. kBf16: bf16 autocast for forward and backward
// (matmuls, attention, the residual stream and the layer norms in bf16,
// the norms' statistics, other reductions and the loss in fp32) over fp32
// master weights; gradients are accumulated and all-reduced in fp32; AdamW
// state stays fp32; activations and their gradients cross stage boundaries
// in bf16. kFp32: everything fp32.
enum class Precision { kFp32, kBf16 };

// "fp32" / "bf16"; the profile's dtype names ("float32", "bfloat16") too.
const char* PrecisionName(Precision p);        // "fp32" or "bf16"
const char* PrecisionDtype(Precision p);       // "float32" or "bfloat16" (Profile.dtype)
// Parses "fp32", "float32", "bf16" or "bfloat16"; kUsage otherwise.
Result<Precision> ParsePrecision(const std::string& name);

}  // namespace ob::model
