// How a StageWorker's tensors reach its stage and cross its boundaries
// (see stage_worker.h): a micro-batch's ids and targets on the device, the
// buffers boundary receives land in, this TP rank's share of a boundary
// tensor and the whole gathered from the shares, and waiting for c10d works
// as hang detection counts it.
#include "ob/runtime/stage_worker.h"

#include <utility>
#include <vector>

#include "ob/runtime/stage_worker_impl.h"

namespace ob::runtime {

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
  torch::Tensor input, targets;
  if (stage_->has_embed() || stage_->has_head()) {
    const int b = topo_.microbatch_size;
    auto [x, y] = model::MakeBatch(src, opts_.seed, step, int64_t{g} * b, b, seq_len_);
    // On CUDA through page-locked memory, without waiting: a pageable copy
    // would synchronise the stream, twice a micro-batch, idling the GPU
    // while the host queues the next kernels.
    const bool cuda = opts_.device.is_cuda();
    auto to_device = [&](const torch::Tensor& h) {
      return cuda ? h.pin_memory().to(opts_.device, /*non_blocking=*/true) : h.to(opts_.device);
    };
    if (stage_->has_embed()) input = to_device(x);
    if (stage_->has_head()) targets = to_device(y);
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

}  // namespace ob::runtime
