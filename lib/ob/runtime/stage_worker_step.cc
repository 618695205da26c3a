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
#include <utility>
#include <vector>

#include "ob/clock.h"
#include "ob/schedule/program.h"
#include "ob/runtime/stage_worker_impl.h"

namespace ob::runtime {

namespace {

// Tags of the two messages micro-batch g sends across a stage boundary.
int ActivationTag(int g) { return 2 * g; }
int GradientTag(int g) { return 2 * g + 1; }

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
              1.0 / topo_.total_microbatches);  // each micro-batch's share
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
    const int j = in.op.microbatch;
    switch (in.op.type) {
      case schedule::Op::kForward: RunForward(j, s); break;
      case schedule::Op::kBackward: RunBackward(j, true, s); break;
      case schedule::Op::kInputGrad: RunBackward(j, false, s); break;
      case schedule::Op::kWeightGrad: RunWeightGradients(j, s); break;
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
    compat::P2pMessage msg;
    msg.send = p.send;
    msg.tag = p.activation ? ActivationTag(gj) : GradientTag(gj);
    if (p.send) {
      torch::Tensor whole = p.activation ? s.sent[p.microbatch]
                                         : s.inputs[p.microbatch].grad().to(s.wire.dtype()).contiguous();
      msg.tensor = peers.whole ? whole : ShareOf(whole);
      if (!p.activation) s.inputs[p.microbatch] = torch::Tensor();
      if (p.activation) s.sent[p.microbatch] = torch::Tensor();
      keep.push_back(msg.tensor);
      for (int to : peers.send_to) {  // none, where a wider stage's other ranks serve it
        msg.peer = topo_.LaneIndex(rank_, to);
        batch.push_back(msg);
      }
    } else {
      msg.peer = topo_.LaneIndex(rank_, peers.receive_from);
      msg.tensor = peers.whole ? WholeBuffer(s.wire) : BoundaryBuffer(s.wire);
      torch::Tensor& slot = (p.activation ? s.received : s.grads_in)[p.microbatch];
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

void StageWorker::RunForward(int j, StepState& s) {
  const RankInfo& me = topo_.ranks[rank_];
  const bool overlap = opts_.overlap_allreduce;
  const int g = me.first_microbatch + j;
  RECORD_USER_SCOPE("ob::forward");
  auto [input, targets] = MicroBatch(data_, s.r.step, g);
  if (!me.is_first_stage()) {
    input = s.received[j].requires_grad_(true);
    s.received[j] = torch::Tensor();
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
      out = stage_->forward(input, targets);
    }
  }
  if (me.is_last_stage()) {
    s.loss_sum += out.detach().to(torch::kDouble) * s.weight;
    out = out.to(torch::kFloat) * s.weight;
    if (!s.seg_out.empty()) s.seg_out.back() = out;
  }
  s.forward_timer.Stop();
  SlowDown(t0);
  s.r.forward_seconds += SecondsSince(t0);
  Tick();
  if (!me.is_last_stage()) s.sent[j] = out.detach().to(s.wire.dtype()).contiguous();
  s.inputs[j] = input;
  s.outputs[j] = out;
}

void StageWorker::RunBackward(int j, bool weights, StepState& s) {
  const RankInfo& me = topo_.ranks[rank_];
  const bool overlap = opts_.overlap_allreduce;
  RECORD_USER_SCOPE("ob::backward");
  if (stall_at_ == s.r.step) {  // fault injection: stop making progress, stay alive
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  const auto t0 = Clock::now();
  s.backward_timer.Start();
  torch::Tensor grad_out;
  if (!me.is_last_stage()) {
    grad_out = s.grads_in[j].to(s.outputs[j].scalar_type());
    s.grads_in[j] = torch::Tensor();
  }
  // B alone: the weight gradients are kept for W (model/weight_grads.h).
  std::optional<model::DeferWeightGradients> defer;
  if (!weights) defer.emplace(&s.weights[j]);
  if (overlap && j == s.m - 1) {
    // Unit by unit (a layer's segments), highest first; a bucket's
    // all-reduce starts once its lowest unit is done (under B alone, once
    // W has summed the unit's weight gradients).
    torch::Tensor grad = grad_out;
    const int units = static_cast<int>(s.seg_out.size());
    for (int k = units - 1; k >= 0; --k) {
      s.weights[j].SetUnit(units - 1 - k);
      if (grad.defined()) {
        torch::autograd::backward({s.seg_out[k]}, {grad});
      } else {
        s.seg_out[k].backward();
      }
      const torch::Tensor& xin = s.seg_in[k];
      grad = k > 0 ? xin.grad() : torch::Tensor();
      if (k == 0 && xin.requires_grad()) {
        // The stage input's gradient goes back to the previous stage.
        s.inputs[j].mutable_grad() = xin.grad();
      }
      if (weights) IssueBucketsDownTo(units - 1 - k, s);
    }
    s.seg_units = units;
    s.seg_in.clear();
    s.seg_out.clear();
  } else if (me.is_last_stage()) {
    s.outputs[j].backward();
  } else {
    torch::autograd::backward({s.outputs[j]}, {grad_out});
  }
  defer.reset();
  s.backward_timer.Stop();
  SlowDown(t0);
  s.r.backward_seconds += SecondsSince(t0);
  Tick();
  s.outputs[j] = torch::Tensor();
  if (me.is_first_stage()) s.inputs[j] = torch::Tensor();
}

void StageWorker::RunWeightGradients(int j, StepState& s) {
  RECORD_USER_SCOPE("ob::weight_grads");
  const auto t0 = Clock::now();
  s.backward_timer.Start();
  model::WeightGradients& w = s.weights[j];
  if (opts_.overlap_allreduce && j == s.m - 1) {
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
}

// Units 0..unit (from the top) are done: the all-reduces of the buckets
// they complete, in bucket order.
void StageWorker::IssueBucketsDownTo(int unit, StepState& s) {
  for (; s.next_bucket < buckets_.size() && buckets_[s.next_bucket].unit <= unit; ++s.next_bucket) {
    Bucket& bk = buckets_[s.next_bucket];
    for (size_t i = 0; i < bk.sources.size(); ++i) bk.views[bk.params.size() + i].copy_(bk.sources[i]);
    for (auto& [id, group] : groups_->layers) {
      if (id != bk.group) continue;
      std::vector<torch::Tensor> buf{bk.flat};
      s.reductions.push_back(group->allreduce(buf));
    }
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
