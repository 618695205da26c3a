// Fault injection for tests and demos (ob-launch --inject, design/watch.md): make
// one rank slow, hang, stall or report a NaN loss, so that ob-watch's detectors
// and actions can be exercised on a real run. Torch-free, pure.
//
// A spec is one or more ';'-separated items RANK:WHAT=VALUE:
//   2:slow=1.5    rank 2 computes every forward and backward 1.5× as long
//   2:spin=1.5    the same, the extra time burnt on the CPU (a busy loop)
//                 rather than slept: a CPU throttle slows it further
//   1:hang=30     rank 1 stops itself (SIGSTOP) before step 30
//   1:stall=30    rank 1's training loop stops in step 30 while the process
//                 and its heartbeats go on (a hang with nobody dead, as a
//                 stuck NCCL peer looks: runtime::StageWorker::SetStall)
//   0:nan=40      rank 0 reports a NaN loss for step 40
//   0:park=5      rank 0 waits before step 5 until the file named by
//                 $OB_INJECT_RELEASE exists, its heartbeats counting as
//                 progress (a test holds a run at a step while it acts,
//                 instead of hoping the run is still going)
//   3:check=20    rank 3's background read of its host's copy of --data
//                 (inputs.h ContentCheck), if it makes one, gives no verdict
//                 before step 20: a large file read while training goes on
// An item applies in the first generation, or with a suffix @GEN in
// generation GEN only (0:park=30@2: rank 0 of generation 2, the first after
// a recovery, waits before step 30; a test holds the recovered run while it
// acts). The master passes the whole spec to every worker ($OB_INJECT);
// each worker takes the items naming its rank and its generation.
#pragma once

#include <cstdint>
#include <string>

#include "ob/status.h"

namespace ob::launch {

struct Injection {
  double slow = 1;        // > 1: slowdown factor
  bool spin = false;      // the slowdown burns CPU time (spin=) rather than sleeping (slow=)
  int64_t hang_at = -1;   // step before which the worker stops itself
  int64_t nan_at = -1;    // step whose loss is reported as NaN
  int64_t stall_at = -1;  // step in which the training loop stops making progress
  int64_t check_at = -1;  // step before which the data's background read gives no verdict
  int64_t park_at = -1;   // step before which the rank waits for $OB_INJECT_RELEASE
  bool any() const {
    return slow > 1 || hang_at >= 0 || nan_at >= 0 || stall_at >= 0 || check_at >= 0 || park_at >= 0;
  }
};

// The items of `spec` for `rank` in `generation` (every item is checked).
// kUsage naming the malformed item.
Result<Injection> ParseInjection(const std::string& spec, int rank, int64_t generation = 1);

}  // namespace ob::launch
