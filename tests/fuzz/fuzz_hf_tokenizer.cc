// Fuzz target: a Hugging Face tokenizer.json (ob::data::HfTokenizer) and
// the streaming encoder over any text. The input is TOKENIZER_JSON \0 TEXT.
// A file that parses must encode any bytes without crashing, give the same
// ids however the text is cut into Add() calls, and give ids below its
// vocabulary size; decoding them must not crash.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ob/data/hf_tokenizer.h"

namespace {

std::vector<uint32_t> Encode(const ob::data::HfTokenizer& tok, std::string_view text, size_t cut) {
  ob::data::HfEncoder enc(tok);
  for (size_t i = 0; i < text.size(); i += cut) enc.Add(text.substr(i, cut));
  enc.End();
  if (!enc.status().ok()) return {};
  return enc.ids();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t zero = input.find('\0');
  const std::string json = input.substr(0, zero);
  const std::string text = zero == std::string::npos ? std::string("Hello, world! 123 'll") : input.substr(zero + 1);
  auto tok = ob::data::HfTokenizer::Parse(json, "fuzz.json", "", "");
  if (!tok.ok()) return 0;
  const auto whole = Encode(*tok, text, text.size() + 1);
  if (Encode(*tok, text, 3) != whole) __builtin_trap();
  for (uint32_t id : whole) {
    if (id >= tok->vocab_size()) __builtin_trap();
    (void)tok->Bytes(id);
  }
  return 0;
}
