// Shared by every fuzz target: route library logs (protobuf's complaints
// about what it rejects) away from stderr, as the tools do.
#include "ob/log.h"

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  ob::log::Init("fuzz");
  return 0;
}
