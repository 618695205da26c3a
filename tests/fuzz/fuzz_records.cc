// Fuzz target: delimited Metrics streams (ob::io::RecordReader).
#include <cstdint>
#include <string>

#include "ob/io/records.h"
#include "ob/metrics.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = ob::io::RecordReader::FromString(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  ob::pb::Metrics m;
  for (int i = 0; i < 100000; ++i) {
    auto got = r.Next(&m);
    if (!got.ok()) {
      // Damage is reported with the stream's name, the record and the offset.
      if (got.status().message().rfind("fuzz: record ", 0) != 0) __builtin_trap();
      break;
    }
    if (!*got) break;
  }
  return 0;
}
