// Writing JSON by hand where protobuf's JSON mapping does not fit (the
// safetensors header, ob-watch's JSON lines). Torch-free, pure.
#pragma once

#include <string>

namespace ob::io {

// Appends `s` to `out` as a JSON string literal: quotes, backslash, and
// control characters escaped (\n \r \t, others as \u00XX); other bytes,
// UTF-8 included, as they are.
void AppendJsonString(std::string* out, const std::string& s);

}  // namespace ob::io
