#include "ob/launch/worker/heap.h"

#include <malloc.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace ob::launch {

bool KeepFreedMemory() {
  for (const char* var : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"}) {
    if (std::getenv(var) != nullptr) return false;
  }
  if (const char* t = std::getenv("GLIBC_TUNABLES"); t != nullptr && std::strstr(t, "glibc.malloc.") != nullptr)
    return false;
#if defined(__GLIBC__)
  // Every block from the heap (none mapped on its own), and the heap's
  // free top never given back.
  return ::mallopt(M_MMAP_MAX, 0) == 1 && ::mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1;
#else
  return false;
#endif
}

}  // namespace ob::launch
