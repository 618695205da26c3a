// StageWorker's gradient buckets (see stage_worker.h, "Overlap"): the
// gradients of this rank's layers laid out in flat per-bucket buffers, in
// the order the all-reduces issue them, bound and zeroed each step.
#include "ob/runtime/stage_worker.h"

#include <algorithm>
#include <string>
#include <utility>

#include "ob/model/tensor_parallel.h"
#include "ob/profile/analytic.h"
#include "ob/runtime/stage_worker_impl.h"

namespace ob::runtime {

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
  for (int piece = first_piece; piece < first_piece + num_pieces; ++piece) AddPieceBuckets(piece);
  LayOutBuckets();
  flops_per_microbatch_ = llmc_flops_per_microbatch_ = 0;
  const double tokens = static_cast<double>(topo_.microbatch_size) * seq_len_;
  for (int l : held_) {
    const pb::LayerKind kind = stage_->layer(l)->kind();
    flops_per_microbatch_ += profile::TrainingFlopsPerToken(cfg_, kind, seq_len_) * tokens / me.tp;
    llmc_flops_per_microbatch_ += profile::LlmcFlopsPerToken(cfg_, kind, seq_len_) * tokens / me.tp;
  }
}

void StageWorker::AddPieceBuckets(int piece) {
  const int first_piece = topo_.FirstPieceOf(rank_), num_pieces = topo_.PiecesOf(rank_);
  const size_t first_bucket = buckets_.size();
  // Units from the top down: the order their last backward finishes in.
  int unit = 0;
  for (size_t i = held_.size(); i-- > 0;) {
    const int l = held_[i];
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
                        buckets_.back().unit == unit - 1 && buckets_.back().layer == l + 1 &&
                        (buckets_.back().numel + numel) * 4 <= kBucketBytes;
      if (!join) {
        Bucket bk;
        bk.group = group;
        buckets_.push_back(std::move(bk));
      }
      Bucket& bk = buckets_.back();
      bk.unit = unit;
      bk.layer = l;
      bk.chunks |= 1u << stage_->chunk_of(l);
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

void StageWorker::LayOutBuckets() {
  const auto flat_options = torch::TensorOptions().dtype(torch::kFloat).device(opts_.device);
  // Issue order: highest units first, pieces ascending within them.
  std::stable_sort(buckets_.begin(), buckets_.end(), [](const Bucket& a, const Bucket& b) { return a.unit < b.unit; });
  // Each view starts on a multiple of kGradAlign values, so that a
  // gradient's reductions (the norm, stage_worker_reduce.cc) read it from an aligned
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

void StageWorker::ZeroGradients() {
  BindGradients();
  for (auto& bucket : buckets_) bucket.flat.zero_();
  for (auto& grads : own_grads_) {
    for (auto& g : grads) g.zero_();
  }
  if (tied_.defined()) tied_.mutable_grad().zero_();
}

}  // namespace ob::runtime
