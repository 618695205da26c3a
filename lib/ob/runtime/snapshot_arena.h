// SnapshotArena: the StageSnapshots of a worker (snapshot.h) kept in a
// shared-memory file that outlives the worker process (design/recovery.md).
//
// The ob-launch agent creates one memfd per local worker and hands it to
// every worker it starts in that slot (fd inheritance; $OB_SNAPSHOT_FD).
// The worker lays its snapshots out in it and CaptureSnapshot writes
// straight into the mapping, so a snapshot costs the same copy as a heap
// one. When any worker dies the master restarts all of them under a new
// generation: a restarted worker finds here the state after its last
// completed steps, whatever killed its predecessor, and a host that is lost
// takes its arenas with it (the agent's memfds die with the agent). Nothing
// touches a disk.
//
// Layout (native endianness; one machine only): a 4 KiB header, then one
// region per slot: an entry table (key, dtype, shape, AdamW step, offset)
// and the data, each tensor's value, exp_avg and exp_avg_sq back to back at
// 64-byte alignment. A slot is empty, being written, or complete; it turns
// complete (with its step) only after every byte is in place, so a worker
// killed mid-copy leaves that slot unusable and the other one intact. A
// slot that must grow is moved to the end of the file; the file never
// shrinks. The mapping reserves a large virtual range once, so views stay
// valid as the file grows.
//
// Thread-safety: one thread at a time, but for the page-locking, which a
// thread of the arena's own does (set_pin). Failure: kIoErr on mapping or
// growing errors; kDataErr for a file that is not an arena (a worker given
// the wrong descriptor).
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>

#include "ob/runtime/snapshot.h"
#include "ob/status.h"

namespace ob::runtime {

class SnapshotArena {
 public:
  static constexpr int kSlots = 3;  // the last two steps, and one a checkpoint may hold

  struct SlotInfo {
    int64_t step = -2;      // -2: not complete
    int first_layer = 0;
    int last_layer = -1;
    LayerRanges ranges;     // with chunks (RangesOf)
    int tp = 1, tp_rank = 0;  // which shard of the layers
    uint64_t lineage = 0;   // set_lineage() at the time of the Commit
    bool complete() const { return step >= -1; }
  };

  // Maps `fd` (shared; an empty file becomes an empty arena). The arena
  // dups `fd`; the caller keeps its own.
  static Result<std::unique_ptr<SnapshotArena>> Open(int fd, const std::string& name);
  // A private arena on a fresh memfd (tests, or a worker started by hand).
  static Result<std::unique_ptr<SnapshotArena>> Anonymous();

  ~SnapshotArena();
  SnapshotArena(const SnapshotArena&) = delete;
  SnapshotArena& operator=(const SnapshotArena&) = delete;

  SlotInfo info(int slot) const;
  // The slot whose complete snapshot is after step `step`, or -1.
  int SlotAt(int64_t step) const;

  // The complete snapshot in `slot`, its tensors viewing the arena (valid
  // until the slot is prepared again). kDataErr if the slot is not complete
  // or its table is damaged.
  Result<StageSnapshot> View(int slot) const;

  // Lays `slot` out for tensors named and shaped like `like`'s values
  // (dtype and sizes; the data is not read), marks it empty, and fills
  // `out` with views ready for CaptureSnapshot (step -2).
  Status Prepare(int slot, const StageSnapshot& like, StageSnapshot* out);

  // Brackets a capture into `slot` (prepared from the same tensors):
  // Begin marks it incomplete; Commit records `snap`'s step, layers and
  // AdamW step counts and marks it complete.
  void Begin(int slot);
  void Commit(int slot, const StageSnapshot& snap);

  // The lineage (control.proto's WeightSource.lineage) that every later
  // Commit of this process stamps on its slot: a restarted worker tells the
  // state of its own lineage from what an earlier one (before a rollback,
  // say) left behind. 0 until set.
  void set_lineage(uint64_t lineage) { lineage_ = lineage; }
  uint64_t lineage() const { return lineage_; }
  // Page-locks the whole file, what an earlier process wrote included, and
  // what it grows by from now on (CUDA workers: the snapshot's side-stream
  // copies and a restore's copies need pinned memory to be asynchronous and
  // fast). Pinning is per process, so a restarted worker pins again. It
  // runs on a thread of the arena's, never on the caller's: page-locking
  // several GB takes seconds (8 s on an H100's virtual machine), which a
  // restarted worker must not spend before its first step; until a range
  // is locked, copies to it go through pageable memory, slower but
  // correct. Ranges end at slot regions' starts, so a tensor is never half
  // locked. Best effort: after the first failure the arena stays pageable.
  // The file grows by whole pages, so no page is registered twice. Tests
  // pass their own pin and unpin functions (default: compat::PinHostRange
  // and compat::UnpinHostRange); they run on the arena's thread.
  // CPU workers pass Prefault and a no-op: the same thread then faults the
  // ranges in ahead of the copies instead of locking them.
  using PinFn = std::function<bool(void*, size_t)>;
  using UnpinFn = std::function<void(void*)>;
  void set_pin(bool pin, PinFn pin_fn = {}, UnpinFn unpin_fn = {});
  // Faults [data, data + bytes) in, writable, without touching its bytes
  // (madvise MADV_POPULATE_WRITE; false before Linux 5.14). A snapshot's
  // first copy into a new region otherwise pays for every page: 3.4-4.5 s
  // for gpt2's 1.5 GB slot on the development VM, against 0.12 s for the
  // copy into a faulted-in slot, and on a step of 1.4 s that wait reached
  // the training thread.
  static bool Prefault(void* data, size_t bytes);
  // Bytes from the file's start that are locked now.
  uint64_t pinned_bytes() const;
  // Blocks until the whole file is locked or locking has failed; true when
  // locked (tests, and callers that want pinned copies from then on).
  bool WaitPinned();

  const std::string& name() const { return name_; }

 private:
  SnapshotArena() = default;
  // Page-locking (set_pin), all under pin_mu_: the locked ranges in file
  // order; pin_marks_, where a range may end (slot regions' starts and the
  // file's end, ascending); the thread that locks up to the last mark.
  mutable std::mutex pin_mu_;
  std::condition_variable pin_cv_;
  bool pin_ = false, pin_stop_ = false;
  PinFn pin_fn_;
  UnpinFn unpin_fn_;
  std::vector<std::pair<char*, uint64_t>> pinned_;
  std::vector<uint64_t> pin_marks_;
  std::thread pinner_;
  uint64_t PinnedBytesLocked() const;
  void PinLoop();
  void PinUpTo(uint64_t end);
  Status Map(int fd);
  Status Grow(uint64_t bytes);
  struct Header;
  Header* header() const;

  std::string name_;
  int fd_ = -1;
  char* base_ = nullptr;
  uint64_t file_bytes_ = 0;
  uint64_t lineage_ = 0;
};

}  // namespace ob::runtime
