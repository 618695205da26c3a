// StageWorker: one rank of a pipeline- and data-parallel training run (design/launch.md,
// Workers). It owns one pipeline stage of the GPT, its AdamW state and
// its c10d groups, and runs training steps that are, up to floating-point
// summation order, the single-process reference's (ob::model::train_steps):
//
//   - the same initial weights (GptStage(cfg, first, last, opts.seed) draws
//     each layer from its own seed, whatever the partition);
//   - the same samples: the micro-batch with global index g of step k holds
//     samples [g·b, (g+1)·b) of (seed, k) (see topology.h);
//   - each micro-batch's mean loss weighted by 1/M (M micro-batches in the
//     global batch), so the SUM over pipelines of the stage gradients is the
//     reference's gradient: gradients are all-reduced over each layer's owner
//     set, the tied LM weight's over the tied group (first and last stages of
//     every pipeline, design/model.md);
//   - the global grad norm before clipping counts every layer once and the
//     tied weight once; it is computed per layer, summed within the pipeline
//     and added up in layer order, so it is bit-identical on every rank and
//     every replica clips alike; then lr = LearningRate(opts, step), AdamW.
//
// Within a pipeline, micro-batches follow StageProgram (schedule/program.h):
// the computes of the template's schedule (1F1B, or a zero-bubble one whose
// backward is split: the input gradient first, sent upstream at once, the
// weight gradients later from what model/weight_grads.h kept, the very
// same sums), with activations sent forward and their gradients backward over
// the pipeline group in batches posted together (one NCCL group on CUDA),
// an order proven free of deadlock on rendezvous channels (schedule_test);
// tag 2·g for activations, 2·g + 1 for gradients, g the global micro-batch
// index. Gloo on CPU tensors; NCCL on CUDA (built and run on one GPU only:
// multi-rank NCCL rests on that proof and the CPU tests).
//
// Precision (opts.precision, model/train.h): under kBf16 forward runs in
// bf16 autocast (on CUDA or CPU) over fp32 weights; the residual stream
// is bf16 inside a stage (model/gpt.cc) and crosses stage boundaries so
// (and its gradient too); gradients accumulate, and are all-reduced, in
// fp32.
//
// Overlap (opts.overlap_allreduce): gradients live in flat per-bucket
// buffers (p.grad() is a view), and the last micro-batch's backward runs
// unit by unit (a layer's segments: a block's MLP half, then its attention
// half), so each bucket's data-parallel all-reduce starts as soon as its
// units are done; the step then waits only for what is still in flight
// (StepResult::allreduce_exposed_seconds). Every rank issues its
// collectives in one global order (buckets from the highest unit down,
// then the tied weight and the loss), so no two ranks can wait on each
// other's different groups.
//
// Snapshots (design/recovery.md, snapshot.h): the state after step k is copied to
// host memory while step k + 1 computes; Step waits for it only before its
// update.
//
// Groups are created when the worker is, each through a c10d::PrefixStore
// named after the group over the given store, in Topology order; so every
// rank of the topology must construct its worker concurrently with the same
// topology and store (threads of one process sharing a HashStore, or
// processes sharing the job's store, launch/worker/relay_store.h). To rebuild
// groups after a failure, give the new workers a store with a fresh prefix
// (e.g. a PrefixStore "gen/3").
//
// Ownership: the worker owns its stage, optimizer and groups; it shares the
// store and the token source. Thread-safety: one thread at a time per
// worker; distinct workers may run on distinct threads. Failure: Create and
// Step catch LibTorch/Gloo exceptions (a peer that died, a timeout) and
// return kUnavailable; bad options are kConfig. After a failed Step the
// worker's gradients and optimizer state are unspecified: rebuild it.
//
// Recovery (design/recovery.md): the worker keeps host snapshots of its state after
// each of its last two completed steps (snapshot.h), untouched by a failed
// Step. After a failure the survivors agree on S, the least last completed
// step among them, and each calls Rebuild(S, ...) on its old worker
// concurrently: it joins the new generation's groups, copies the layers it
// gains (weights and AdamW state) from the holders named by the plan's fetch
// list, and returns a worker ready for Step(S + 1) (recovery.cc).
#pragma once

