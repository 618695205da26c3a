// Fuzz target: GPT-2's BPE (ob::data): the pre-tokenizer on any bytes, and
// vocab.json / merges.txt text. The input is VOCAB \0 MERGES \0 TEXT (parts
// missing are empty).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ob/data/bpe.h"

namespace {

std::vector<std::string> Pieces(std::string_view text, size_t cut) {
  std::vector<std::string> out;
  std::string pending;
  auto emit = [&](std::string_view p) {
    if (p.empty()) __builtin_trap();
    out.emplace_back(p);
  };
  for (size_t i = 0; i < text.size(); i += cut) {
    pending.append(text.substr(i, cut));
    pending.erase(0, ob::data::PreTokenize(pending, false, emit));
  }
  if (ob::data::PreTokenize(pending, true, emit) != pending.size()) __builtin_trap();
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::string part[3];
  for (size_t i = 0, k = 0; i < input.size(); ++i) {
    if (input[i] == '\0' && k < 2) ++k;
    else part[k].push_back(input[i]);
  }
  // Pre-tokens cover the text exactly, and where it is cut does not matter.
  const std::string& text = part[2].empty() ? input : part[2];
  const auto whole = Pieces(text, text.size() + 1);
  std::string joined;
  for (const auto& p : whole) joined += p;
  if (joined != text) __builtin_trap();
  if (text.size() < 512 && Pieces(text, 3) != whole) __builtin_trap();

  auto bpe = ob::data::Bpe::Parse(part[0], "v.json", part[1], "m.txt");
  if (!bpe.ok()) {
    const std::string& m = bpe.status().message();
    if (m.rfind("v.json", 0) != 0 && m.rfind("m.txt", 0) != 0) __builtin_trap();
    return 0;
  }
  // Whatever loads encodes any text into ids whose bytes are the text.
  ob::data::Encoder enc(*bpe);
  enc.Add(text);
  enc.End();
  std::string back;
  for (uint32_t id : enc.ids()) back += bpe->Bytes(id);
  if (back != text) __builtin_trap();
  return 0;
}
