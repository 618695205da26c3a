// Fuzz target: hosts files and Slurm node lists (ob::cluster).
#include <cstdint>
#include <string>

#include "ob/cluster/hosts.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto hosts = ob::cluster::ParseHosts(text, "fuzz.txt");
  if (hosts.ok()) {
    // Whatever is accepted is safe to put on a command line.
    for (const auto& h : *hosts)
      if (!ob::cluster::IsValidHostName(h.name) || h.slots < 1) __builtin_trap();
  } else if (hosts.status().message().rfind("fuzz.txt", 0) != 0) {
    __builtin_trap();
  }
  if (size < 256) (void)ob::cluster::HostsFromSlurm(text);
  return 0;
}
