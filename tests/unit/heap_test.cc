// launch/worker/heap.h: a worker's heap keeps what it frees (no page
// faults for the next step's tensors), unless the environment chose.
// Each case runs in a forked child, whose malloc settings this process
// does not share.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ob/launch/worker/heap.h"

namespace {

uint64_t HeapTestResidentKiB() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "VmRSS:", 6) == 0) kib = std::strtoull(line + 6, nullptr, 10);
  }
  std::fclose(f);
  return kib;
}

// In a child: the environment variable `var` set (or none), then
// KeepFreedMemory; 64 MiB allocated, written and freed. Exit 0 when the call
// said `changed` and the freed memory stayed resident exactly when it did;
// 1 and 2 name the mismatch.
int HeapTestChild(const char* var, bool changed) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (const char* v : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                          "GLIBC_TUNABLES"})
      ::unsetenv(v);
    if (var != nullptr) ::setenv(var, var[0] == 'G' ? "glibc.malloc.trim_threshold=1" : "1", 1);
    if (ob::launch::KeepFreedMemory() != changed) ::_exit(1);
    constexpr size_t kBytes = size_t{64} << 20;
    auto* p = static_cast<volatile char*>(std::malloc(kBytes));
    for (size_t i = 0; i < kBytes; i += 4096) p[i] = 1;
    const uint64_t held = HeapTestResidentKiB();
    std::free(const_cast<char*>(p));
    const uint64_t after = HeapTestResidentKiB();
    const bool kept = after + (8 << 10) >= held;  // within 8 MiB of it
    ::_exit(kept == changed ? 0 : 2);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("a worker's heap keeps the memory it frees") {
  CHECK(HeapTestChild(nullptr, true) == 0);
}

TEST_CASE("the environment's malloc settings win over a worker's heap settings") {
  CHECK(HeapTestChild("MALLOC_TRIM_THRESHOLD_", false) == 0);
  CHECK(HeapTestChild("MALLOC_MMAP_THRESHOLD_", false) == 0);
  CHECK(HeapTestChild("GLIBC_TUNABLES", false) == 0);
}
