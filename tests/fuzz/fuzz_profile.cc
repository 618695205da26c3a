// Fuzz target: Profile files (ob::io::ParseMessage) and their tables.
#include <cstdint>
#include <string>

#include "ob/io/message.h"
#include "ob/profile.pb.h"
#include "ob/profile/table.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ob::pb::Profile p;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  auto st = ob::io::ParseMessage(bytes, "fuzz.pb", ob::io::kProfileFormatVersion, &p);
  if (st.ok()) {
    (void)ob::profile::FormatProfile(p);  // must not crash on any accepted profile
    (void)ob::io::ToJson(p);
  } else if (st.code() != ob::Code::kDataErr || st.message().rfind("fuzz.pb: ", 0) != 0) {
    __builtin_trap();
  }
  return 0;
}
