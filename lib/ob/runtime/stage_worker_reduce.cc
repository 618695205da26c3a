// What a StageWorker's step sums after its 1F1B program (see
// stage_worker.h): the gradient buckets' data-parallel all-reduces not yet
// issued, the tied weight's gradient and the pipelines' losses over the
// tied groups; then the global gradient norm, counted so that every rank
// gets it bit for bit, and the loss.
#include "ob/runtime/stage_worker.h"

#include <ATen/record_function.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "ob/clock.h"
#include "ob/model/tensor_parallel.h"
#include "ob/runtime/stage_worker_impl.h"

namespace ob::runtime {

void StageWorker::ReduceGradients(StepState& s) {
  // Whatever was not handed over during the last backward (all of it
  // without overlap), then the tied weight and the pipelines' losses.
  // allreduce_exposed_seconds is the wait for the buckets; the tied group
  // also waits for the far end of every pipeline (its first stages finish
  // last), which the overlap cannot change: that wait is communication
  // time but not part of the exposed all-reduce.
  s.t_comm = Clock::now();
  std::optional<at::RecordFunction> phase(std::in_place, at::RecordScope::USER_SCOPE);
  if (phase->isActive()) phase->before("ob::allreduce");
  IssueBucketsDownTo(std::numeric_limits<int>::max(), s);
  std::vector<Work> tied_sums;
  std::vector<torch::Tensor> spare_losses;  // a rank of several pieces: the later pieces' copies
  for (auto& [piece, group] : groups_->tied) {
    if (tied_.defined()) {  // an untied model (cfg_.tied false) sums only the losses here
      std::vector<torch::Tensor> grad{tied_.grad()};
      if (topo_.PiecesOf(rank_) > 1) grad = {PieceOfGradient("wte.weight", tied_.grad(), piece).front()};
      tied_sums.push_back(group->allreduce(grad));
    }
    std::vector<torch::Tensor> loss{s.loss_sum};
    if (piece != topo_.FirstPieceOf(rank_)) {
      spare_losses.push_back(s.loss_sum.clone());
      loss = {spare_losses.back()};
    }
    tied_sums.push_back(group->allreduce(loss));
  }
  WaitAll(s.reductions);
  for (auto& bk : buckets_) {
    for (size_t i = 0; i < bk.sources.size(); ++i) {
      if (bk.write_back[i]) bk.sources[i].copy_(bk.views[bk.params.size() + i]);
    }
  }
  s.r.allreduce_exposed_seconds = SecondsSince(s.t_comm);
  WaitAll(tied_sums);
}

void StageWorker::SumNormAndLoss(StepState& s) {
  const RankInfo& me = topo_.ranks[rank_];
  Group& pipe = groups_->pipeline;
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
  std::optional<at::RecordFunction> phase(std::in_place, at::RecordScope::USER_SCOPE);
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
  for (size_t i = 0; i < held_.size(); ++i) {
    const int l = held_[i];
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
  if (stage_->has_head() && me.tp_rank == 0) entries.back() = s.loss_sum.item<double>();
  auto stats = torch::from_blob(entries.data(), {static_cast<int64_t>(entries.size())}, torch::kDouble).clone();
  if (groups_->tp || pipe) stats = stats.to(s.device);
  if (groups_->tp) {  // the shards' sums first, then the lane's: the same on every rank
    std::vector<torch::Tensor> buf{stats};
    std::vector<Work> w{groups_->tp->allreduce(buf)};
    WaitAll(w);
    // A mixed pipeline's one lane holds every TP rank: one contribution a stage.
    if (me.lane_base >= 0 && me.tp_rank != 0) stats.zero_();
  }
  if (pipe) {
    std::vector<torch::Tensor> buf{stats};
    std::vector<Work> w{pipe->allreduce(buf)};
    WaitAll(w);
  }
  stats = stats.cpu();
  const double* sums = stats.data_ptr<double>();
  double sum_sq = 0;
  for (int e = 0; e < topo_.num_layers * T; ++e) sum_sq += sums[e];
  phase.reset();
  s.r.grad_norm = std::sqrt(sum_sq);
  s.r.loss = sums[topo_.num_layers * T];
  s.r.comm_seconds += SecondsSince(s.t_comm);
}

}  // namespace ob::runtime
