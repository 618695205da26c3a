// One pipeline stage's training step: 1F1B with c10d send/recv, gradient
// all-reduce over layer owner sets and the tied group, global-norm clipping,
// AdamW (see stage_worker.h).
//
// Shapes: ids and targets [b, t] int64; activations and their gradients
// [b, t, h] in the compute dtype (fp32, or bf16 under bf16 precision);
// b = micro-batch size, t = sequence length, h = n_embd.
#include "ob/runtime/stage_worker.h"

#include <ATen/record_function.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <ctime>
#include <thread>
#include <utility>

#include "ob/clock.h"
#include "ob/profile/analytic.h"
#include "ob/runtime/schedule.h"

namespace ob::runtime {

namespace {

using Clock = std::chrono::steady_clock;
using Work = c10::intrusive_ptr<c10d::Work>;
using Group = c10::intrusive_ptr<compat::Backend>;

// Tags of the two messages micro-batch g sends across a stage boundary.
int ActivationTag(int g) { return 2 * g; }
int GradientTag(int g) { return 2 * g + 1; }

// Position of `rank` in the ascending list `ranks`, -1 if absent.
int LocalRank(const std::vector<int>& ranks, int rank) {
  auto it = std::find(ranks.begin(), ranks.end(), rank);
  return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
}

}  // namespace

void WaitWork(const c10::intrusive_ptr<c10d::Work>& work) {
  if (!work->wait()) throw std::runtime_error("c10d operation was aborted");
}

// The c10d groups this rank belongs to. Groups of one rank are not created
// (null): their all-reduce is the identity.
struct StageWorker::Groups {
  Group pipeline;                                 // this lane: p2p + per-step statistics
  Group tp;                                       // this stage's TP ranks (t > 1)
  std::vector<std::pair<int, Group>> layers;      // (layer group id, group)
  std::vector<std::pair<int, Group>> tied;        // (piece, its tied group)
};

StageWorker::StageWorker(const model::GptConfig& cfg, const Topology& topo, int rank,
                         const model::TrainOptions& opts, const model::TokenSource& data,
                         int seq_len, bool init)
    : cfg_(cfg), topo_(topo), rank_(rank), opts_(opts), data_(data), seq_len_(seq_len) {
  const RankInfo& me = topo_.ranks[rank_];
  if (!me.is_first_stage()) to_prev_ = topo_.Boundary(rank_, me.stage - 1);
  if (!me.is_last_stage()) to_next_ = topo_.Boundary(rank_, me.stage + 1);
  model::TpGroupPtr tp;
  if (me.tp > 1) {  // its group is joined later (JoinGroups), before any forward
    tp = std::make_shared<model::TpGroup>();
    tp->rank = me.tp_rank;
    tp->size = me.tp;
  }
  stage_ = model::GptStage(cfg_, me.first_layer, me.last_layer, opts_.seed, tp, init);
  for (const auto& layer : stage_->layers()) layer->set_recompute(me.recompute);  // the plan's (recompute.h)
  stage_->to(opts_.device);
  stage_->train();
  optimizer_ = model::MakeOptimizer(*stage_, opts_);
  if (opts_.precision == model::Precision::kBf16) copies_ = stage_->MakeComputeCopies(torch::kBFloat16);

  auto tied = stage_->tied_weights();
  if (!tied.empty()) tied_ = tied.front();  // one per stage: wte, or the head's own copy
  for (int l = me.first_layer; l <= me.last_layer; ++l) {
    std::vector<torch::Tensor> params;
    std::vector<std::string> names;
    for (const auto& p : stage_->layer(l)->named_parameters()) {
      if (tied_.defined() && p.value().unsafeGetTensorImpl() == tied_.unsafeGetTensorImpl()) continue;
      params.push_back(p.value());
      names.push_back(p.key());
    }
    layer_params_.push_back(std::move(params));
    layer_names_.push_back(std::move(names));
  }
  BuildBuckets();
}

StageWorker::~StageWorker() = default;

Result<std::unique_ptr<StageWorker>> StageWorker::Create(
    const model::GptConfig& cfg, const Topology& topo, int rank,
    const c10::intrusive_ptr<c10d::Store>& store, const model::TrainOptions& opts,
    const model::TokenSource& data, std::chrono::milliseconds timeout, SnapshotArena* arena) {
  OB_ASSIGN_OR_RETURN(std::unique_ptr<StageWorker> worker,
                      Build(cfg, topo, rank, store, opts, data, timeout, /*init=*/true));
  try {
    if (arena != nullptr) {
      OB_RETURN_IF_ERROR(worker->AttachArena(arena, -1, -1));
    } else {
      CaptureSnapshot(worker->stage_, worker->tied_, *worker->optimizer_, -1, &worker->snapshots_[0]);
    }
  } catch (const std::exception& e) {
    return Status::Unavailable("rank " + std::to_string(rank) + ": the first snapshot failed: " +
                               FirstLine(e.what()));
  }
  return Result<std::unique_ptr<StageWorker>>(std::move(worker));
}

Result<std::unique_ptr<StageWorker>> StageWorker::Build(
    const model::GptConfig& cfg, const Topology& topo, int rank,
    const c10::intrusive_ptr<c10d::Store>& store, const model::TrainOptions& opts,
    const model::TokenSource& data, std::chrono::milliseconds timeout, bool init) {
  OB_RETURN_IF_ERROR(cfg.Validate());
  const std::string who = "rank " + std::to_string(rank);
  if (rank < 0 || rank >= topo.world_size()) {
    return Status::Config(who + ": outside a topology of " + std::to_string(topo.world_size()) +
                          " ranks");
  }
  if (topo.num_layers != cfg.num_layers()) {
    return Status::Config(who + ": the plan has " + std::to_string(topo.num_layers) +
                          " layers, " + cfg.name + " has " + std::to_string(cfg.num_layers()));
  }
  if (opts.microbatch != topo.microbatch_size || opts.global_batch != topo.global_batch()) {
    return Status::Config(who + ": global batch " + std::to_string(opts.global_batch) +
                          " / micro-batch " + std::to_string(opts.microbatch) +
                          " do not match the plan's " + std::to_string(topo.global_batch()) +
                          " / " + std::to_string(topo.microbatch_size));
  }
  const int seq_len = cfg.seq_len_or_default(opts.seq_len);
  if (seq_len > cfg.n_positions) {
    return Status::Config(cfg.name + ": sequence length " + std::to_string(seq_len) +
                          " exceeds n_positions " + std::to_string(cfg.n_positions));
  }
  OB_RETURN_IF_ERROR(data.Check(seq_len, cfg.vocab_size));
  if (Status st = model::CheckTensorParallel(cfg, topo.ranks[rank].tp); !st.ok()) {
    return Status::Config(who + ": " + cfg.name + ": " + st.message());
  }
  try {
    std::unique_ptr<StageWorker> worker(new StageWorker(cfg, topo, rank, opts, data, seq_len, init));
    const auto t_join = Clock::now();
    worker->JoinGroups(store, timeout);
    worker->join_seconds_ = SecondsSince(t_join);
    return Result<std::unique_ptr<StageWorker>>(std::move(worker));
  } catch (const std::exception& e) {
    return Status::Unavailable(who + ": joining groups failed: " + FirstLine(e.what()));
  }
}

void StageWorker::JoinGroups(const c10::intrusive_ptr<c10d::Store>& store,
                             std::chrono::milliseconds timeout) {
  groups_ = std::make_unique<Groups>();
  // Every rank walks the same list in the same order and joins the groups it
  // is in, so no two ranks wait on each other's different groups.
  auto join = [&](const std::string& name, const std::vector<int>& ranks) -> Group {
    const int local = LocalRank(ranks, rank_);
    if (local < 0 || ranks.size() < 2) return {};
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(name, store);
    return compat::MakeProcessGroup(prefixed, local, static_cast<int>(ranks.size()),
                                    opts_.device, timeout);
  };
  for (const auto& ranks : topo_.tp_groups) {
    auto g = join(Topology::TpGroupName(ranks), ranks);
    if (g) groups_->tp = g;
  }
  if (stage_->tp()) stage_->tp()->group = groups_->tp;
  for (size_t p = 0; p < topo_.pipelines.size(); ++p) {
    auto g = join(Topology::PipelineGroupName(static_cast<int>(p)), topo_.pipelines[p]);
    if (g) groups_->pipeline = g;
  }
  for (const auto& lg : topo_.layer_groups) {
    auto g = join(lg.name(), lg.ranks);
    if (g) groups_->layers.emplace_back(lg.id, g);
  }
  for (size_t piece = 0; piece < topo_.tied.size(); ++piece) {
    auto g = join(Topology::TiedGroupName(static_cast<int>(piece)), topo_.tied[piece]);
    if (g) groups_->tied.emplace_back(static_cast<int>(piece), g);
  }
}

const StageSnapshot* StageWorker::SnapshotAt(int64_t step) const {
  Settle();
  for (const auto& s : snapshots_) {
    if (s.valid() && s.step == step) return &s;
  }
  return nullptr;
}

void StageWorker::SlowDown(Clock::time_point since) const {
  if (slowdown_ <= 1) return;
  const double extra = (slowdown_ - 1) * SecondsSince(since);
  if (!spin_) {
    std::this_thread::sleep_for(std::chrono::duration<double>(extra));
    return;
  }
  auto cpu = [] {
    timespec t{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
  };
  const double start = cpu();
  volatile uint64_t sink = 0;
  while (cpu() - start < extra) {
    for (uint64_t i = 0; i < 4096; ++i) sink = sink + i;
  }
}

namespace {

// Whether `v` has the layers, shard, keys, dtypes and shapes of `like`.
bool SameLayout(const StageSnapshot& v, const StageSnapshot& like) {
  if (v.first_layer != like.first_layer || v.last_layer != like.last_layer || v.tp != like.tp ||
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

Result<StepResult> StageWorker::ForwardBackward(int64_t step) {
  try {
    return RunSchedule(step);
  } catch (const std::exception& e) {
    return Status::Unavailable("rank " + std::to_string(rank_) + ": step " +
                               std::to_string(step) + " failed: " + FirstLine(e.what()));
  }
}

Result<StepResult> StageWorker::Step(int64_t step) {
  try {
    const auto start = Clock::now();
    StepResult r = RunSchedule(step);  // meanwhile the previous step's snapshot copies
    auto t_snap = Clock::now();
    {
      RECORD_USER_SCOPE("ob::settle");
      Settle();  // the update must not change what the copy still reads
    }
    r.snapshot_seconds = SecondsSince(t_snap);
    {
      RECORD_USER_SCOPE("ob::update");
      ApplyUpdate(&r);
    }
    t_snap = Clock::now();
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
    r.snapshot_seconds += SecondsSince(t_snap);
    if (opts_.device.is_cuda()) {
      RECORD_USER_SCOPE("ob::step_end");
      compat::Synchronize(opts_.device);  // the step's kernels, not the snapshot's side stream
      r.memory_bytes = compat::CudaAllocatedBytes(opts_.device.index());
      r.peak_memory_bytes = compat::CudaPeakAllocatedBytes(opts_.device.index());
    }
    r.seconds = SecondsSince(start);
    r.tokens_per_second =
        r.seconds > 0 ? static_cast<double>(topo_.global_batch()) * seq_len_ / r.seconds : 0;
    return r;
  } catch (const std::exception& e) {
    return Status::Unavailable("rank " + std::to_string(rank_) + ": step " +
                               std::to_string(step) + " failed: " + FirstLine(e.what()));
  }
}

void StageWorker::Settle() const {
  StageSnapshot* done = copier_.Wait();
  if (done == nullptr) return;
  newest_ = copying_;  // committed to the arena by the copier
  copying_ = -1;
}

std::vector<torch::Tensor> StageWorker::PieceOfGradient(const std::string& name, const torch::Tensor& grad,
                                                        int piece) const {
  const RankInfo& me = topo_.ranks[rank_];
  return model::PieceViews(name, grad, me.tp, me.tp_rank, topo_.pieces, piece, cfg_.vocab_size);
}

void StageWorker::BuildBuckets() {
  const RankInfo& me = topo_.ranks[rank_];
  const int first_piece = topo_.FirstPieceOf(rank_), num_pieces = topo_.PiecesOf(rank_);
  buckets_.clear();
  own_grads_.clear();
  if (num_pieces > 1) {  // whole gradients, their pieces copied in and out of the buckets
    for (const auto& params : layer_params_) {
      std::vector<torch::Tensor> grads;
      for (const auto& p : params) grads.push_back(torch::zeros_like(p));
      own_grads_.push_back(std::move(grads));
    }
  }
  const auto flat_options = torch::TensorOptions().dtype(torch::kFloat).device(opts_.device);
  for (int piece = first_piece; piece < first_piece + num_pieces; ++piece) {
    const size_t first_bucket = buckets_.size();
    // Units from the top down: the order their last backward finishes in.
    int unit = 0;
    for (int l = me.last_layer; l >= me.first_layer; --l) {
      const size_t i = static_cast<size_t>(l - me.first_layer);
      const int group = topo_.layer_group_of[l] + piece;  // the holders of this piece of l
      const model::PlannerLayer& layer = stage_->layer(l);
      for (int seg = layer->num_segments() - 1; seg >= 0; --seg, ++unit) {
        // What of the unit goes in: the whole gradients (one piece a rank),
        // or views of each gradient's piece (a replicated parameter in every
        // piece's bucket, its sum the same in each; written back from the first).
        std::vector<torch::Tensor> params, sources;
        std::vector<bool> back;
        int64_t numel = 0;
        for (size_t j = 0; j < layer_params_[i].size(); ++j) {
          if (layer->segment_of(layer_names_[i][j]) != seg) continue;
          if (num_pieces == 1) {
            params.push_back(layer_params_[i][j]);
            numel += layer_params_[i][j].numel();
            continue;
          }
          const bool replicated = model::ShardKindOf(layer_names_[i][j]) == model::ShardKind::kReplicated;
          for (const auto& v : PieceOfGradient(layer_names_[i][j], own_grads_[i][j], piece)) {
            sources.push_back(v);
            back.push_back(!replicated || piece == first_piece);
            numel += v.numel();
          }
        }
        if (numel == 0) continue;
        const bool join = buckets_.size() > first_bucket && buckets_.back().group == group &&
                          buckets_.back().unit == unit - 1 && buckets_.back().layer != l &&
                          (buckets_.back().numel + numel) * 4 <= kBucketBytes;
        if (!join) {
          Bucket bk;
          bk.group = group;
          buckets_.push_back(std::move(bk));
        }
        Bucket& bk = buckets_.back();
        bk.unit = unit;
        bk.layer = l;
        bk.numel += numel;
        // Within a bucket, lower units first: prepend this unit's.
        params.insert(params.end(), bk.params.begin(), bk.params.end());
        bk.params = std::move(params);
        sources.insert(sources.end(), bk.sources.begin(), bk.sources.end());
        bk.sources = std::move(sources);
        back.insert(back.end(), bk.write_back.begin(), bk.write_back.end());
        bk.write_back = std::move(back);
      }
    }
  }
  // Issue order: highest units first, pieces ascending within them.
  std::stable_sort(buckets_.begin(), buckets_.end(), [](const Bucket& a, const Bucket& b) { return a.unit < b.unit; });
  // Each view starts on a multiple of kGradAlign values, so that a
  // gradient's reductions (the norm, below) read it from an aligned
  // address whatever the bucket: on a GPU the order of a sum depends on
  // whether it can load vectors, and every layout must sum alike.
  auto aligned = [](int64_t n) { return (n + kGradAlign - 1) / kGradAlign * kGradAlign; };
  for (auto& bk : buckets_) {
    int64_t size = 0;
    for (const auto& p : bk.params) size += aligned(p.numel());
    for (const auto& v : bk.sources) size += aligned(v.numel());
    bk.flat = torch::zeros({size}, flat_options);
    int64_t offset = 0;
    for (const auto& p : bk.params) {
      bk.views.push_back(bk.flat.narrow(0, offset, p.numel()).view(p.sizes()));
      offset += aligned(p.numel());
    }
    for (const auto& v : bk.sources) {
      bk.views.push_back(bk.flat.narrow(0, offset, v.numel()).view(v.sizes()));
      offset += aligned(v.numel());
    }
  }
  flops_per_microbatch_ = 0;
  const double tokens = static_cast<double>(topo_.microbatch_size) * seq_len_;
  for (int l = me.first_layer; l <= me.last_layer; ++l) {
    flops_per_microbatch_ +=
        profile::TrainingFlopsPerToken(cfg_, stage_->layer(l)->kind(), seq_len_) * tokens / me.tp;
  }
}

void StageWorker::WaitAll(std::vector<c10::intrusive_ptr<c10d::Work>>& works) {
  Waiting(true);
  for (const auto& w : works) {
    WaitWork(w);
    Tick();
  }
  Waiting(false);
  works.clear();
}

std::pair<torch::Tensor, torch::Tensor> StageWorker::MicroBatch(const model::TokenSource& src, int64_t step,
                                                                 int g) const {
  const RankInfo& me = topo_.ranks[rank_];
  torch::Tensor input, targets;
  if (me.is_first_stage() || me.is_last_stage()) {
    const int b = topo_.microbatch_size;
    auto [x, y] = model::MakeBatch(src, opts_.seed, step, int64_t{g} * b, b, seq_len_);
    // On CUDA through page-locked memory, without waiting: a pageable copy
    // would synchronise the stream, twice a micro-batch, idling the GPU
    // while the host queues the next kernels.
    const bool cuda = opts_.device.is_cuda();
    auto to_device = [&](const torch::Tensor& h) {
      return cuda ? h.pin_memory().to(opts_.device, /*non_blocking=*/true) : h.to(opts_.device);
    };
    if (me.is_first_stage()) input = to_device(x);
    if (me.is_last_stage()) targets = to_device(y);
  }
  return {input, targets};
}

torch::Tensor StageWorker::WholeBuffer(const torch::TensorOptions& wire) const {
  return torch::empty({topo_.microbatch_size, seq_len_, cfg_.n_embd}, wire);
}

torch::Tensor StageWorker::BoundaryBuffer(const torch::TensorOptions& wire) const {
  const int t = topo_.ranks[rank_].tp;
  if (t == 1) return WholeBuffer(wire);
  return torch::empty({int64_t{topo_.microbatch_size} * seq_len_ * cfg_.n_embd / t}, wire);
}

torch::Tensor StageWorker::ShareOf(const torch::Tensor& whole) const {
  const RankInfo& me = topo_.ranks[rank_];
  return me.tp == 1 ? whole : whole.reshape({-1}).chunk(me.tp)[me.tp_rank].contiguous();
}

torch::Tensor StageWorker::GatherShares(const torch::Tensor& part) {
  // As raw 16-bit words when bf16: the all-gather moves bytes.
  const auto as = part.scalar_type() == torch::kBFloat16 ? torch::kShort : part.scalar_type();
  std::vector<torch::Tensor> in{part.view(as)};
  std::vector<std::vector<torch::Tensor>> out(1);
  for (int i = 0; i < topo_.ranks[rank_].tp; ++i) out[0].push_back(torch::empty_like(in[0]));
  std::vector<Work> w{groups_->tp->allgather(out, in)};
  WaitAll(w);
  return torch::cat(out[0]).view(part.scalar_type()).view({topo_.microbatch_size, seq_len_, cfg_.n_embd});
}

Result<double> StageWorker::Evaluate(const model::TokenSource& eval, int batches) {
  try {
    const RankInfo& me = topo_.ranks[rank_];
    const auto device = opts_.device;
    const bool bf16 = opts_.precision == model::Precision::kBf16;
    const auto wire = torch::TensorOptions().dtype(bf16 ? torch::kBFloat16 : torch::kFloat).device(device);
    const int t = me.tp;
    const double weight = 1.0 / topo_.total_microbatches;
    Group& pipe = groups_->pipeline;
    torch::NoGradGuard no_grad;
    // bf16: the weights' compute copies, made anew (the update since the
    // step's changed the weights), not a cast of every weight a micro-batch.
    if (copies_) copies_->Refresh();
    model::ComputeCopies::Scope use_copies(copies_.get());
    auto wait = [&](std::vector<Work> works) { WaitAll(works); };
    auto loss_sum = torch::zeros({1}, torch::TensorOptions().dtype(torch::kDouble).device(device));
    // Forward only, micro-batch by micro-batch: receive, compute, send. A
    // chain, so no two stages wait on each other; tags after training's.
    for (int k = 0; k < batches; ++k) {
      const int64_t key = static_cast<int64_t>(kEvalStep) + k;
      for (int j = 0; j < me.num_microbatches; ++j) {
        const int g = me.first_microbatch + j;
        const int tag = 2 * (k * topo_.total_microbatches + g);
        auto [input, targets] = MicroBatch(eval, key, g);
        if (!me.is_first_stage()) {
          const BoundaryPeers& peers = to_prev_;
          compat::P2pMessage msg;
          msg.send = false;
          msg.peer = topo_.LaneIndex(rank_, peers.receive_from);
          msg.tag = tag;
          msg.tensor = peers.whole ? WholeBuffer(wire) : BoundaryBuffer(wire);
          wait(compat::PostP2p(*pipe, {msg}));
          input = t > 1 && !peers.whole ? GatherShares(msg.tensor) : msg.tensor;
        }
        torch::Tensor out;
        {
          compat::AutocastGuard autocast(device, bf16);
          out = stage_->forward(input, targets);
        }
        Tick();
        if (me.is_last_stage()) {
          loss_sum += out.detach().to(torch::kDouble) * weight;
        } else {
          const BoundaryPeers& peers = to_next_;
          compat::P2pMessage msg;
          msg.tag = tag;
          const torch::Tensor whole = out.detach().to(wire.dtype()).contiguous();
          msg.tensor = peers.whole ? whole : ShareOf(whole);
          std::vector<compat::P2pMessage> batch;
          for (int to : peers.send_to) {
            msg.peer = topo_.LaneIndex(rank_, to);
            batch.push_back(msg);
          }
          if (!batch.empty()) wait(compat::PostP2p(*pipe, batch));
        }
      }
    }
    // The pipelines' sums: over TP rank 0 of every first and last stage
    // (the tied group of piece 0), then from the last stage down its lane
    // and across its TP group, so that every rank holds the total.
    auto v = (me.is_last_stage() && me.tp_rank == 0) ? loss_sum : torch::zeros_like(loss_sum);
    for (auto& [piece, group] : groups_->tied) {
      if (piece != 0) continue;
      std::vector<torch::Tensor> buf{v};
      wait({group->allreduce(buf)});
    }
    if (!(me.is_last_stage() && me.tp_rank == 0)) v.zero_();
    if (pipe) {
      std::vector<torch::Tensor> buf{v};
      wait({pipe->allreduce(buf)});
    }
    if (groups_->tp && me.lane_base < 0) {  // a mixed pipeline's lane reached every rank
      std::vector<torch::Tensor> buf{v};
      wait({groups_->tp->allreduce(buf)});
    }
    return v.cpu().item<double>() / batches;
  } catch (const std::exception& e) {
    return Status::Unavailable("rank " + std::to_string(rank_) + ": evaluation failed: " + FirstLine(e.what()));
  }
}

void StageWorker::BindGradients() {
  // Rebinding each step keeps p.grad() a view of its bucket whatever
  // replaced it (LibTorch accumulates into an existing gradient in place).
  for (auto& bk : buckets_) {
    for (size_t i = 0; i < bk.params.size(); ++i) bk.params[i].mutable_grad() = bk.views[i];
  }
  for (size_t i = 0; i < own_grads_.size(); ++i) {
    for (size_t j = 0; j < own_grads_[i].size(); ++j) layer_params_[i][j].mutable_grad() = own_grads_[i][j];
  }
  if (tied_.defined() && !tied_.grad().defined()) tied_.mutable_grad() = torch::zeros_like(tied_);
}

StepResult StageWorker::RunSchedule(int64_t step) {
  const RankInfo& me = topo_.ranks[rank_];
  const auto start = Clock::now();
  StepResult r;
  r.step = step;
  const auto device = opts_.device;
  const bool bf16 = opts_.precision == model::Precision::kBf16;
  // Activations and their gradients cross stage boundaries in the compute
  // dtype, the residual stream's (model/gpt.cc, Norm).
  const auto wire = torch::TensorOptions().dtype(bf16 ? torch::kBFloat16 : torch::kFloat).device(device);
  const int m = me.num_microbatches;
  const double weight = 1.0 / topo_.total_microbatches;  // each micro-batch's share
  if (device.is_cuda()) compat::CudaResetPeak(device.index());

  BindGradients();
  for (auto& bucket : buckets_) bucket.flat.zero_();
  for (auto& grads : own_grads_) {
    for (auto& g : grads) g.zero_();
  }
  if (tied_.defined()) tied_.mutable_grad().zero_();

  compat::DeviceTimer forward_timer(device), backward_timer(device);
  std::vector<torch::Tensor> received(m), grads_in(m);  // what comm batches deliver
  std::vector<torch::Tensor> inputs(m), outputs(m), sent(m);
  // The last micro-batch runs unit by unit (detached at each layer
  // segment's input), so that its backward can hand each bucket to the
  // all-reduce as soon as the bucket's units are done.
  std::vector<torch::Tensor> seg_in, seg_out;
  auto loss_sum = torch::zeros({1}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  Group& pipe = groups_->pipeline;
  const bool overlap = opts_.overlap_allreduce;

  // Data-parallel reductions, issued in bucket order (highest layers first)
  // on every rank, then the tied weight's gradient and the loss: one global
  // order over all groups, so no two ranks wait for each other's different
  // collectives under NCCL.
  std::vector<Work> reductions;
  size_t next_bucket = 0;
  auto issue_buckets_down_to = [&](int unit) {  // units 0..unit (from the top) are done
    for (; next_bucket < buckets_.size() && buckets_[next_bucket].unit <= unit; ++next_bucket) {
      Bucket& bk = buckets_[next_bucket];
      for (size_t i = 0; i < bk.sources.size(); ++i) bk.views[bk.params.size() + i].copy_(bk.sources[i]);
      for (auto& [id, group] : groups_->layers) {
        if (id != bk.group) continue;
        std::vector<torch::Tensor> buf{bk.flat};
        reductions.push_back(group->allreduce(buf));
      }
    }
  };

  auto wait_all = [&](std::vector<Work>& works) { WaitAll(works); };

  // Across a stage boundary each TP rank of a lane sends its 1/t of the
  // tensor (every rank of a stage holds the whole, the same), and the
  // receiving stage's TP group all-gathers it: one copy crosses between
  // the stages, in t parallel parts, instead of t copies (or one rank's
  // send and a broadcast, which moves as much within the node and puts
  // the boundary on one link).
  const int t = me.tp;
  auto share = [&](const torch::Tensor& whole) { return ShareOf(whole); };
  auto gather = [&](const torch::Tensor& part) { return GatherShares(part); };

  // bf16: the weights' compute copies, rewritten by one multi-tensor copy
  // (model/compute_copies.h); anything else autocast casts is cast once a
  // step, not once a micro-batch (the weights change only in ApplyUpdate,
  // after this).
  if (copies_) copies_->Refresh();
  std::optional<model::ComputeCopies::Scope> use_copies(std::in_place, copies_.get());
  std::optional<compat::AutocastCacheScope> cast_once(std::in_place, bf16);
  for (const StageInstr& in : StageProgram(me.stage, me.num_stages, m)) {
    const int j = in.microbatch;
    const int g = me.first_microbatch + j;
    switch (in.kind) {
      case StageInstr::kComm: {
        RECORD_USER_SCOPE("ob::p2p");
        const auto t0 = Clock::now();
        std::vector<compat::P2pMessage> batch;
        std::vector<torch::Tensor> keep;  // what sends read, alive until they finish
        std::vector<torch::Tensor*> parts;  // received shares to all-gather (t > 1)
        for (const P2p& p : in.comm) {
          const int gj = me.first_microbatch + p.microbatch;
          const BoundaryPeers& peers = PeersOf(p.peer);
          compat::P2pMessage msg;
          msg.send = p.send;
          msg.tag = p.activation ? ActivationTag(gj) : GradientTag(gj);
          if (p.send) {
            torch::Tensor whole = p.activation ? sent[p.microbatch]
                                               : inputs[p.microbatch].grad().to(wire.dtype()).contiguous();
            msg.tensor = peers.whole ? whole : share(whole);
            if (!p.activation) inputs[p.microbatch] = torch::Tensor();
            if (p.activation) sent[p.microbatch] = torch::Tensor();
            keep.push_back(msg.tensor);
            for (int to : peers.send_to) {  // none, where a wider stage's other ranks serve it
              msg.peer = topo_.LaneIndex(rank_, to);
              batch.push_back(msg);
            }
          } else {
            msg.peer = topo_.LaneIndex(rank_, peers.receive_from);
            msg.tensor = peers.whole ? WholeBuffer(wire) : BoundaryBuffer(wire);
            torch::Tensor& slot = (p.activation ? received : grads_in)[p.microbatch];
            slot = msg.tensor;
            if (t > 1 && !peers.whole) parts.push_back(&slot);
            batch.push_back(std::move(msg));
          }
        }
        if (batch.empty()) break;
        auto works = compat::PostP2p(*pipe, batch);
        wait_all(works);
        for (torch::Tensor* slot : parts) *slot = gather(*slot);
        r.comm_seconds += SecondsSince(t0);
        break;
      }
      case StageInstr::kForward: {
        RECORD_USER_SCOPE("ob::forward");
        auto [input, targets] = MicroBatch(data_, step, g);
        if (!me.is_first_stage()) {
          input = received[j].requires_grad_(true);
          received[j] = torch::Tensor();
        }
        const auto t0 = Clock::now();
        forward_timer.Start();
        torch::Tensor out;
        {
          compat::AutocastGuard autocast(device, bf16);
          if (overlap && j == m - 1) {
            torch::Tensor x = input;
            for (const auto& layer : stage_->layers()) {
              for (int seg = 0; seg < layer->num_segments(); ++seg) {
                torch::Tensor xin = x;
                if (x.is_floating_point()) xin = x.detach().requires_grad_(true);
                seg_in.push_back(xin);
                x = layer->forward_segment(seg, xin, targets);
                seg_out.push_back(x);
              }
            }
            out = x;
          } else {
            out = stage_->forward(input, targets);
          }
        }
        if (me.is_last_stage()) {
          loss_sum += out.detach().to(torch::kDouble) * weight;
          out = out.to(torch::kFloat) * weight;
          if (!seg_out.empty()) seg_out.back() = out;
        }
        forward_timer.Stop();
        SlowDown(t0);
        r.forward_seconds += SecondsSince(t0);
        Tick();
        if (!me.is_last_stage()) sent[j] = out.detach().to(wire.dtype()).contiguous();
        inputs[j] = input;
        outputs[j] = out;
        break;
      }
      case StageInstr::kBackward: {
        RECORD_USER_SCOPE("ob::backward");
        if (stall_at_ == step) {  // fault injection: stop making progress, stay alive
          for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
        }
        const auto t0 = Clock::now();
        backward_timer.Start();
        torch::Tensor grad_out;
        if (!me.is_last_stage()) {
          grad_out = grads_in[j].to(outputs[j].scalar_type());
          grads_in[j] = torch::Tensor();
        }
        if (overlap && j == m - 1) {
          // Unit by unit (a layer's segments), highest first; a bucket's
          // all-reduce starts once its lowest unit is done.
          torch::Tensor grad = grad_out;
          const int units = static_cast<int>(seg_out.size());
          for (int k = units - 1; k >= 0; --k) {
            if (grad.defined()) {
              torch::autograd::backward({seg_out[k]}, {grad});
            } else {
              seg_out[k].backward();
            }
            const torch::Tensor& xin = seg_in[k];
            grad = k > 0 ? xin.grad() : torch::Tensor();
            if (k == 0 && xin.requires_grad()) {
              // The stage input's gradient goes back to the previous stage.
              inputs[j].mutable_grad() = xin.grad();
            }
            issue_buckets_down_to(units - 1 - k);
          }
          seg_in.clear();
          seg_out.clear();
        } else if (me.is_last_stage()) {
          outputs[j].backward();
        } else {
          torch::autograd::backward({outputs[j]}, {grad_out});
        }
        backward_timer.Stop();
        SlowDown(t0);
        r.backward_seconds += SecondsSince(t0);
        Tick();
        outputs[j] = torch::Tensor();
        if (me.is_first_stage()) inputs[j] = torch::Tensor();
        break;
      }
    }
  }

  cast_once.reset();
  use_copies.reset();

  // Whatever was not handed over during the last backward (all of it
  // without overlap), then the tied weight and the pipelines' losses.
  // allreduce_exposed_seconds is the wait for the buckets; the tied group
  // also waits for the far end of every pipeline (its first stages finish
  // last), which the overlap cannot change: that wait is communication
  // time but not part of the exposed all-reduce.
  const auto t_comm = Clock::now();
  std::optional<at::RecordFunction> phase(std::in_place, at::RecordScope::USER_SCOPE);
  if (phase->isActive()) phase->before("ob::allreduce");
  issue_buckets_down_to(std::numeric_limits<int>::max());
  std::vector<Work> tied_sums;
  std::vector<torch::Tensor> spare_losses;  // a rank of several pieces: the later pieces' copies
  for (auto& [piece, group] : groups_->tied) {
    if (tied_.defined()) {  // an untied model (cfg_.tied false) sums only the losses here
      std::vector<torch::Tensor> grad{tied_.grad()};
      if (topo_.PiecesOf(rank_) > 1) grad = {PieceOfGradient("wte.weight", tied_.grad(), piece).front()};
      tied_sums.push_back(group->allreduce(grad));
    }
    std::vector<torch::Tensor> loss{loss_sum};
    if (piece != topo_.FirstPieceOf(rank_)) {
      spare_losses.push_back(loss_sum.clone());
      loss = {spare_losses.back()};
    }
    tied_sums.push_back(group->allreduce(loss));
  }
  wait_all(reductions);
  for (auto& bk : buckets_) {
    for (size_t i = 0; i < bk.sources.size(); ++i) {
      if (bk.write_back[i]) bk.sources[i].copy_(bk.views[bk.params.size() + i]);
    }
  }
  r.allreduce_exposed_seconds = SecondsSince(t_comm);
  wait_all(tied_sums);

  // Squared norms per layer and piece (the tied weight counted in layer 0,
  // by the first stage; a replicated parameter once, in piece 0) and the
  // loss, summed over the TP group and the pipeline: every entry has one
  // contributor and is computed from the same views of the same summed
  // gradient in every pipeline, whatever its degree, so each pipeline gets
  // the same vector bit for bit. Each part's norm comes from one
  // multi-tensor kernel (one reduction a parameter was ~1,200 kernels a
  // gpt2-medium step on a GPU); its square goes into its entry in double,
  // on the host, in the parameters' order. A part is read contiguous and
  // aligned (kGradAlign), so that its norm is a function of its values
  // alone: a GPU's summation order depends on alignment.
  phase.emplace(at::RecordScope::USER_SCOPE);
  if (phase->isActive()) phase->before("ob::grad_norm");
  const int T = topo_.pieces, first_piece = topo_.FirstPieceOf(rank_);
  std::vector<torch::Tensor> parts;
  std::vector<int> entry_of;  // stats entry of each part
  auto add_part = [&](const torch::Tensor& v, int entry) {
    const bool aligned =
        reinterpret_cast<uintptr_t>(v.data_ptr()) % (kGradAlign * v.element_size()) == 0;
    parts.push_back(v.is_contiguous() && aligned ? v : v.clone(at::MemoryFormat::Contiguous));
    entry_of.push_back(entry);
  };
  auto add_pieces = [&](const std::string& name, const torch::Tensor& grad, int piece, int entry) {
    for (const auto& v : PieceOfGradient(name, grad, piece)) add_part(v, entry);
  };
  for (int l = me.first_layer; l <= me.last_layer; ++l) {
    const size_t i = static_cast<size_t>(l - me.first_layer);
    for (int piece = first_piece; piece < first_piece + topo_.PiecesOf(rank_); ++piece) {
      const int entry = l * T + piece;
      for (size_t j = 0; j < layer_params_[i].size(); ++j) {
        const std::string& name = layer_names_[i][j];
        if (model::ShardKindOf(name) == model::ShardKind::kReplicated) {
          if (piece == 0) add_part(layer_params_[i][j].grad(), entry);
        } else {
          add_pieces(name, layer_params_[i][j].grad(), piece, entry);
        }
      }
      if (l == 0 && tied_.defined()) add_pieces("wte.weight", tied_.grad(), piece, entry);
    }
  }
  std::vector<double> entries(static_cast<size_t>(topo_.num_layers * T + 1), 0.0);
  if (!parts.empty()) {
    torch::NoGradGuard no_grad;
    const torch::Tensor norms = torch::stack(at::_foreach_norm(parts, 2)).to(torch::kDouble).cpu();
    const double* n = norms.data_ptr<double>();
    for (size_t k = 0; k < parts.size(); ++k) entries[static_cast<size_t>(entry_of[k])] += n[k] * n[k];
  }
  if (me.is_last_stage() && me.tp_rank == 0) entries.back() = loss_sum.item<double>();
  auto stats = torch::from_blob(entries.data(), {static_cast<int64_t>(entries.size())}, torch::kDouble).clone();
  if (groups_->tp || pipe) stats = stats.to(device);
  if (groups_->tp) {  // the shards' sums first, then the lane's: the same on every rank
    std::vector<torch::Tensor> buf{stats};
    std::vector<Work> w{groups_->tp->allreduce(buf)};
    wait_all(w);
    // A mixed pipeline's one lane holds every TP rank: one contribution a stage.
    if (me.lane_base >= 0 && me.tp_rank != 0) stats.zero_();
  }
  if (pipe) {
    std::vector<torch::Tensor> buf{stats};
    std::vector<Work> w{pipe->allreduce(buf)};
    wait_all(w);
  }
  stats = stats.cpu();
  const double* s = stats.data_ptr<double>();
  double sum_sq = 0;
  for (int e = 0; e < topo_.num_layers * T; ++e) sum_sq += s[e];
  phase.reset();
  r.grad_norm = std::sqrt(sum_sq);
  r.loss = s[topo_.num_layers * T];
  r.comm_seconds += SecondsSince(t_comm);
  if (device.is_cuda()) {  // event-timed: the device's own time, not the launches'
    r.forward_seconds = forward_timer.Seconds();
    r.backward_seconds = backward_timer.Seconds();
  }
  r.model_flops = flops_per_microbatch_ * m;
  r.seconds = SecondsSince(start);
  return r;
}

void StageWorker::ApplyUpdate(StepResult* r) {
  // As torch::nn::utils::clip_grad_norm_: scale by clip / (norm + 1e-6) when below 1.
  if (opts_.grad_clip > 0) {
    const double coef = opts_.grad_clip / (r->grad_norm + 1e-6);
    if (coef < 1) {
      torch::NoGradGuard no_grad;
      std::vector<torch::Tensor> grads;  // one multi-tensor kernel on CUDA, not one per parameter
      for (auto& p : stage_->parameters()) {
        if (p.grad().defined()) grads.push_back(p.grad());
      }
      at::_foreach_mul_(grads, coef);
    }
  }
  r->lr = model::LearningRate(opts_, r->step);
  model::SetLearningRate(*optimizer_, r->lr);
  model::OptimizerStep(*optimizer_);
}

}  // namespace ob::runtime
