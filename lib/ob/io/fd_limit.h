// The process's open-file limit. A master holds one connection per agent,
// an agent's peer probes one socket per attempt in flight, and a worker's
// Gloo group one connection per peer rank: at a thousand hosts all of these
// pass the soft limit most distributions start a login with (1,024), far
// below the hard limit they allow (often 524,288). Like the Go runtime and
// the servers systemd documents, ob raises its own soft limit to the hard
// one; the processes it starts inherit it.
//
// Thread-safety: call before starting threads (it changes the process).
#pragma once

#include <cstdint>

namespace ob::io {

struct FileLimit {
  uint64_t before = 0;  // the soft limit found
  uint64_t after = 0;   // the soft limit now (== before when unchanged)
};

// Raises RLIMIT_NOFILE's soft limit to its hard limit (capped at
// kMaxOpenFiles: an "unlimited" hard limit would make every poll set and
// descriptor table sized by it absurd). Never lowers it. A refusal of the
// kernel leaves the limit as it was (after == before).
inline constexpr uint64_t kMaxOpenFiles = 1 << 20;
FileLimit RaiseOpenFileLimit();

}  // namespace ob::io
