// StageWorker's private parts (stage_worker.h) that its .cc files share:
// its c10d groups and the state of one step's schedule. stage_worker.cc
// builds the worker and joins its groups; stage_worker_step.cc runs a
// step's 1F1B program and the update; stage_worker_reduce.cc the gradient
// all-reduces, the global norm and the loss after it; stage_worker_buckets.cc
// lays the gradients out in buckets; stage_worker_boundary.cc moves tensors
// across stage boundaries; stage_worker_eval.cc evaluates;
// stage_worker_snapshots.cc keeps the host snapshots; recovery.cc rebuilds
// and restores. Nothing else includes it.
//
// Shapes: ids and targets [b, t] int64; activations and their gradients
// [b, t, h] in the compute dtype (fp32, or bf16 under bf16 precision);
// b = micro-batch size, t = sequence length, h = n_embd.
#pragma once

#include <chrono>
#include <utility>
#include <vector>

#include "ob/model/weight_grads.h"
#include "ob/runtime/stage_worker.h"

namespace ob::runtime {

using Clock = std::chrono::steady_clock;
using Work = c10::intrusive_ptr<c10d::Work>;
using Group = c10::intrusive_ptr<compat::Backend>;

// The c10d groups this rank belongs to. Groups of one rank are not created
// (null): their all-reduce is the identity.
struct StageWorker::Groups {
  Group pipeline;                                 // this lane: p2p + per-step statistics
  Group tp;                                       // this stage's TP ranks (t > 1)
  std::vector<std::pair<int, Group>> layers;      // (layer group id, group)
  std::vector<std::pair<int, Group>> tied;        // (piece, its tied group)
};

// What one RunSchedule's instructions hand each other: the micro-batches'
// tensors in flight, the loss so far and the reductions issued. With
// chunks, every per-micro-batch slot is per (micro-batch, chunk): At(j, c).
struct StageWorker::StepState {
  StepState(const torch::Device& device, bool bf16, int microbatches, double weight, schedule::Chain chain,
            int stage)
      : device(device),
        bf16(bf16),
        wire(torch::TensorOptions().dtype(bf16 ? torch::kBFloat16 : torch::kFloat).device(device)),
        m(microbatches),
        weight(weight),
        chain(chain),
        stage(stage),
        forward_timer(device),
        backward_timer(device),
        received(Slots()),
        grads_in(Slots()),
        inputs(Slots()),
        outputs(Slots()),
        sent(Slots()),
        weights(Slots()),
        weights_done(static_cast<size_t>(chain.chunks), 0),
        loss_sum(torch::zeros({1}, torch::TensorOptions().dtype(torch::kDouble).device(device))) {}

  size_t Slots() const { return static_cast<size_t>(m) * static_cast<size_t>(chain.chunks); }
  size_t At(int j, int c) const { return static_cast<size_t>(c) * static_cast<size_t>(m) + static_cast<size_t>(j); }
  // Chunk c's virtual stage, and whether it is the model's first or last.
  int VirtualOf(int c) const { return chain.At(stage, c); }
  bool First(int c) const { return VirtualOf(c) == 0; }
  bool Last(int c) const { return VirtualOf(c) == chain.size() - 1; }

  StepResult r;
  const torch::Device device;
  const bool bf16;
  // Activations and their gradients cross stage boundaries in the compute
  // dtype, the residual stream's (model/gpt.cc, Norm).
  const torch::TensorOptions wire;
  const int m;            // this pipeline's micro-batches
  const double weight;    // each micro-batch's share of the loss
  const schedule::Chain chain;  // its pipeline's virtual stages (one chunk: the stages)
  const int stage;        // this rank's
  compat::DeviceTimer forward_timer, backward_timer;
  std::vector<torch::Tensor> received, grads_in;  // what comm batches deliver
  std::vector<torch::Tensor> inputs, outputs, sent;
  // The last micro-batch runs unit by unit (detached at each layer
  // segment's input), so that its backward can hand each bucket to the
  // all-reduce as soon as the bucket's units are done.
  std::vector<torch::Tensor> seg_in, seg_out;
  int seg_units = 0;  // how many units the last micro-batch ran
  // A split backward's weight gradients, per micro-batch, from its B to
  // its W (model/weight_grads.h).
  std::vector<model::WeightGradients> weights;
  // Per chunk, the micro-batches whose weight gradients are summed: at m,
  // the chunk's buckets may go on the wire.
  std::vector<int> weights_done;
  torch::Tensor loss_sum;  // [1] double: this stage's weighted losses
  // Data-parallel reductions, issued in bucket order (highest layers first)
  // on every rank, then the tied weight's gradient and the loss: one global
  // order over all groups, so no two ranks wait for each other's different
  // collectives under NCCL.
  std::vector<Work> reductions;
  // Sends posted and not waited for (RunComm): the sender goes on to its
  // next compute while its neighbour is busy, as the schedule's timing
  // assumes; waited for at the program's end. `sending` keeps what they
  // read alive until then.
  std::vector<Work> sends;
  std::vector<torch::Tensor> sending;
  size_t next_bucket = 0;  // the first bucket not issued yet
  Clock::time_point t_comm;  // when the program ended and the reductions' wait began
};

}  // namespace ob::runtime
