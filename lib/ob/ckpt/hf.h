// Checkpoints in HuggingFace's layout, in and out (ob-ckpt export --format
// hf, ob-ckpt import): GPT-2's (below), and the Llama family's
// (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
// Qwen3ForCausalLM: names in hf.cc HfLayout, nothing transposed; a tied
// model's lm_head.weight is not written, and on import must be the
// embedding if present; sharded files with their index are read).
//
// HuggingFace's GPT2LMHeadModel saves model.safetensors with
//   transformer.wte.weight [V, h]          ob layer 0 "tied"
//   transformer.wpe.weight [s, h]          ob layer 0 "0.wpe.weight"
//   transformer.h.<i>.ln_1.{weight,bias}   ob layer i+1 "<i+1>.ln_1.…"
//   transformer.h.<i>.attn.c_attn.{weight [h, 3h], bias}
//   transformer.h.<i>.attn.c_proj.{weight [h, h], bias}
//   transformer.h.<i>.ln_2.{weight,bias}
//   transformer.h.<i>.mlp.c_fc.{weight [h, 4h], bias}
//   transformer.h.<i>.mlp.c_proj.{weight [4h, h], bias}
//   transformer.ln_f.{weight,bias}         ob layer L-1 "<L-1>.ln_f.…"
// and config.json (model_type gpt2, n_layer, n_embd, n_head, n_positions,
// vocab_size, activation gelu_new, layer_norm_epsilon 1e-5, tied
// embeddings). Its linear layers are Conv1D, weight [in, out]; ob's are
// torch Linear, [out, in]: the four matrices of a block are transposed
// both ways. The LM head is the embedding (tied): not written; on import a
// lm_head.weight that is not the embedding is refused, and the causal-mask
// buffers some exports carry (attn.bias, attn.masked_bias) are skipped.
// Names without the "transformer." prefix (GPT2Model's) are read too.
//
// Export writes the weights only; import writes an ob checkpoint of step
// `step` (the state after that step: --resume trains from step + 1) with
// zero Adam moments and step counts (AdamW starts afresh), whose manifest
// names `model` (an ob preset or config of the same shape, so that a plan
// for it resumes from the checkpoint). Round trip: export then import gives
// every weight bit for bit. Only F32 tensors (GPT-2's own); others are
// kDataErr naming the tensor.
//
// Torch-free. Errors name the file: kNoInput (missing), kDataErr (not
// GPT-2, a missing or misshapen tensor), kIoErr.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ob/ckpt/checkpoint.h"
#include "ob/model.pb.h"
#include "ob/status.h"

namespace ob::ckpt {

// Writes OUT_DIR/model.safetensors and OUT_DIR/config.json from the
// checkpoint at `ckpt_path` (every checksum checked; nothing left on error).
// Above `max_shard_bytes` (0: never) the weights go to shards
// model-00001-of-0000N.safetensors with model.safetensors.index.json
// ({"metadata": {"total_size"}, "weight_map"}), as HF's save_pretrained
// writes them; a model.safetensors or index of an earlier export there is
// removed first.
Status ExportHf(const std::string& ckpt_path, const std::string& out_dir, const Progress& progress = {},
                uint64_t max_shard_bytes = 0);

// Reads HF_DIR/config.json and HF_DIR/model.safetensors (or the files
// named) and commits them as step `step` under the checkpoint root `dir`.
// kDataErr when config.json's shape is not `model`'s.
// `files`: model.safetensors, or the shards model.safetensors.index.json
// names (HfWeightFiles); a tensor in two of them is kDataErr.
// `progress` gets the bytes read and written so far of all.
Status ImportHf(const std::string& config_json, const std::vector<std::string>& files, const pb::ModelConfig& model,
                const std::string& dir, int64_t step, const Progress& progress = {});

// The weight files of HF directory `dir`: dir/model.safetensors, else the
// files dir/model.safetensors.index.json's weight_map names (each once, in
// the order of first mention; kDataErr naming the index when malformed or
// when a name leaves the directory), else kNoInput.
Result<std::vector<std::string>> HfWeightFiles(const std::string& dir);

// The model config.json describes (name "", for the caller to match).
Result<pb::ModelConfig> ReadHfConfig(const std::string& config_json);

}  // namespace ob::ckpt