#include <torch/torch.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "ob/model/config.h"
#include "ob/model/data.h"
#include "ob/model/gpt.h"
#include "ob/model/train.h"
#include "ob/plan/recovery.h"
#include "ob/runtime/snapshot.h"
#include "ob/runtime/snapshot_arena.h"
#include "ob/runtime/topology.h"
#include "ob/schedule/program.h"
#include "ob/status.h"
#include "ob/torch_compat.h"

namespace ob::runtime {

struct StepResult {
  int64_t step = 0;
  double loss = 0;            // mean over the global batch; equal on every rank
  double grad_norm = 0;       // global L2 norm before clipping; equal on every rank
  double lr = 0;
  double seconds = 0;         // wall time of the step on this rank
  double forward_seconds = 0;
  double backward_seconds = 0;
  double comm_seconds = 0;    // waiting for p2p receives/sends and all-reduces
  // Of comm_seconds, waiting for the data-parallel gradient buckets' all-
  // reduces after the last backward: the part the overlap did not hide.
  // (Not the tied weight's sum, which also waits for the pipelines' first
  // stages to finish, nor the pipeline's statistics.)
  double allreduce_exposed_seconds = 0;
  double tokens_per_second = 0;  // global batch tokens / seconds
  // The training thread's share of the host snapshot: waiting for the copy
  // of the step before and starting this step's (snapshot.h).
  double snapshot_seconds = 0;
  double model_flops = 0;     // this rank's forward + backward model FLOPs this step (PaLM's count)
  double llmc_flops = 0;      // the same as llm.c counts them (profile/analytic.h)
  int64_t memory_bytes = 0;   // allocated device bytes after the step (0 on CPU)
  int64_t peak_memory_bytes = 0;  // peak allocated device bytes during the step (0 on CPU)
};

// Waits for `work`; throws std::runtime_error when it was aborted (Create,
// Step and recovery catch it and return kUnavailable).
void WaitWork(const c10::intrusive_ptr<c10d::Work>& work);



class StageWorker {
 public:
  // Builds rank `rank`'s stage on opts.device and joins its groups (blocks
  // until every peer of each group has joined, or `timeout`). `timeout` also
  // bounds every later send, receive and all-reduce.
  // REQUIRES: 0 <= rank < topo.world_size(); topo.num_layers == cfg.num_layers().
  // kConfig when opts.global_batch != topo.global_batch(), opts.microbatch !=
  // topo.microbatch_size, the sequence length exceeds n_positions, or the
  // data does not fit the model (data.Check).
  static Result<std::unique_ptr<StageWorker>> Create(
      const model::GptConfig& cfg, const Topology& topo, int rank,
      const c10::intrusive_ptr<c10d::Store>& store, const model::TrainOptions& opts,
      const model::TokenSource& data,
      std::chrono::milliseconds timeout = std::chrono::seconds(60),
      SnapshotArena* arena = nullptr);

  ~StageWorker();
  StageWorker(const StageWorker&) = delete;
  StageWorker& operator=(const StageWorker&) = delete;

  // One optimizer step (global step `step`, 0-based, selects the samples and
  // the learning rate). Collective over all ranks of the topology.
  Result<StepResult> Step(int64_t step);

  // Step without the update: zeroes the gradients, runs the schedule and
  // the gradient all-reduces, and leaves the summed (unclipped) gradients in
  // the stage's parameters. Returns loss and grad_norm; lr stays 0. For tests
  // and gradient checks.
  Result<StepResult> ForwardBackward(int64_t step);

  // Recovery. The last step whose update this worker applied (-1: none), and
  // its snapshot after step `step` if it still holds it (the last two
  // completed steps, or -1 for the initial state before any step).
  int64_t last_completed_step() const {
    Settle();
    return snapshots_[newest_].step;
  }
  const StageSnapshot* SnapshotAt(int64_t step) const;

  // Checkpoints (design/ckpt.md): keeps the snapshot after `step` from being
  // overwritten until Unpin, so another thread may persist it while
  // training goes on (later steps rotate through the other slots: the last
  // two steps stay available for recovery). nullptr when this worker holds
  // no snapshot at `step`. One pin at a time; call both on the training
  // thread.
  const StageSnapshot* Pin(int64_t step);
  void Unpin() { pinned_ = -1; }
  static constexpr int kSnapshots = SnapshotArena::kSlots;

