// Processes that train a model's layers beside ob-profile while it times
// them (--concurrency), and the contention curve measured from their
// throughput. Internal to lib/ob/profile (measured.cc).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "ob/model/config.h"
#include "ob/profile/measured.h"
#include "ob/status.h"

namespace ob::profile::detail {

// --concurrency: processes that train the model's layers (forward and
// backward of each in turn, in a loop) while this one times them, so that
// the times are those of a worker sharing the machine's cores with others.
// All are forked once, before this process runs any torch op (a child of a
// process whose OpenMP pool exists is not promised a working one by
// libgomp, and Gloo's threads are not copied); while G ranks time an
// all-reduce, Run(W − G) keeps that many training and stops the rest
// (SIGSTOP). They exit when the pipe they watch closes: on Stop, or when
// this process dies.
class BackgroundLoad {
 public:
  ~BackgroundLoad() { Stop(); }

  // `processes` of them; each has said it ran its first pass on return.
  Status Start(const model::GptConfig& c, const MeasureOptions& o, int s, int processes);

  // The first n keep training; the others wait, stopped.
  void Run(int n);

  int processes() const { return static_cast<int>(pids_.size()); }

  // Blocks trained so far by all of them together (each the same work).
  uint64_t BlocksTrained() const;

  void Stop();

 private:
  // One load process's loop (the child of a fork): trains the layers until
  // `stop_fd` closes, counting the blocks in *count; says "r" on `ready_fd` after
  // its first pass.
  static void Train(const model::GptConfig& c, const MeasureOptions& o, int s, int which, int stop_fd,
                    int ready_fd, std::atomic<uint64_t>* count);

  std::vector<pid_t> pids_;
  int stop_fd_ = -1;
  std::atomic<uint64_t>* counts_ = nullptr;
  size_t counts_bytes_ = 0;
};

// --concurrency N: how much slower a process trains with k processes
// training at once than alone, k = 1..N, from the load's throughput: with
// k of the load running (and this process asleep), the layers they train
// per second, over k times what one alone trains. Throughput, not one
// process's own time, because the cores are shared unevenly: with 3
// processes on 2 cores, the one a core has to itself runs at full speed
// for as long as the kernel leaves it there, and which one that is is luck.
// The k are taken in turn, kBlocks times over, so that a drift of the
// machine's speed falls on all of them alike; each window lasts until the
// k have trained 16 blocks each (at least 160 ms, at most 5 s), and no
// value is below 1. Under a pipeline's schedule
// the workers of a local cluster do not all compute at once (they wait for
// their neighbours), and ob-plan --local replays the schedule at the speed
// this curve gives for the number computing at each moment (schedule.h).
// REQUIRES: load.processes() >= N.
std::vector<double> MeasureContention(const MeasureOptions& o, BackgroundLoad& load);

}  // namespace ob::profile::detail
