// Host-memory snapshots of a pipeline stage's training state (design/recovery.md,
// in-place recovery): every parameter's value and its AdamW state (exp_avg,
// exp_avg_sq, step count), keyed by the stage's parameter name
// ("<global layer>.<name>", see gpt.h) with the tied LM weight under
// StageSnapshot::kTied whichever layer registers it on the stage.
//
// A StageWorker keeps two of these (stage_worker.h): the state after its last
// completed step and after the one before, because a failure can hit after
// some ranks applied step k's update and others did not; the survivors agree
// on S = the minimum of their last completed steps and each restores its
// snapshot at S (or on an older step when only that one has every layer:
// StageWorker::ChooseStart).
//
// Cost: one device-to-host copy of 3× the stage's parameter bytes per step
// (value + two moments; about 12 bytes per fp32 parameter), into buffers
// allocated once and reused. SnapshotCopier takes it off the critical
// path: the copy of step k's state runs while step k + 1's forward and
// backward do (a thread of the copier's own queues it on a side stream
// into page-locked memory on CUDA, or makes it on the CPU) — neither
// changes parameters or AdamW
// moments — and the training thread waits for it only before step k + 1's
// update, by which time it is normally done. (On a CPU the copy competes
// with the step for cores and memory bandwidth; ob-launch copies on the
// training thread there by default, see launch/worker/worker.cc.) Host memory: 3 snapshots (the last two steps
// and one a checkpoint may hold), i.e. 3 × 12 bytes per parameter of the
// stage; ob-plan counts it against --host-memory.
//
// Thread-safety: values; one thread at a time. Failure: LibTorch exceptions
// propagate (callers catch at their boundary).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "ob/model/gpt.h"
#include "ob/runtime/layer_ranges.h"
#include "ob/torch_compat.h"

namespace ob::runtime {

struct TensorSnapshot {
  torch::Tensor value;       // host copy of the parameter
  torch::Tensor exp_avg;     // AdamW first moment (zeros before the first step)
  torch::Tensor exp_avg_sq;  // AdamW second moment (zeros before the first step)
  int64_t adam_step = 0;     // AdamW's step count for this parameter (0: no state yet)
};

// Copies share the tensors (a worker overwrites its snapshots' buffers in
// place at later steps): clone them to keep a snapshot.
struct StageSnapshot {
  static constexpr const char* kTied = "tied";
  int64_t step = -2;       // state after global step `step`; -1: initial weights; -2: empty
  int first_layer = 0;     // the stage's layers [first_layer, last_layer]
  int last_layer = -1;
  LayerRanges ranges;      // with chunks, its ranges (RangesOf: these, else [first, last])
  int tp = 1, tp_rank = 0; // shard tp_rank of tp of those layers (tensor_parallel.h)
  std::map<std::string, TensorSnapshot> tensors;

  bool valid() const { return step >= -1; }
  int64_t bytes() const;   // host bytes held
};

// Copies `stage`'s parameters and `optimizer`'s state into `into` (reusing
// its buffers when the names and shapes match), labelled `step`; it is
// invalid (step -2) while copying, so a throw leaves it unusable rather than
// half old, half new. `tied` is the stage's tied LM tensor, undefined when it
// has none.
void CaptureSnapshot(const model::GptStage& stage, const torch::Tensor& tied,
                     torch::optim::AdamW& optimizer, int64_t step, StageSnapshot* into);

// `stage`'s state as it is now, labelled `step`, without a copy: the
// tensors are the live parameters and AdamW moments themselves (detached;
// zeros where a parameter has no state yet). What a worker copies into its
// arena from, or compares the arena's layouts with; valid only until the
// next update.
StageSnapshot LiveView(const model::GptStage& stage, const torch::Tensor& tied,
                       torch::optim::AdamW& optimizer, int64_t step);

// Copies a stage's state into a StageSnapshot in the background (see Cost
// above). Start gathers the buffers on the calling thread (allocating them
// the first time) and starts the copy; the snapshot stays invalid (step -2)
// until Wait() returns, which rethrows a failed copy. One copy at a time:
// Start waits for the previous one first. Thread-safety: Start and Wait on
// one thread; the copy's own thread touches only the buffers.
class SnapshotCopier {
 public:
  SnapshotCopier();
  ~SnapshotCopier();  // waits for a copy in flight
  SnapshotCopier(const SnapshotCopier&) = delete;
  SnapshotCopier& operator=(const SnapshotCopier&) = delete;

  // `on_copied`, when given, runs once the copy is in place and labelled
  // (on the copy's own thread): the worker
  // marks its arena slot complete there, so a process that dies or stalls
  // after the copy still leaves the step recoverable.
  void Start(const model::GptStage& stage, const torch::Tensor& tied,
             torch::optim::AdamW& optimizer, int64_t step, StageSnapshot* into,
             std::function<void(const StageSnapshot&)> on_copied = {});
  // Blocks until the copy started last is in place and labels its snapshot
  // with its step; returns the snapshot (nullptr when none was in flight).
  StageSnapshot* Wait();
  bool pending() const { return into_ != nullptr; }

 private:
  struct Thread;
  std::unique_ptr<Thread> thread_;  // queues (CUDA) or makes (CPU) the copies
  StageSnapshot* into_ = nullptr;
};

// Sets `p`'s AdamW state (replacing any): step count and copies of the
// moments on p's device. adam_step == 0 removes the state (AdamW recreates it
// lazily as zeros, which is the same).
void SetAdamState(torch::optim::AdamW& optimizer, const torch::Tensor& p,
                  const TensorSnapshot& state);

// The snapshot key of a stage parameter named `name`.
inline std::string SnapshotKey(const std::string& name, const torch::Tensor& p,
                               const torch::Tensor& tied) {
  if (tied.defined() && p.unsafeGetTensorImpl() == tied.unsafeGetTensorImpl()) {
    return StageSnapshot::kTied;
  }
  return name;
}

// The parameter name a snapshot key is sharded as (tensor_parallel.h):
// "3.attn.c_attn.weight" -> "attn.c_attn.weight"; the tied weight is a
// token table.
inline std::string ShardName(const std::string& key) {
  if (key == StageSnapshot::kTied) return "wte.weight";
  return key.substr(key.find('.') + 1);
}

}  // namespace ob::runtime
