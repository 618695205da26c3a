// Fuzz target: model config files, JSON or YAML (ob::model::ParseConfig).
#include <cstdint>
#include <string>

#include "ob/model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto c = ob::model::ParseConfig(text, "fuzz.yaml");
  if (c.ok()) {
    if (!c->Validate().ok()) __builtin_trap();  // accepted configs are valid
  } else if (c.status().code() != ob::Code::kConfig) {
    __builtin_trap();
  }
  return 0;
}
