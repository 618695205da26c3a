// StageWorker's construction (see stage_worker.h): the checks Create
// makes, the stage and its optimizer built for this rank, and its c10d
// groups joined in Topology order.
#include "ob/runtime/stage_worker.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "ob/clock.h"
#include "ob/runtime/stage_worker_impl.h"

namespace ob::runtime {

namespace {

// Position of `rank` in the ascending list `ranks`, -1 if absent.
int LocalRank(const std::vector<int>& ranks, int rank) {
  auto it = std::find(ranks.begin(), ranks.end(), rank);
  return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
}

}  // namespace

void WaitWork(const c10::intrusive_ptr<c10d::Work>& work) {
  if (!work->wait()) throw std::runtime_error("c10d operation was aborted");
}

StageWorker::StageWorker(const model::GptConfig& cfg, const Topology& topo, int rank,
                         const model::TrainOptions& opts, const model::TokenSource& data,
                         int seq_len, bool init)
    : cfg_(cfg), topo_(topo), rank_(rank), opts_(opts), data_(data), seq_len_(seq_len) {
  const RankInfo& me = topo_.ranks[rank_];
  peers_.resize(static_cast<size_t>(me.num_stages));
  for (int s = 0; s < me.num_stages; ++s) {
    if (s != me.stage) peers_[static_cast<size_t>(s)] = topo_.Boundary(rank_, s);
  }
  model::TpGroupPtr tp;
  if (me.tp > 1) {  // its group is joined later (JoinGroups), before any forward
    tp = std::make_shared<model::TpGroup>();
    tp->rank = me.tp_rank;
    tp->size = me.tp;
  }
  std::vector<std::pair<int, int>> ranges = me.ranges;
  if (ranges.empty()) ranges = {{me.first_layer, me.last_layer}};
  stage_ = model::GptStage(cfg_, ranges, opts_.seed, tp, init);
  for (const auto& layer : stage_->layers()) layer->set_recompute(me.recompute);  // the plan's (recompute.h)
  stage_->to(opts_.device);
  stage_->train();
  optimizer_ = model::MakeOptimizer(*stage_, opts_);
  if (opts_.precision == model::Precision::kBf16) copies_ = stage_->MakeComputeCopies(torch::kBFloat16);

  auto tied = stage_->tied_weights();
  if (!tied.empty()) tied_ = tied.front();  // one per stage: wte, or the head's own copy
  for (int l = 0; l < cfg_.num_layers(); ++l) {
    if (!stage_->holds(l)) continue;
    held_.push_back(l);
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

}  // namespace ob::runtime
