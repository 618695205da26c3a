// The checkpoint engine of a worker (design/ckpt.md, issue "ob-ckpt"): saves
// without stalling training, and loads a checkpoint into any layout.
//
// Saving. A StageWorker already copies its state (weights and AdamW state)
// to host memory after every step (snapshot.h) for in-place recovery. At a
// checkpoint step the Checkpointer pins that snapshot (the worker then
// rotates through its other slots) and a background thread writes the
// layers this rank is the writer of — each layer is written once, by the
// lowest rank that owns it; the tied LM weight goes with layer 0 — as
// whole (unsharded) tensors: with tensor parallelism t > 1 the stage's TP
// rank 0 writes, the other t − 1 send it their shards of those layers
// over a CPU group of their own (never the training groups or the GPU),
// and it merges them (tensor_parallel.h, MergeShards), so a checkpoint
// does not depend on the degree that saved it. They go as
// safetensors files into the step's partial directory, then this rank's
// part manifest (ckpt/checkpoint.h). The training thread pays nothing at
// the checkpoint step; it waits only when the next checkpoint step comes
// before the previous save finished. The master commits the checkpoint once
// every rank reported its part (Metrics.checkpoint_step).
//
// Loading. LoadStageSnapshot reads, from any checkpoint, the layers
// [first, last] (and the tied weight when asked) into a host StageSnapshot,
// whatever layout saved them, as shard tp_rank of tp; StageWorker::Restore
// then installs it.
//
// Thread-safety: Checkpointer's methods run on the training thread; the
// writer thread only reads the pinned snapshot. Failure: a failed save (a
// full disk) is reported through Poll's Done::error and training goes on.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "ob/runtime/snapshot.h"
#include "ob/runtime/stage_worker.h"
#include "ob/runtime/topology.h"
#include "ob/status.h"

namespace ob::runtime {

class Checkpointer {
 public:
  struct Done {
    int64_t step = -1;
    std::string error;       // "" when the part was written
    double seconds = 0;      // background time of the save
    uint64_t bytes = 0;      // written by this rank
  };

  // Saves after the last step, and, for `every` > 0, after steps every-1,
  // 2·every-1, ...; and whenever AfterStep is forced. With tensor parallelism, `tp_group`
  // is a CPU (Gloo) group of the rank's stage, TP rank order, used only
  // here, and `vocab_size` the model's (for the shapes of vocabulary
  // shards). REQUIRES: tp_group when topo.tp > 1.
  Checkpointer(std::string dir, int64_t every, const Topology& topo, int rank,
               c10::intrusive_ptr<compat::Backend> tp_group = {}, int64_t vocab_size = 0);
  ~Checkpointer();           // waits for a save in progress
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  bool IsCheckpointStep(int64_t step, int64_t last_step) const;

  // After worker.Step(step): collects a save that finished (into
  // *finished, unpinning its snapshot; returns true then), and at a
  // checkpoint step starts saving the snapshot of `step` — first waiting
  // for the previous save if it is still running (*waited: the seconds the
  // training thread stalled).
  // `force`: save this step whatever `every` says (the master's
  // "checkpoint now").
  bool AfterStep(StageWorker& worker, int64_t step, int64_t last_step, Done* finished,
                 double* waited, bool force = false);
  // At the end of training: waits for the save in progress, if any.
  bool Finish(StageWorker& worker, Done* finished);

  const std::vector<int>& layers() const { return layers_; }  // this rank writes these

 private:
  std::string dir_;
  int64_t every_;
  int rank_;
  int tp_ = 1, tp_rank_ = 0;
  c10::intrusive_ptr<compat::Backend> tp_group_;
  int64_t vocab_size_ = 0;
  int num_layers_;
  std::vector<int> layers_;
  bool writes_tied_ = false;
  std::future<Done> pending_;
};

// The state after the checkpoint's step of layers [first, last] (tensors
// keyed as in StageSnapshot; the tied weight under kTied when `tied`), read
// from the checkpoint directory `ckpt` (a step-… directory). kDataErr
// naming the file when a layer or tensor is missing or damaged.
Result<StageSnapshot> LoadStageSnapshot(const std::string& ckpt, int first, int last, bool tied,
                                        int tp = 1, int tp_rank = 0);
// The same for a stage of several chunks: every layer of `ranges`.
Result<StageSnapshot> LoadStageSnapshot(const std::string& ckpt, const LayerRanges& ranges, bool tied, int tp,
                                        int tp_rank);

}  // namespace ob::runtime
