// The Llama family's shapes (design/model.md): presets with the published shapes
// of Llama 3 and Qwen3, Hugging Face config.json files of model_type
// llama, mistral, qwen2 and qwen3, and the rotary frequencies they imply.
// Torch-free; the layers are llama.h's.
//
// What a config.json may ask that ob does not build is refused with
// kConfig naming the file and the field: mixtures of experts, sliding
// windows, an activation other than silu, biases other than Qwen2's q/k/v
// ones, rope scaling other than linear and llama3 (yarn, dynamic, longrope
// are named and refused). Dropout, which ob does not apply, is warned of.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ob/model/config.h"
#include "ob/status.h"

namespace YAML {
class Node;
}

namespace ob::model {

// llama-tiny, qwen3-tiny (tests: GQA with fewer kv heads than heads),
// llama3-tiny (llama-tiny's blocks, Llama 3's vocabulary), then
// llama3.2-1b, llama3.2-3b, llama3.1-8b, llama3.1-70b, llama3.1-405b,
// qwen3-0.6b, qwen3-8b, qwen3-32b.
const std::vector<std::string>& LlamaPresetNames();
std::optional<GptConfig> LlamaPreset(const std::string& name);

// The family's own checks (Validate calls it): heads a multiple of kv
// heads, an even head size, positive widths, a known rope type with
// sensible factors, a positive epsilon.
Status ValidateLlama(const GptConfig& c, const std::string& who);

// Whether a config.json's model_type is one of the family's.
bool IsLlamaFamily(const YAML::Node& root);
// Reads such a config.json (`path` names it in messages).
Result<GptConfig> ParseLlamaConfig(const YAML::Node& root, const std::string& path);

// The rotary inverse frequencies, d/2 of them, as Hugging Face computes
// them: 1 / theta^(2i/d), divided by the factor for "linear"; for
// "llama3", wavelengths 2π/f above original/low_freq_factor divided by the
// factor, below original/high_freq_factor kept, and in between the smooth
// blend (1 - a)·f/factor + a·f with a = (original/wavelength - low) /
// (high - low).
std::vector<double> RopeInverseFrequencies(const GptConfig& c);

}  // namespace ob::model
