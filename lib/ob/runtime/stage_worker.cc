// One pipeline stage's training step: 1F1B with c10d send/recv, gradient
// all-reduce over layer owner sets and the tied group, global-norm clipping,
// AdamW (see stage_worker.h).
//
// Shapes: ids and targets [b, t] int64; activations and their gradients
// [b, t, h] float; b = micro-batch size, t = sequence length, h = n_embd.
#include "ob/runtime/stage_worker.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <utility>

#include "ob/runtime/schedule.h"

namespace ob::runtime {

namespace {

using Clock = std::chrono::steady_clock;
using Work = c10::intrusive_ptr<c10d::Work>;
using Group = c10::intrusive_ptr<compat::Backend>;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Tags of the two messages micro-batch g sends across a stage boundary.
int ActivationTag(int g) { return 2 * g; }
int GradientTag(int g) { return 2 * g + 1; }

// Position of `rank` in the ascending list `ranks`, -1 if absent.
int LocalRank(const std::vector<int>& ranks, int rank) {
  auto it = std::find(ranks.begin(), ranks.end(), rank);
  return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
}

void Wait(const Work& work) {
  if (!work->wait()) throw std::runtime_error("c10d operation was aborted");
}

}  // namespace

// The c10d groups this rank belongs to. Groups of one rank are not created
// (null): their all-reduce is the identity.
struct StageWorker::Groups {
  Group pipeline;                                 // p2p + per-step statistics
  std::vector<std::pair<int, Group>> layers;      // (layer group id, group)
  Group tied;
};

StageWorker::StageWorker(const model::GptConfig& cfg, const Topology& topo, int rank,
                         const model::TrainOptions& opts, const model::TokenSource& data,
                         int seq_len)
    : cfg_(cfg), topo_(topo), rank_(rank), opts_(opts), data_(data), seq_len_(seq_len) {
  const RankInfo& me = topo_.ranks[rank_];
  stage_ = model::GptStage(cfg_, me.first_layer, me.last_layer, opts_.seed);
  stage_->to(opts_.device);
  stage_->train();
  optimizer_ = model::MakeOptimizer(*stage_, opts_);

  auto tied = stage_->tied_weights();
  if (!tied.empty()) tied_ = tied.front();  // one per stage: wte, or the head's own copy
  for (int l = me.first_layer; l <= me.last_layer; ++l) {
    std::vector<torch::Tensor> params;
    for (const auto& p : stage_->layer(l)->parameters()) {
      if (tied_.defined() && p.unsafeGetTensorImpl() == tied_.unsafeGetTensorImpl()) continue;
      params.push_back(p);
    }
    layer_params_.push_back(std::move(params));
  }
}

StageWorker::~StageWorker() = default;

Result<std::unique_ptr<StageWorker>> StageWorker::Create(
    const model::GptConfig& cfg, const Topology& topo, int rank,
    const c10::intrusive_ptr<c10d::Store>& store, const model::TrainOptions& opts,
    const model::TokenSource& data, std::chrono::milliseconds timeout, SnapshotArena* arena) {
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
  const int seq_len = opts.seq_len > 0 ? opts.seq_len : cfg.n_positions;
  if (seq_len > cfg.n_positions) {
    return Status::Config(cfg.name + ": sequence length " + std::to_string(seq_len) +
                          " exceeds n_positions " + std::to_string(cfg.n_positions));
  }
  OB_RETURN_IF_ERROR(data.Check(seq_len, cfg.vocab_size));
  try {
    std::unique_ptr<StageWorker> worker(new StageWorker(cfg, topo, rank, opts, data, seq_len));
    CaptureSnapshot(worker->stage_, worker->tied_, *worker->optimizer_, -1,
                    &worker->snapshots_[0]);
    if (arena != nullptr) OB_RETURN_IF_ERROR(worker->AttachArena(arena, -1));
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
  for (size_t p = 0; p < topo_.pipelines.size(); ++p) {
    auto g = join(Topology::PipelineGroupName(static_cast<int>(p)), topo_.pipelines[p]);
    if (g) groups_->pipeline = g;
  }
  for (const auto& lg : topo_.layer_groups) {
    auto g = join(lg.name(), lg.ranks);
    if (g) groups_->layers.emplace_back(lg.id, g);
  }
  groups_->tied = join(Topology::TiedGroupName(), topo_.tied);
}

const StageSnapshot* StageWorker::SnapshotAt(int64_t step) const {
  for (const auto& s : snapshots_) {
    if (s.valid() && s.step == step) return &s;
  }
  return nullptr;
}

void StageWorker::SlowDown(Clock::time_point since) const {
  if (slowdown_ <= 1) return;
  std::this_thread::sleep_for(std::chrono::duration<double>((slowdown_ - 1) * SecondsSince(since)));
}

Status StageWorker::AttachArena(SnapshotArena* arena, int keep) {
  const StageSnapshot& current = snapshots_[newest_];
  const int a = keep == 0 ? 1 : 0;
  StageSnapshot first;
  OB_RETURN_IF_ERROR(arena->Prepare(a, current, &first));
  arena->Begin(a);
  for (auto& [key, t] : first.tensors) {
    const TensorSnapshot& from = current.tensors.at(key);
    t.value.copy_(from.value);
    t.exp_avg.copy_(from.exp_avg);
    t.exp_avg_sq.copy_(from.exp_avg_sq);
    t.adam_step = from.adam_step;
  }
  first.step = current.step;
  arena->Commit(a, first);
  // The others (`keep` too: its state is in the stage by now) start empty.
  StageSnapshot views[kSnapshots];
  for (int s = 0; s < kSnapshots; ++s) {
    if (s != a) OB_RETURN_IF_ERROR(arena->Prepare(s, current, &views[s]));
  }
  views[a] = std::move(first);
  for (int s = 0; s < kSnapshots; ++s) snapshots_[s] = std::move(views[s]);
  newest_ = a;
  pinned_ = -1;
  arena_ = arena;
  return Status::Ok();
}

const StageSnapshot* StageWorker::Pin(int64_t step) {
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
    StepResult r = RunSchedule(step);
    ApplyUpdate(&r);
    const auto t_snap = Clock::now();
    int slot = -1;  // the oldest slot that is neither the newest nor pinned
    for (int s = 0; s < kSnapshots; ++s) {
      if (s == newest_ || s == pinned_) continue;
      if (slot < 0 || snapshots_[s].step < snapshots_[slot].step) slot = s;
    }
    if (arena_ != nullptr) arena_->Begin(slot);
    CaptureSnapshot(stage_, tied_, *optimizer_, step, &snapshots_[slot]);
    if (arena_ != nullptr) arena_->Commit(slot, snapshots_[slot]);
    newest_ = slot;
    r.snapshot_seconds = SecondsSince(t_snap);
    compat::Synchronize(opts_.device);
    r.seconds = SecondsSince(start);
    r.tokens_per_second =
        r.seconds > 0 ? static_cast<double>(topo_.global_batch()) * seq_len_ / r.seconds : 0;
    if (opts_.device.is_cuda()) r.memory_bytes = compat::CudaAllocatedBytes(opts_.device.index());
    return r;
  } catch (const std::exception& e) {
    return Status::Unavailable("rank " + std::to_string(rank_) + ": step " +
                               std::to_string(step) + " failed: " + FirstLine(e.what()));
  }
}

StepResult StageWorker::RunSchedule(int64_t step) {
  const RankInfo& me = topo_.ranks[rank_];
  const auto start = Clock::now();
  StepResult r;
  r.step = step;
  const auto device = opts_.device;
  const auto act_options = torch::TensorOptions().dtype(torch::kFloat).device(device);
  const int b = topo_.microbatch_size;
  const int m = me.num_microbatches;
  const double weight = 1.0 / topo_.total_microbatches;  // each micro-batch's share

  for (auto& p : stage_->parameters()) {
    if (p.grad().defined()) {
      p.mutable_grad().detach_();
      p.mutable_grad().zero_();
    } else {
      p.mutable_grad() = torch::zeros_like(p);
    }
  }

  std::vector<torch::Tensor> inputs(m), outputs(m);
  std::vector<Work> sends;
  std::vector<torch::Tensor> in_flight;  // what `sends` read from, alive until they finish
  auto loss_sum = torch::zeros({1}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  Group& pipe = groups_->pipeline;
  const int prev = me.stage - 1, next = me.stage + 1;  // ranks in the pipeline group

  for (const PipelineOp& op : OneFOneB(me.stage, me.num_stages, m)) {
    const int j = op.microbatch;
    const int g = me.first_microbatch + j;
    if (op.forward) {
      torch::Tensor input, targets;
      if (me.is_first_stage() || me.is_last_stage()) {
        auto [x, y] = model::MakeBatch(data_, opts_.seed, step, int64_t{g} * b, b, seq_len_);
        if (me.is_first_stage()) input = x.to(device);
        if (me.is_last_stage()) targets = y.to(device);
      }
      if (!me.is_first_stage()) {
        const auto t0 = Clock::now();
        input = torch::empty({b, seq_len_, cfg_.n_embd}, act_options);
        std::vector<torch::Tensor> buf{input};
        Wait(pipe->recv(buf, prev, ActivationTag(g)));
        input.requires_grad_(true);
        r.comm_seconds += SecondsSince(t0);
      }
      const auto t0 = Clock::now();
      torch::Tensor out = stage_->forward(input, targets);
      if (me.is_last_stage()) {
        loss_sum += out.detach().to(torch::kDouble) * weight;
        out = out * weight;
      }
      SlowDown(t0);
      r.forward_seconds += SecondsSince(t0);
      if (!me.is_last_stage()) {
        std::vector<torch::Tensor> buf{out.detach().contiguous()};
        sends.push_back(pipe->send(buf, next, ActivationTag(g)));
        in_flight.push_back(buf[0]);
      }
      inputs[j] = input;
      outputs[j] = out;
    } else {
      torch::Tensor grad_out;
      if (!me.is_last_stage()) {
        const auto t0 = Clock::now();
        grad_out = torch::empty({b, seq_len_, cfg_.n_embd}, act_options);
        std::vector<torch::Tensor> buf{grad_out};
        Wait(pipe->recv(buf, next, GradientTag(g)));
        r.comm_seconds += SecondsSince(t0);
      }
      const auto t0 = Clock::now();
      if (me.is_last_stage()) {
        outputs[j].backward();
      } else {
        torch::autograd::backward({outputs[j]}, {grad_out});
      }
      SlowDown(t0);
      r.backward_seconds += SecondsSince(t0);
      if (!me.is_first_stage()) {
        std::vector<torch::Tensor> buf{inputs[j].grad().contiguous()};
        sends.push_back(pipe->send(buf, prev, GradientTag(g)));
        in_flight.push_back(buf[0]);
      }
      inputs[j] = torch::Tensor();
      outputs[j] = torch::Tensor();
    }
  }

  // Data-parallel sums: each layer group's gradients as one flat buffer, the
  // tied weight's gradient and the pipelines' losses over the tied group. All
  // issued before any is waited on; every rank issues them in group order.
  const auto t_comm = Clock::now();
  struct Flat {
    torch::Tensor buffer;
    std::vector<torch::Tensor> grads;
  };
  std::vector<Flat> flats;
  std::vector<Work> reductions;
  for (auto& [id, group] : groups_->layers) {
    Flat f;
    std::vector<torch::Tensor> views;
    for (int l : topo_.layer_groups[id].layers) {
      for (const auto& p : layer_params_[l - me.first_layer]) {
        f.grads.push_back(p.grad());
        views.push_back(p.grad().reshape({-1}));
      }
    }
    if (views.empty()) continue;
    f.buffer = torch::cat(views);
    std::vector<torch::Tensor> buf{f.buffer};
    reductions.push_back(group->allreduce(buf));
    flats.push_back(std::move(f));
  }
  if (groups_->tied) {
    std::vector<torch::Tensor> grad{tied_.grad()};
    reductions.push_back(groups_->tied->allreduce(grad));
    std::vector<torch::Tensor> loss{loss_sum};
    reductions.push_back(groups_->tied->allreduce(loss));
  }
  for (const auto& w : reductions) Wait(w);
  for (const auto& w : sends) Wait(w);
  for (auto& f : flats) {
    int64_t offset = 0;
    for (auto& grad : f.grads) {
      const int64_t n = grad.numel();
      grad.copy_(f.buffer.narrow(0, offset, n).view_as(grad));
      offset += n;
    }
  }

  // Per-layer squared norms (the tied weight counted in layer 0, by the first
  // stage) and the loss, summed over the pipeline: every entry has one
  // contributor, so each pipeline gets the same vector bit for bit.
  const auto double_options = torch::TensorOptions().dtype(torch::kDouble).device(device);
  auto stats = torch::zeros({topo_.num_layers + 1}, double_options);
  for (int l = me.first_layer; l <= me.last_layer; ++l) {
    auto sq = torch::zeros({}, double_options);
    for (const auto& p : layer_params_[l - me.first_layer]) {
      sq += p.grad().to(torch::kDouble).square().sum();
    }
    if (l == 0 && tied_.defined()) sq += tied_.grad().to(torch::kDouble).square().sum();
    stats[l] = sq;
  }
  if (me.is_last_stage()) stats[topo_.num_layers] = loss_sum[0];
  if (pipe) {
    std::vector<torch::Tensor> buf{stats};
    Wait(pipe->allreduce(buf));
  }
  stats = stats.cpu();
  const double* s = stats.data_ptr<double>();
  double sum_sq = 0;
  for (int l = 0; l < topo_.num_layers; ++l) sum_sq += s[l];
  r.grad_norm = std::sqrt(sum_sq);
  r.loss = s[topo_.num_layers];
  r.comm_seconds += SecondsSince(t_comm);
  r.seconds = SecondsSince(start);
  return r;
}

void StageWorker::ApplyUpdate(StepResult* r) {
  // As torch::nn::utils::clip_grad_norm_: scale by clip / (norm + 1e-6) when below 1.
  if (opts_.grad_clip > 0) {
    const double coef = opts_.grad_clip / (r->grad_norm + 1e-6);
    if (coef < 1) {
      torch::NoGradGuard no_grad;
      for (auto& p : stage_->parameters()) p.mutable_grad().mul_(coef);
    }
  }
  r->lr = model::LearningRate(opts_, r->step);
  model::SetLearningRate(*optimizer_, r->lr);
  optimizer_->step();
}

}  // namespace ob::runtime
