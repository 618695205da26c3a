// A StageWorker's training step (see stage_worker.h): Step and
// ForwardBackward around RunSchedule, which runs the step's program on this
// rank (its schedule's message batches, forwards, backwards or their B and
// W halves; with overlap the last micro-batch's backward, or its W, unit by
// unit, each finished bucket's all-reduce issued at once) and leaves the rest of the sums to
// stage_worker_reduce.cc; then ApplyUpdate's clipping and AdamW step.
#include "ob/runtime/stage_worker.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "ob/clock.h"
#include "ob/schedule/program.h"
#include "ob/runtime/stage_worker_impl.h"

namespace ob::runtime {

namespace {

// Tags of the two messages micro-batch g sends across virtual boundary
// `link` of a pipeline of `chunks` chunks a stage: 2·(g·v + c) + kind, c the
// chunk of the link's lower end. One chunk: 2g and 2g + 1. Unique per
// ordered pair of ranks: two links between the same two stages in the
// same direction belong to different chunks.
int ActivationTag(int g, int chunk, int chunks) { return 2 * (g * chunks + chunk); }
int GradientTag(int g, int chunk, int chunks) { return 2 * (g * chunks + chunk) + 1; }

}  // namespace

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
    StartSnapshot(step);
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

StepResult StageWorker::RunSchedule(int64_t step) {
  const RankInfo& me = topo_.ranks[rank_];
  const auto start = Clock::now();
  const auto device = opts_.device;
  if (device.is_cuda()) compat::CudaResetPeak(device.index());
  ZeroGradients();
  StepState s(device, opts_.precision == model::Precision::kBf16, me.num_microbatches,
              1.0 / topo_.total_microbatches, me.Chain(), me.stage);  // each micro-batch's share
  StepResult& r = s.r;
  r.step = step;

  // bf16: the weights' compute copies, rewritten by one multi-tensor copy
  // (model/compute_copies.h); anything else autocast casts is cast once a
  // step, not once a micro-batch (the weights change only in ApplyUpdate,
  // after this).
  if (copies_) copies_->Refresh();
  std::optional<model::ComputeCopies::Scope> use_copies(std::in_place, copies_.get());
  std::optional<compat::AutocastCacheScope> cast_once(std::in_place, s.bf16);
  for (const schedule::StageInstr& in : me.Program()) {
    if (in.kind == schedule::StageInstr::kComm) {
      RunComm(in.comm, s);
      continue;
    }
    const int j = in.op.microbatch, c = in.op.chunk;
    switch (in.op.type) {
      case schedule::Op::kForward: RunForward(j, c, s); break;
      case schedule::Op::kBackward: RunBackward(j, c, true, s); break;
      case schedule::Op::kInputGrad: RunBackward(j, c, false, s); break;
      case schedule::Op::kWeightGrad: RunWeightGradients(j, c, s); break;
    }
  }
  cast_once.reset();
  use_copies.reset();
  {  // the sends still on the wire (RunComm)
    const auto t0 = Clock::now();
    WaitAll(s.sends);
    s.sending.clear();
    s.r.comm_seconds += SecondsSince(t0);
  }

  ReduceGradients(s);
  SumNormAndLoss(s);
  if (device.is_cuda()) {  // event-timed: the device's own time, not the launches'
    r.forward_seconds = s.forward_timer.Seconds();
    r.backward_seconds = s.backward_timer.Seconds();
  }
  r.model_flops = flops_per_microbatch_ * s.m;
  r.llmc_flops = llmc_flops_per_microbatch_ * s.m;
  r.seconds = SecondsSince(start);
  return r;
}

void StageWorker::RunComm(const std::vector<schedule::P2p>& comm, StepState& s) {
  const RankInfo& me = topo_.ranks[rank_];
  Group& pipe = groups_->pipeline;
  // Across a stage boundary each TP rank of a lane sends its 1/t of the
  // tensor (every rank of a stage holds the whole, the same), and the
  // receiving stage's TP group all-gathers it: one copy crosses between
  // the stages, in t parallel parts, instead of t copies (or one rank's
  // send and a broadcast, which moves as much within the node and puts
  // the boundary on one link).
  const int t = me.tp;
  RECORD_USER_SCOPE("ob::p2p");
  const auto t0 = Clock::now();
  std::vector<compat::P2pMessage> batch;
  std::vector<torch::Tensor> keep;  // what sends read, alive until they finish
  std::vector<torch::Tensor*> parts;  // received shares to all-gather (t > 1)
  for (const schedule::P2p& p : comm) {
    const int gj = me.first_microbatch + p.microbatch;
    const BoundaryPeers& peers = PeersOf(p.peer);
    // The link joins virtual stages p.link and p.link + 1: an activation
    // leaves the lower end's chunk and a gradient its upper end's.
    const int lower = s.chain.ChunkOf(p.link), upper = s.chain.ChunkOf(p.link + 1);
    const int c = p.activation == p.send ? lower : upper;  // this end's chunk
    const size_t k = s.At(p.microbatch, c);
    compat::P2pMessage msg;
    msg.send = p.send;
    msg.tag = p.activation ? ActivationTag(gj, lower, s.chain.chunks) : GradientTag(gj, lower, s.chain.chunks);
    if (p.send) {
      torch::Tensor whole = p.activation ? s.sent[k] : s.inputs[k].grad().to(s.wire.dtype()).contiguous();
      msg.tensor = peers.whole ? whole : ShareOf(whole);
      if (!p.activation) s.inputs[k] = torch::Tensor();
      if (p.activation) s.sent[k] = torch::Tensor();
      keep.push_back(msg.tensor);
      for (int to : peers.send_to) {  // none, where a wider stage's other ranks serve it
        msg.peer = topo_.LaneIndex(rank_, to);
        batch.push_back(msg);
      }
    } else {
      msg.peer = topo_.LaneIndex(rank_, peers.receive_from);
      msg.tensor = peers.whole ? WholeBuffer(s.wire) : BoundaryBuffer(s.wire);
      torch::Tensor& slot = (p.activation ? s.received : s.grads_in)[k];
      slot = msg.tensor;
      if (t > 1 && !peers.whole) parts.push_back(&slot);
      batch.push_back(std::move(msg));
    }
  }
  if (batch.empty()) return;
  auto works = compat::PostP2p(*pipe, batch);
  // Only what a compute needs is waited for now: the receives. A send goes
  // on in the background (kept alive in s.sending) and is waited for at
  // the program's end, so a stage never idles for its neighbour to post
  // the matching receive. Where the batch came back as one work
  // (coalesced under NCCL) it is waited for whole when it receives.
  // Channel order is unchanged (each batch is posted in program order),
  // so the programs' rendezvous check (schedule/program.h) still holds.
  const bool per_message = works.size() == batch.size();
  const bool receives = std::any_of(batch.begin(), batch.end(), [](const compat::P2pMessage& m) { return !m.send; });
  std::vector<Work> now;
  bool deferred = false;
  for (size_t k = 0; k < works.size(); ++k) {
    const bool send = per_message ? batch[k].send : !receives;
    (send ? s.sends : now).push_back(std::move(works[k]));
    deferred = deferred || send;
  }
  if (deferred) s.sending.insert(s.sending.end(), keep.begin(), keep.end());
  WaitAll(now);
  for (torch::Tensor* slot : parts) *slot = GatherShares(*slot);
  s.r.comm_seconds += SecondsSince(t0);
}

void StageWorker::RunForward(int j, int c, StepState& s) {
  const RankInfo& me = topo_.ranks[rank_];
  const bool chunked = s.chain.chunks > 1;
  const bool overlap = opts_.overlap_allreduce && !chunked;
  const int g = me.first_microbatch + j;
  const int v = s.VirtualOf(c);
  const size_t k = s.At(j, c);
  RECORD_USER_SCOPE("ob::forward");
  torch::Tensor input, targets;
  if (s.First(c) || s.Last(c)) std::tie(input, targets) = MicroBatch(data_, s.r.step, g);
  if (!s.First(c)) {
    // From the previous virtual stage: a message, or (a V's turn) this
    // stage's own other chunk, handed over in memory as a message would
    // carry it (in the wire's dtype).
    torch::Tensor& from = s.chain.Local(v - 1) ? s.sent[s.At(j, s.chain.ChunkOf(v - 1))] : s.received[k];
    input = from.requires_grad_(true);
    from = torch::Tensor();
  }
  const auto t0 = Clock::now();
  s.forward_timer.Start();
  torch::Tensor out;
  {
    compat::AutocastGuard autocast(s.device, s.bf16);
    if (overlap && j == s.m - 1) {
      torch::Tensor x = input;
      for (const auto& layer : stage_->layers()) {
        for (int seg = 0; seg < layer->num_segments(); ++seg) {
          torch::Tensor xin = x;
          if (x.is_floating_point()) xin = x.detach().requires_grad_(true);
          s.seg_in.push_back(xin);
          x = layer->forward_segment(seg, xin, targets);
          s.seg_out.push_back(x);
        }
      }
      out = x;
    } else {
      out = chunked ? stage_->forward_chunk(c, input, targets) : stage_->forward(input, targets);
    }
  }
  if (s.Last(c)) {
    s.loss_sum += out.detach().to(torch::kDouble) * s.weight;
    out = out.to(torch::kFloat) * s.weight;
    if (!s.seg_out.empty()) s.seg_out.back() = out;
  }
  s.forward_timer.Stop();
  SlowDown(t0);
  s.r.forward_seconds += SecondsSince(t0);
  Tick();
  if (!s.Last(c)) s.sent[k] = out.detach().to(s.wire.dtype()).contiguous();
  s.inputs[k] = input;
  s.outputs[k] = out;
}

void StageWorker::RunBackward(int j, int c, bool weights, StepState& s) {
  const bool overlap = opts_.overlap_allreduce && s.chain.chunks == 1;
  const int v = s.VirtualOf(c);
  const size_t k = s.At(j, c);
  RECORD_USER_SCOPE("ob::backward");
  if (stall_at_ == s.r.step) {  // fault injection: stop making progress, stay alive
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  const auto t0 = Clock::now();
  s.backward_timer.Start();
  torch::Tensor grad_out;
  if (!s.Last(c)) {
    if (s.chain.Local(v)) {  // the next virtual stage is this stage's own chunk: its input's gradient
      torch::Tensor& next_input = s.inputs[s.At(j, s.chain.ChunkOf(v + 1))];
      grad_out = next_input.grad().to(s.wire.dtype()).to(s.outputs[k].scalar_type());
      next_input = torch::Tensor();
    } else {
      grad_out = s.grads_in[k].to(s.outputs[k].scalar_type());
      s.grads_in[k] = torch::Tensor();
    }
  }
  // B alone: the weight gradients are kept for W (model/weight_grads.h).
  std::optional<model::DeferWeightGradients> defer;
  if (!weights) defer.emplace(&s.weights[k]);
  if (overlap && j == s.m - 1) {
    // Unit by unit (a layer's segments), highest first; a bucket's
    // all-reduce starts once its lowest unit is done (under B alone, once
    // W has summed the unit's weight gradients).
    torch::Tensor grad = grad_out;
    const int units = static_cast<int>(s.seg_out.size());
    for (int u = units - 1; u >= 0; --u) {
      s.weights[k].SetUnit(units - 1 - u);
      if (grad.defined()) {
        torch::autograd::backward({s.seg_out[u]}, {grad});
      } else {
        s.seg_out[u].backward();
      }
      const torch::Tensor& xin = s.seg_in[u];
      grad = u > 0 ? xin.grad() : torch::Tensor();
      if (u == 0 && xin.requires_grad()) {
        // The stage input's gradient goes back to the previous stage.
        s.inputs[k].mutable_grad() = xin.grad();
      }
      if (weights) IssueBucketsDownTo(units - 1 - u, s);
    }
    s.seg_units = units;
    s.seg_in.clear();
    s.seg_out.clear();
  } else if (s.Last(c)) {
    s.outputs[k].backward();
  } else {
    torch::autograd::backward({s.outputs[k]}, {grad_out});
  }
  defer.reset();
  s.backward_timer.Stop();
  SlowDown(t0);
  s.r.backward_seconds += SecondsSince(t0);
  Tick();
  s.outputs[k] = torch::Tensor();
  if (s.First(c)) s.inputs[k] = torch::Tensor();
  if (weights) WeightsDone(c, s);
}

void StageWorker::RunWeightGradients(int j, int c, StepState& s) {
  RECORD_USER_SCOPE("ob::weight_grads");
  const auto t0 = Clock::now();
  s.backward_timer.Start();
  model::WeightGradients& w = s.weights[s.At(j, c)];
  if (opts_.overlap_allreduce && s.chain.chunks == 1 && j == s.m - 1) {
    // The last micro-batch's, unit by unit from the top as its B kept
    // them: each bucket's all-reduce starts once its units are summed.
    for (int unit = 0; unit < s.seg_units; ++unit) {
      w.Run(unit);
      IssueBucketsDownTo(unit, s);
    }
  }
  w.Run();
  s.backward_timer.Stop();
  SlowDown(t0);
  s.r.backward_seconds += SecondsSince(t0);
  Tick();
  WeightsDone(c, s);
}

void StageWorker::WeightsDone(int c, StepState& s) {
  if (++s.weights_done[static_cast<size_t>(c)] < s.m || s.chain.chunks == 1 || !opts_.overlap_allreduce) return;
  // Every bucket whose chunks are done, in bucket order (the same on every
  // holder of a group): a chunk's gradients are final once its last
  // micro-batch's weight gradients are summed.
  auto done = [&s](uint32_t chunks) {
    for (int k = 0; k < s.chain.chunks; ++k) {
      if ((chunks >> k & 1u) != 0 && s.weights_done[static_cast<size_t>(k)] < s.m) return false;
    }
    return true;
  };
  for (; s.next_bucket < buckets_.size() && done(buckets_[s.next_bucket].chunks); ++s.next_bucket) {
    IssueBucket(buckets_[s.next_bucket], s);
  }
}

// Units 0..unit (from the top) are done: the all-reduces of the buckets
// they complete, in bucket order.
void StageWorker::IssueBucketsDownTo(int unit, StepState& s) {
  for (; s.next_bucket < buckets_.size() && buckets_[s.next_bucket].unit <= unit; ++s.next_bucket) {
    IssueBucket(buckets_[s.next_bucket], s);
  }
}

void StageWorker::IssueBucket(Bucket& bk, StepState& s) {
  for (size_t i = 0; i < bk.sources.size(); ++i) bk.views[bk.params.size() + i].copy_(bk.sources[i]);
  for (auto& [id, group] : groups_->layers) {
    if (id != bk.group) continue;
    std::vector<torch::Tensor> buf{bk.flat};
    s.reductions.push_back(group->allreduce(buf));
  }
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
