#include "ob/launch/master/commit_queue.h"

#include <chrono>
#include <utility>

#include "ob/ckpt/checkpoint.h"
#include "ob/clock.h"
#include "ob/log.h"

namespace ob::launch {

CommitQueue::CommitQueue(std::string dir, int keep, int num_layers)
    : dir_(std::move(dir)), keep_(keep), num_layers_(num_layers) {}

CommitQueue::~CommitQueue() {
  if (running_.valid()) running_.wait();
}

void CommitQueue::Part(int64_t step, uint32_t rank, size_t world) {
  if (failed_.count(step)) return;
  auto& ranks = parts_[step];
  ranks.insert(rank);
  if (ranks.size() < world) return;
  parts_.erase(step);
  ready_.push_back(step);
}

bool CommitQueue::Failed(int64_t step) {
  parts_.erase(step);
  return failed_.insert(step).second;
}

std::optional<CommitQueue::Outcome> CommitQueue::Poll(
    const std::function<pb::Manifest(int64_t)>& base, bool wait) {
  std::optional<Outcome> done;
  if (running_.valid()) {
    if (!wait && running_.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
      return done;
    done = Outcome{running_step_, running_.get(), UnixMs() - running_start_ms_};
  }
  if (ready_.empty()) return done;
  running_step_ = ready_.front();
  ready_.pop_front();
  running_start_ms_ = UnixMs();
  running_ = std::async(std::launch::async, [dir = dir_, step = running_step_,
                                             base = base(running_step_), layers = num_layers_,
                                             keep = keep_]() -> Result<pb::Manifest> {
    Result<pb::Manifest> m = ckpt::Commit(dir, step, base, layers);
    if (m.ok() && keep > 0) {  // retention: never the newest, latest's, or one being written
      Result<std::vector<std::string>> pruned = ckpt::Prune(dir, keep);
      if (!pruned.ok()) {
        OB_LOG(Warn) << "pruning " << dir << ": " << pruned.status().message();
      }
    }
    return m;
  });
  return done;
}

}  // namespace ob::launch
