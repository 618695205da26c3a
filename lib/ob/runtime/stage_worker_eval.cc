// StageWorker::Evaluate (see stage_worker.h): the mean loss of the current
// weights over evaluation batches, forward only through the same pipelines
// and split as training, summed so that every rank gets it.
#include "ob/runtime/stage_worker.h"

#include <string>
#include <vector>

#include "ob/clock.h"
#include "ob/runtime/stage_worker_impl.h"

namespace ob::runtime {

Result<double> StageWorker::Evaluate(const model::TokenSource& eval, int batches) {
  try {
    const RankInfo& me = topo_.ranks[rank_];
    const bool bf16 = opts_.precision == model::Precision::kBf16;
    const auto wire = torch::TensorOptions().dtype(bf16 ? torch::kBFloat16 : torch::kFloat).device(opts_.device);
    torch::NoGradGuard no_grad;
    // bf16: the weights' compute copies, made anew (the update since the
    // step's changed the weights), not a cast of every weight a micro-batch.
    if (copies_) copies_->Refresh();
    model::ComputeCopies::Scope use_copies(copies_.get());
    auto loss_sum = torch::zeros({1}, torch::TensorOptions().dtype(torch::kDouble).device(opts_.device));
    // Forward only, micro-batch by micro-batch: receive, compute, send. A
    // chain, so no two stages wait on each other; tags after training's.
    for (int k = 0; k < batches; ++k) {
      for (int j = 0; j < me.num_microbatches; ++j) EvalMicrobatch(eval, k, j, wire, loss_sum);
    }
    return SumEvalLoss(loss_sum) / batches;
  } catch (const std::exception& e) {
    return Status::Unavailable("rank " + std::to_string(rank_) + ": evaluation failed: " + FirstLine(e.what()));
  }
}

void StageWorker::EvalMicrobatch(const model::TokenSource& eval, int k, int j, const torch::TensorOptions& wire,
                                 torch::Tensor& loss_sum) {
  const RankInfo& me = topo_.ranks[rank_];
  const auto device = opts_.device;
  const bool bf16 = opts_.precision == model::Precision::kBf16;
  const int t = me.tp;
  const double weight = 1.0 / topo_.total_microbatches;
  Group& pipe = groups_->pipeline;
  auto wait = [&](std::vector<Work> works) { WaitAll(works); };
  const int64_t key = static_cast<int64_t>(kEvalStep) + k;
  const int g = me.first_microbatch + j;
  const schedule::Chain chain = me.Chain();
  // Across virtual boundary `link`: 2·((k·M + g)·v + c), c the chunk of
  // its lower end (one chunk: 2·(k·M + g)).
  auto tag = [&](int link) { return 2 * ((k * topo_.total_microbatches + g) * chain.chunks + chain.ChunkOf(link)); };
  auto [input, targets] = MicroBatch(eval, key, g);
  // The micro-batch down the virtual stages this rank holds, in order: a
  // chain, each boundary a receive the sender's send meets.
  torch::Tensor carried;  // the previous virtual stage's output, when it is this rank's
  for (int v = 0; v < chain.size(); ++v) {
    if (chain.StageOf(v) != me.stage) continue;
    torch::Tensor x = input;
    if (v > 0 && chain.Local(v - 1)) {
      x = carried;
    } else if (v > 0) {
      const BoundaryPeers& peers = PeersOf(chain.StageOf(v - 1));
      compat::P2pMessage msg;
      msg.send = false;
      msg.peer = topo_.LaneIndex(rank_, peers.receive_from);
      msg.tag = tag(v - 1);
      msg.tensor = peers.whole ? WholeBuffer(wire) : BoundaryBuffer(wire);
      wait(compat::PostP2p(*pipe, {msg}));
      x = t > 1 && !peers.whole ? GatherShares(msg.tensor) : msg.tensor;
    }
    torch::Tensor out;
    {
      compat::AutocastGuard autocast(device, bf16);
      out = chain.chunks > 1 ? stage_->forward_chunk(chain.ChunkOf(v), x, targets) : stage_->forward(x, targets);
    }
    Tick();
    if (v == chain.size() - 1) {
      loss_sum += out.detach().to(torch::kDouble) * weight;
      continue;
    }
    const torch::Tensor whole = out.detach().to(wire.dtype()).contiguous();
    if (chain.Local(v)) {
      carried = whole;
      continue;
    }
    const BoundaryPeers& peers = PeersOf(chain.StageOf(v + 1));
    compat::P2pMessage msg;
    msg.tag = tag(v);
    msg.tensor = peers.whole ? whole : ShareOf(whole);
    std::vector<compat::P2pMessage> batch;
    for (int to : peers.send_to) {
      msg.peer = topo_.LaneIndex(rank_, to);
      batch.push_back(msg);
    }
    if (!batch.empty()) wait(compat::PostP2p(*pipe, batch));
  }
}

double StageWorker::SumEvalLoss(const torch::Tensor& loss_sum) {
  const RankInfo& me = topo_.ranks[rank_];
  Group& pipe = groups_->pipeline;
  auto wait = [&](std::vector<Work> works) { WaitAll(works); };
  // The pipelines' sums: over TP rank 0 of every holder of the embedding
  // or the head (the tied group of piece 0), then from the head's down its lane
  // and across its TP group, so that every rank holds the total.
  const bool counts = stage_->has_head() && me.tp_rank == 0;  // the pipeline's head, TP rank 0
  auto v = counts ? loss_sum : torch::zeros_like(loss_sum);
  for (auto& [piece, group] : groups_->tied) {
    if (piece != 0) continue;
    std::vector<torch::Tensor> buf{v};
    wait({group->allreduce(buf)});
  }
  if (!counts) v.zero_();
  if (pipe) {
    std::vector<torch::Tensor> buf{v};
    wait({pipe->allreduce(buf)});
  }
  if (groups_->tp && me.lane_base < 0) {  // a mixed pipeline's lane reached every rank
    std::vector<torch::Tensor> buf{v};
    wait({groups_->tp->allreduce(buf)});
  }
  return v.cpu().item<double>();
}

}  // namespace ob::runtime