  // Evaluation (ob-launch --eval-every): the mean loss of the current
  // weights over `batches` global batches of `eval`, forward only, through
  // the same pipelines and split as training; no state changes. Batch k's
  // sample i is `eval`'s window for (seed, kEvalStep + k, i), so every
  // evaluation of a run, before or after a recovery, sees the same tokens.
  // Every rank of the topology calls it after the same step; each gets the
  // same value. kUnavailable when a peer fails (as Step).
  static constexpr uint64_t kEvalStep = uint64_t{1} << 62;
  Result<double> Evaluate(const model::TokenSource& eval, int batches);

  // This survivor's worker in the next generation: `next` is the topology of
  // the plan's re-instantiation (BuildTopology over Recovery::next), ranks
  // matched to this one by node id and order on the node (a node running
  // several stages keeps each in its place); `fetches` the plan's fetch list;
  // `store` a store with a fresh prefix (e.g. PrefixStore "gen/1"). Every
  // rank of `next` must call it concurrently with the same step, topology
  // and fetches. The new worker holds, bit for bit, the state after step
  // `step` of the layers it runs (its own snapshot, or received from the
  // fetch list's holder over a "recovery" group), and its next call should
  // be Step(step + 1). kConfig when this worker has no snapshot at `step`,
  // its node is not in `next`, a rank of `next` is a node that was not in
  // this topology (new nodes: not supported yet), or a needed layer has no
  // fetch from a rank of `next`; kUnavailable when a peer fails. `next` may
  // have other tensor-parallel degrees: state is re-cut (Restore). Does not
  // touch this worker, which may be destroyed after.
  Result<std::unique_ptr<StageWorker>> Rebuild(
      int64_t step, const Topology& next, const std::vector<plan::LayerFetch>& fetches,
      const c10::intrusive_ptr<c10d::Store>& store,
      std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;

  // The same across processes: a worker of `topo` (rank `rank`) whose state
  // after step `step` comes from snapshots rather than from an old worker.
  // `own` is this process's snapshot at `step` (from its SnapshotArena; null
  // for a node that holds nothing, e.g. one that joined); `held[r]` says
  // which layers (and which tensor-parallel shard of them) rank r's own
  // snapshot holds, for every rank of `topo` (every rank passes the same
  // list: they derive the same transfers). A layer shard a rank needs and
  // does not hold comes from the fetch list's holder when that rank holds
  // the same shard, else from a rank of its node, else from the lowest
  // rank that holds it; when no rank holds it cut as it is now (another
  // degree), piece by piece (recovery.cc), this rank's own pieces first.
  // With `arena`, the new worker keeps its snapshots there; `arena_keep` is
  // the slot `own` lives in, left intact until the state at `step` is in
  // the other one. kConfig when a layer has no holder or `own` is missing
  // layers `held` claims; kUnavailable when a peer fails.
  struct Held {
    int first_layer = 0, last_layer = -1;   // none when first > last
    int tp = 1, tp_rank = 0;                // which shard of those layers
    LayerRanges ranges;                     // with chunks, its ranges (RangesOf)
  };
  // Where a generation that restores from snapshots starts (launch/
  // worker.cc publishes every rank's arena slots and each rank derives the
  // same answer from the same list): the step S, not before `not_before`,
  // at which every layer shard `next` runs is in some rank's complete
  // snapshot. The usual S is the least newest step among the ranks within
  // one step of the newest (a failure in the middle of a step leaves some
  // ranks a step behind, and each restores its own); when that step lacks
  // a layer, the newest step that has them all: a host left idle by one
  // recovery may hold the step before the one the next generation started
  // from (the failure landed between two pipelines' snapshots of a step),
  // and when a second failure makes it the only holder of some layers, the
  // survivors go back to the step it holds, which their arenas still keep
  // (AttachArena keeps older snapshots of the lineage). For each rank, the slot
  // at S that holds the most of the layers that rank now runs (ties: the
  // wider, then the lower slot). kDataErr naming what each rank holds when
  // no step is complete.
  struct StartChoice {
    int64_t step = -2;
    std::vector<Held> held;   // per rank of `next`, at `step`
    std::vector<int> slot;    // per rank: its slot at `step`, -1 if none
  };
  using PublishedSlots = std::array<SnapshotArena::SlotInfo, SnapshotArena::kSlots>;
  static Result<StartChoice> ChooseStart(const Topology& next, const std::vector<PublishedSlots>& published,
                                         int64_t not_before);
  static Result<std::unique_ptr<StageWorker>> Restore(
      const model::GptConfig& cfg, const Topology& topo, int rank,
      const c10::intrusive_ptr<c10d::Store>& store, const model::TrainOptions& opts,
      const model::TokenSource& data, int64_t step, const StageSnapshot* own,
      const std::vector<Held>& held, const std::vector<plan::LayerFetch>& fetches,
      std::chrono::milliseconds timeout, SnapshotArena* arena = nullptr, int arena_keep = -1);

  // Fault injection (tests and demos, ob-launch --inject): every forward
  // and backward computation of this rank takes `factor` (> 1) times as long.
  // With `spin`, the extra time is burnt on the CPU (a busy loop for as
  // much thread CPU time), as a slow computation would: a CPU throttle
  // slows it further, where a sleep would not.
  void SetSlowdown(double factor, bool spin = false) {
    slowdown_ = factor;
    spin_ = spin;
  }
  // Fault injection (ob-launch --inject RANK:stall=STEP): in step `step`,
  // just before its first backward, this rank stops making progress: the
  // training thread sleeps until the process is killed, without throwing,
  // while its other threads (heartbeats) go on, so its peers block in their
  // receives and all-reduces as under NCCL with a stuck peer.
  void SetStall(int64_t step) { stall_at_ = step; }

  // Progress (hang detection, design/recovery.md): Step advances `counter` after every
  // forward, backward, receive and collective it completes, and never
  // otherwise, so a counter that stops moving means this rank's training
  // loop is stuck (in compute or in communication). `waiting`, when set,
  // is 1 while the loop waits for a peer (a receive, a send or a
  // collective) and 0 otherwise: a rank stuck with waiting == 0 is the one
  // that stopped, the others wait for it. Both are read from other
  // threads; they must outlive the worker.
  void SetProgress(std::atomic<int64_t>* counter, std::atomic<int>* waiting = nullptr) {
    progress_ = counter;
    waiting_ = waiting;
  }

  const model::GptStage& stage() const { return stage_; }
  double join_seconds() const { return join_seconds_; }  // joining the groups in Create
  // Where a Restore's time went (seconds): building the stage (no random
  // draw: every parameter is then set), the transfers between ranks, the
  // copy of the state into the parameters and optimizer, and laying the
  // arena out (or capturing the first host snapshot). Joining the groups
  // is join_seconds(). Zero for a worker that Create made.
  struct RestoreTimes {
    double build = 0, transfers = 0, load = 0, snapshot = 0;
  };
  const RestoreTimes& restore_times() const { return restore_times_; }
  const RankInfo& info() const { return topo_.ranks[rank_]; }
  const Topology& topology() const { return topo_; }

 private:
  struct Groups;
  // `init` false: the stage's parameters are left undrawn (a restore sets
  // every one).
  StageWorker(const model::GptConfig& cfg, const Topology& topo, int rank,
              const model::TrainOptions& opts, const model::TokenSource& data, int seq_len,
              bool init);
  // Create's checks, the stage (drawn when `init`), its groups joined; no
  // snapshot yet.
  static Result<std::unique_ptr<StageWorker>> Build(
      const model::GptConfig& cfg, const Topology& topo, int rank,
      const c10::intrusive_ptr<c10d::Store>& store, const model::TrainOptions& opts,
      const model::TokenSource& data, std::chrono::milliseconds timeout, bool init);
  void JoinGroups(const c10::intrusive_ptr<c10d::Store>& store, std::chrono::milliseconds timeout);
  StepResult RunSchedule(int64_t step);        // 1F1B + all-reduces; throws
  void ApplyUpdate(StepResult* result);        // clip + AdamW; throws
  // RunSchedule's steps (stage_worker_step.cc, stage_worker_reduce.cc):
  // each instruction of the 1F1B program, the buckets' all-reduces as
  // their units finish, then what the program leaves to sum: the rest of
  // the buckets, the tied weight and the loss, and the global norm.
  struct StepState;
  void ZeroGradients();
  void RunComm(const std::vector<schedule::P2p>& comm, StepState& s);
  // Micro-batch j through chunk c (one chunk: c = 0, the stage).
  void RunForward(int j, int c, StepState& s);
  // The backward of micro-batch j through chunk c; with `weights` false
  // only its input gradient, its weight gradients kept for
  // RunWeightGradients.
  void RunBackward(int j, int c, bool weights, StepState& s);
  void RunWeightGradients(int j, int c, StepState& s);
  // Chunk c's weight gradients of one more micro-batch are summed: with
  // chunks, the buckets of every chunk done so far go on the wire, in
  // bucket order.
  void WeightsDone(int c, StepState& s);
  void IssueBucketsDownTo(int unit, StepState& s);
  struct Bucket;
  void IssueBucket(Bucket& bk, StepState& s);
  void ReduceGradients(StepState& s);
  void SumNormAndLoss(StepState& s);
  // Evaluate's steps: micro-batch j of evaluation batch k, its loss added
  // to `loss_sum` on the last stage; then the sum every rank gets.
  void EvalMicrobatch(const model::TokenSource& eval, int k, int j, const torch::TensorOptions& wire,
                      torch::Tensor& loss_sum);
  double SumEvalLoss(const torch::Tensor& loss_sum);
  // Step's copy of the state after `step` into a free snapshot slot, in the
  // background (stage_worker_snapshots.cc).
  void StartSnapshot(int64_t step);
  void SlowDown(std::chrono::steady_clock::time_point since) const;
  // Keeps the snapshots in `arena` from now on, the newest being the
  // stage's state now, after step `step`: in slot `keep` when it holds
  // exactly that (a restore from it, same layout), else copied into the
  // least useful other slot; the arena's older snapshots of the lineage
  // stay (see the definition).
  Status AttachArena(SnapshotArena* arena, int keep, int64_t step);

  model::GptConfig cfg_;
  Topology topo_;
  int rank_;
  // This rank's exchanges across its stage's boundaries (Topology::Boundary),
  // fixed for the worker's life; empty where there is no such neighbour.
  // With every stage of its pipeline, by stage (its neighbours; with chunks
  // also across the loop's wrap); its own entry empty.
  std::vector<BoundaryPeers> peers_;
  const BoundaryPeers& PeersOf(int peer_stage) const { return peers_[static_cast<size_t>(peer_stage)]; }
  model::TrainOptions opts_;
  model::TokenSource data_;
  int seq_len_;
  model::GptStage stage_{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::unique_ptr<model::ComputeCopies> copies_;  // bf16: the weights' compute copies
  std::unique_ptr<Groups> groups_;
  // Its layers, ascending (with chunks, several ranges); their parameters
  // (layer_params_[i] are held_[i]'s), the tied weight excluded; and the
  // tied weight itself (undefined if this stage has none).
  std::vector<int> held_;
  std::vector<std::vector<torch::Tensor>> layer_params_;
  std::vector<std::vector<std::string>> layer_names_;  // their names within the layer
  torch::Tensor tied_;
  // The gradients of this rank's layers live in flat buffers, one per
  // bucket: consecutive units of adjacent layers of one layer group (those
  // with one owner set), at most kBucketBytes unless one unit is larger,
  // highest first (adjacent: every holder lays a group's buckets out alike
  // whatever else it holds, with chunks too). A
  // unit is a segment of a layer (model::PlannerLayerImpl: a block's
  // attention half and its MLP half), numbered from the top of the stage
  // down, the order in which their last backward finishes; two segments of
  // one layer never share a bucket, so that a block's MLP gradients are on
  // the wire while its attention's backward runs (the stage's lowest layer
  // was otherwise exposed whole). p.grad() is a view into its bucket, so a
  // bucket's all-reduce needs no copies and can start as soon as its
  // units' last backward is done. Every owner of a layer group builds the
  // same buckets. A rank that
  // holds several pieces (topology.h: a replica of a lower degree beside
  // one of a higher) has one bucket per piece and layer run instead: its
  // gradients are whole tensors (own_grads_), whose piece views are copied
  // into the bucket when it is issued and back when it is summed.
  struct Bucket {
    int group = 0;               // topology layer-group id (its piece's)
    int unit = 0;                // its lowest unit: ready once that unit's backward is done
    int layer = 0;               // that unit's layer
    // The chunks its units are of (bit c: chunk c): it goes on the wire
    // once all are done. Buckets are laid out alike on every holder of a
    // group, whatever chunks each cuts the layers into (a replica of one
    // chunk beside a chunked one), so a bucket may span two.
    uint32_t chunks = 0;
    int64_t numel = 0;
    torch::Tensor flat;          // fp32, on the device
    std::vector<torch::Tensor> params;   // gradients bound to views of flat
    std::vector<torch::Tensor> sources;  // or piece views of own_grads_, copied
    std::vector<bool> write_back;        // sources[i] takes the sum back
    std::vector<torch::Tensor> views;    // params', then sources' slices of flat
  };
  std::vector<std::vector<torch::Tensor>> own_grads_;  // by layer, when several pieces
  // Pieces of a step shared by training and evaluation: micro-batch g of
  // `src` under key `step` (input ids on the first stage, targets on the
  // last, on the device; undefined elsewhere); where a boundary receive
  // lands (the whole [b, s, h], or this TP rank's 1/t of it); this TP
  // rank's 1/t of a boundary tensor, and the whole from the stage's shares
  // (an all-gather); and waiting for works, counting progress (Tick) and
  // marking the wait (Waiting) as hang detection needs.
  std::pair<torch::Tensor, torch::Tensor> MicroBatch(const model::TokenSource& src, int64_t step, int g) const;
  // A whole boundary tensor (b, s, h), where neighbouring stages differ in degree.
  torch::Tensor WholeBuffer(const torch::TensorOptions& wire) const;
  torch::Tensor BoundaryBuffer(const torch::TensorOptions& wire) const;
  torch::Tensor ShareOf(const torch::Tensor& whole) const;
  torch::Tensor GatherShares(const torch::Tensor& part);
  void WaitAll(std::vector<c10::intrusive_ptr<c10d::Work>>& works);
  std::vector<torch::Tensor> PieceOfGradient(const std::string& name, const torch::Tensor& grad,
                                             int piece) const;
  static constexpr int64_t kBucketBytes = int64_t{8} << 20;
  static constexpr int64_t kGradAlign = 16;  // values: 64 bytes of fp32
  void BuildBuckets();
  void AddPieceBuckets(int piece);  // BuildBuckets' buckets of one piece, not laid out yet
  void LayOutBuckets();             // their order, flat buffers and views
  void BindGradients();
  std::vector<Bucket> buckets_;
  double flops_per_microbatch_ = 0;       // PaLM's count (profile::TrainingFlopsPerToken)
  double llmc_flops_per_microbatch_ = 0;  // llm.c's (profile::LlmcFlopsPerToken)
  // The states after the last completed steps; snapshots_[newest_] the
  // latest, snapshots_[pinned_] kept for a checkpoint (-1: none), the other
  // one(s) rotate. A copy in flight (copier_) lands in snapshots_[copying_]
  // and becomes the newest when Settle() has waited for it; everything that
  // reads snapshots settles first.
  void Settle() const;
  mutable StageSnapshot snapshots_[kSnapshots];
  mutable int newest_ = 0;
  int pinned_ = -1;
  mutable int copying_ = -1;
  mutable SnapshotCopier copier_;
  SnapshotArena* arena_ = nullptr;   // where snapshots_ live when set (not owned)
  bool unprepared_[kSnapshots] = {};  // an arena slot still holding another layout's snapshot
  double join_seconds_ = 0;
  RestoreTimes restore_times_;
  double slowdown_ = 1;
  bool spin_ = false;
  int64_t stall_at_ = -1;
  std::atomic<int64_t>* progress_ = nullptr;
  std::atomic<int>* waiting_ = nullptr;
  void Tick() const {
    if (progress_ != nullptr) progress_->fetch_add(1, std::memory_order_relaxed);
  }
  void Waiting(bool on) const {
    if (waiting_ != nullptr) waiting_->store(on ? 1 : 0, std::memory_order_relaxed);
  }
};

}  // namespace ob::runtime
