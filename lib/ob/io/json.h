// JSON by hand where protobuf's JSON mapping does not fit (the safetensors
// header, ob-watch's JSON lines, GPT-2's vocab.json). Torch-free, pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ob::io {

// Appends `s` to `out` as a JSON string literal: quotes, backslash, and
// control characters escaped (\n \r \t, others as \u00XX); other bytes,
// UTF-8 included, as they are.
void AppendJsonString(std::string* out, const std::string& s);

// Reads the JSON string literal that starts at text[*at] into `out` (UTF-8;
// \u escapes and surrogate pairs decoded) and moves *at past its closing
// quote. Returns "" on success, else what is wrong ("unterminated string",
// "bad \u escape", ...), with *at at the offending byte.
std::string ReadJsonString(const std::string& text, size_t* at, std::string* out);

// Appends code point `cp` to `out` as UTF-8.
void AppendUtf8(std::string* out, uint32_t cp);

}  // namespace ob::io
