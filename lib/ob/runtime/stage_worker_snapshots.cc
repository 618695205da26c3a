// StageWorker's host snapshots (see stage_worker.h, "Snapshots" and
// "Recovery"): the slots it keeps the state after its last steps in, the
// copy Step starts in the background and Settle waits for, pins for
// checkpoints, and a SnapshotArena attached to keep them in shared memory.
#include "ob/runtime/stage_worker.h"

#include <ATen/record_function.h>

#include <functional>
#include <stdexcept>
#include <utility>

#include "ob/runtime/stage_worker_impl.h"

namespace ob::runtime {

const StageSnapshot* StageWorker::SnapshotAt(int64_t step) const {
  Settle();
  for (const auto& s : snapshots_) {
    if (s.valid() && s.step == step) return &s;
  }
  return nullptr;
}

namespace {

// Whether `v` has the layers, shard, keys, dtypes and shapes of `like`.
bool SameLayout(const StageSnapshot& v, const StageSnapshot& like) {
  if (v.first_layer != like.first_layer || v.last_layer != like.last_layer || v.ranges != like.ranges || v.tp != like.tp ||
      v.tp_rank != like.tp_rank || v.tensors.size() != like.tensors.size()) {
    return false;
  }
  for (const auto& [key, t] : like.tensors) {
    auto it = v.tensors.find(key);
    if (it == v.tensors.end() || it->second.value.scalar_type() != t.value.scalar_type() ||
        it->second.value.sizes() != t.value.sizes()) {
      return false;
    }
  }
  return true;
}

}  // namespace

Status StageWorker::AttachArena(SnapshotArena* arena, int keep, int64_t step) {
  if (opts_.device.is_cuda()) {
    arena->set_pin(true);
  } else {
    arena->set_pin(true, SnapshotArena::Prefault, [](void*) {});
  }
  // Straight from the live tensors: no host copy of the state on the way
  // in (the arena's slot `keep` may hold it already; else one copy).
  const StageSnapshot current = LiveView(stage_, tied_, *optimizer_, step);
  // What the arena already holds of this lineage up to the current step
  // stays: the older steps are what a later recovery may have to go back
  // to (ChooseStart), in this rank's layout or in the one it had before.
  // Anything newer than the current step, or of another lineage, is not
  // on this run's path and goes.
  StageSnapshot views[kSnapshots];
  bool kept[kSnapshots] = {};
  for (int s = 0; s < kSnapshots; ++s) {
    const SnapshotArena::SlotInfo i = arena->info(s);
    if (!i.complete() || i.lineage != arena->lineage() || i.step > current.step) continue;
    auto view = arena->View(s);
    if (!view.ok()) continue;
    kept[s] = true;
    if (SameLayout(*view, current)) views[s] = std::move(view).value();  // usable as it is
  }
  int a = -1;  // the slot that holds the current state
  if (keep >= 0 && keep < kSnapshots && views[keep].valid() && views[keep].step == current.step) {
    a = keep;  // restored from it, and laid out as the stage is now: nothing to copy
  } else {
    for (int s = 0; s < kSnapshots; ++s) {  // else the least useful slot other than `keep`
      if (s == keep) continue;
      if (a < 0 || (kept[a] && (!kept[s] || arena->info(s).step < arena->info(a).step))) a = s;
    }
    StageSnapshot first;
    OB_RETURN_IF_ERROR(arena->Prepare(a, current, &first));
    arena->Begin(a);
    torch::NoGradGuard no_grad;
    for (auto& [key, t] : first.tensors) {
      const TensorSnapshot& from = current.tensors.at(key);
      t.value.copy_(from.value);
      t.exp_avg.copy_(from.exp_avg);
      t.exp_avg_sq.copy_(from.exp_avg_sq);
      t.adam_step = from.adam_step;
    }
    first.step = current.step;
    arena->Commit(a, first);
    views[a] = std::move(first);
  }
  for (int s = 0; s < kSnapshots; ++s) {
    unprepared_[s] = false;
    if (s == a || views[s].valid()) continue;
    if (kept[s]) {
      unprepared_[s] = true;  // another layout's: laid out anew when a step needs the slot
    } else {
      OB_RETURN_IF_ERROR(arena->Prepare(s, current, &views[s]));
    }
  }
  for (int s = 0; s < kSnapshots; ++s) snapshots_[s] = std::move(views[s]);
  newest_ = a;
  pinned_ = -1;
  arena_ = arena;
  return Status::Ok();
}

const StageSnapshot* StageWorker::Pin(int64_t step) {
  Settle();
  for (int s = 0; s < kSnapshots; ++s) {
    if (snapshots_[s].valid() && snapshots_[s].step == step) {
      pinned_ = s;
      return &snapshots_[s];
    }
  }
  return nullptr;
}

void StageWorker::StartSnapshot(int64_t step) {
  int slot = -1;  // the oldest slot that is neither the newest nor pinned
  for (int s = 0; s < kSnapshots; ++s) {
    if (s == newest_ || s == pinned_) continue;
    if (slot < 0 || snapshots_[s].step < snapshots_[slot].step) slot = s;
  }
  std::function<void(const StageSnapshot&)> commit;
  if (arena_ != nullptr) {
    if (unprepared_[slot]) {
      Status st = arena_->Prepare(slot, snapshots_[newest_], &snapshots_[slot]);
      if (!st.ok()) throw std::runtime_error(st.message());
      unprepared_[slot] = false;
    }
    arena_->Begin(slot);
    // Complete in the arena as soon as the copy is (SnapshotArena::Commit
    // touches only this slot, which nothing else uses meanwhile).
    commit = [arena = arena_, slot](const StageSnapshot& snap) { arena->Commit(slot, snap); };
  }
  {
    RECORD_USER_SCOPE("ob::snapshot");
    copier_.Start(stage_, tied_, *optimizer_, step, &snapshots_[slot], std::move(commit));
  }
  copying_ = slot;
  if (!opts_.async_snapshot) Settle();
}

void StageWorker::Settle() const {
  StageSnapshot* done = copier_.Wait();
  if (done == nullptr) return;
  newest_ = copying_;  // committed to the arena by the copier
  copying_ = -1;
}

}  // namespace ob::runtime
