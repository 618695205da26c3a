// The master's half of a checkpoint (design/ckpt.md): which ranks have written
// their part of which step, and the commit of every step all of them wrote
// (ckpt::Commit: the parts merged into one manifest, renames and fsyncs,
// then retention by ckpt::Prune), one at a time, in step order, on a thread
// of its own so that fsyncs never stall the master's event loop.
//
// Thread-safety: one thread (the loop) calls every method; a commit's thread
// works on its own copies. A step a rank failed to write is never committed:
// its parts stay in the .partial directory, which Prune and ls leave alone.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "ob/manifest.pb.h"
#include "ob/status.h"

namespace ob::launch {

class CommitQueue {
 public:
  // `keep`: the complete checkpoints to keep after each commit (0: all).
  CommitQueue(std::string dir, int keep, int num_layers);
  ~CommitQueue();  // waits for a running commit: a half-done rename is never abandoned
  CommitQueue(const CommitQueue&) = delete;
  CommitQueue& operator=(const CommitQueue&) = delete;

  // Rank `rank` of `world` wrote its part of `step`; the step is queued for
  // commit once every rank has (and none failed it).
  void Part(int64_t step, uint32_t rank, size_t world);
  // A rank could not write its part of `step`: true the first time for that
  // step (the caller reports it once).
  bool Failed(int64_t step);
  // A new generation: parts of earlier workers no longer count. Queued and
  // running commits go on.
  void ForgetParts() { parts_.clear(); }

  struct Outcome {
    int64_t step = -1;
    Result<pb::Manifest> manifest = Status::Ok();  // the merged manifest, or why not
    int64_t commit_ms = 0;                         // queued commit started -> done
  };
  // Collects a finished commit (nullopt while none is), then starts the next
  // queued step with the manifest `base(step)` gives (model, seed, plan...).
  // With `wait`, blocks until the running commit is done.
  std::optional<Outcome> Poll(const std::function<pb::Manifest(int64_t step)>& base,
                              bool wait = false);
  // Nothing queued and nothing running.
  bool idle() const { return !running_.valid() && ready_.empty(); }

 private:
  const std::string dir_;
  const int keep_, num_layers_;
  std::map<int64_t, std::set<uint32_t>> parts_;
  std::set<int64_t> failed_;
  std::deque<int64_t> ready_;
  std::future<Result<pb::Manifest>> running_;
  int64_t running_step_ = -1, running_start_ms_ = 0;
};

}  // namespace ob::launch
