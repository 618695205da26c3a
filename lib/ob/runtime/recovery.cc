// In-place recovery of a StageWorker (see stage_worker.h, "Recovery"):
// rebuild a survivor's stage for its layers in the re-instantiated plan and
// fill it from its own snapshot and from the holders the fetch list names.
//
// Transfers. Every rank of the new topology derives the same ordered list:
// for each new rank (ascending), each layer of its new stage (ascending)
// whose shard its old stage did not hold, the sender is a rank holding that
// shard: of the fetch's from_node, else of its own node (a stage moved
// between a node's slots), else the lowest. When no rank holds the shard as
// it is now cut (the replicas of another degree, or this rank's own state
// under another degree), it comes piece by piece (topology.h: T the least
// common multiple of every degree involved), each piece from a holder in
// the same order of preference but this rank itself first: a survivor
// re-shards what it holds without sending it. The layer's non-tied
// parameters go in name order (in a piece transfer a replicated one only
// with the receiver's first piece); the tied LM weight (its piece) goes
// with the first of layers 0 and L+1 a rank gains when its old stage held
// neither. Each tensor is two messages on a "recovery" group over all new
// ranks: a float [3, …] (value, exp_avg, exp_avg_sq, the shard or the
// piece; the snapshot's dtype) with tag 2·i and an int64 [1] AdamW step
// count with tag 2·i + 1, i the tensor's index among the pair's tensors in
// list order. All sends and receives are posted before any is waited on,
// so no two ranks wait on each other.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <numeric>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ob/clock.h"
#include "ob/model/tensor_parallel.h"
#include "ob/runtime/stage_worker.h"

namespace ob::runtime {

namespace {

using Work = c10::intrusive_ptr<c10d::Work>;
using Clock = std::chrono::steady_clock;

bool HoldsTied(const RankInfo& r, int num_layers) {
  return HoldsLayer(r, 0) || HoldsLayer(r, num_layers - 1);
}

struct Transfer {
  int to = 0, from = 0;   // new ranks (equal: a re-shard of the rank's own state)
  int layer = 0;
  int piece = -1;         // -1: the whole shard; else piece `piece` of T
  bool with_tied = false;
};

// Keys of layer `layer` in a snapshot-like map (names "<layer>.…"), tied excluded.
template <typename Map>
std::vector<std::string> LayerKeys(const Map& tensors, int layer) {
  const std::string prefix = std::to_string(layer) + ".";
  std::vector<std::string> keys;
  for (const auto& item : tensors) {
    if (item.first.compare(0, prefix.size(), prefix) == 0) keys.push_back(item.first);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

}  // namespace

Result<std::unique_ptr<StageWorker>> StageWorker::Rebuild(
    int64_t step, const Topology& next, const std::vector<plan::LayerFetch>& fetches,
    const c10::intrusive_ptr<c10d::Store>& store, std::chrono::milliseconds timeout) const {
  const std::string who = "node " + std::to_string(info().node);
  const StageSnapshot* own = SnapshotAt(step);
  if (own == nullptr) {
    return Status::Config(who + ": no snapshot after step " + std::to_string(step) +
                          " (last completed: " + std::to_string(last_completed_step()) + ")");
  }
  if (next.num_layers != topo_.num_layers) {
    return Status::Config(who + ": the new plan has " + std::to_string(next.num_layers) +
                          " layers, the old " + std::to_string(topo_.num_layers));
  }
  // What each new rank held before: the old stage in the same place on its
  // node (the i-th rank of node n then is the i-th of n now: a worker slot
  // keeps its snapshot); nothing for a new node or a slot it did not run.
  std::map<int, std::vector<int>> old_ranks_of;
  for (const auto& r : topo_.ranks) old_ranks_of[r.node].push_back(r.rank);
  std::map<int, size_t> seen;  // node -> new ranks met so far
  std::vector<Held> held(next.ranks.size());
  int new_rank = -1;
  const size_t my_slot = [&] {
    const auto& mine = old_ranks_of[info().node];
    return static_cast<size_t>(std::find(mine.begin(), mine.end(), info().rank) - mine.begin());
  }();
  for (const auto& r : next.ranks) {
    const size_t slot = seen[r.node]++;
    if (r.node == info().node && slot == my_slot) new_rank = r.rank;
    auto it = old_ranks_of.find(r.node);
    if (it == old_ranks_of.end() || slot >= it->second.size()) continue;
    const RankInfo& was = topo_.ranks[it->second[slot]];
    held[r.rank] = {was.first_layer, was.last_layer, was.tp, was.tp_rank, was.ranges};
  }
  if (new_rank < 0) return Status::Config(who + ": not in the new plan (idle)");
  return Restore(cfg_, next, new_rank, store, opts_, data_, step, own, held, fetches, timeout);
}

namespace {

// "layers 2-5", "layers 0-1+4-5 shard 1 of 2", for messages.
template <typename Holding>
std::string LayersText(const Holding& h) {
  std::string s = "layers " + RangesText(RangesOf(h));
  if (h.tp > 1) s += " shard " + std::to_string(h.tp_rank) + " of " + std::to_string(h.tp);
  return s;
}

// Whether `h` holds the shard of `layer` that `r` runs.
bool HoldsShard(const StageWorker::Held& h, int layer, const RankInfo& r) {
  return HoldsLayer(h, layer) && h.tp == r.tp && h.tp_rank == r.tp_rank;
}

// Whether `h` holds piece `piece` of T of `layer`.
bool HoldsPiece(const StageWorker::Held& h, int layer, int piece, int T) {
  const int first = model::FirstPiece(h.tp, h.tp_rank, T);
  return HoldsLayer(h, layer) && first <= piece && piece < first + T / h.tp;
}

// The pieces every degree of `next` and of the holdings meets in.
int CommonPieces(const Topology& next, const std::vector<StageWorker::Held>& held) {
  int T = next.pieces;
  for (const auto& h : held) {
    if (!RangesOf(h).empty()) T = std::lcm(T, std::max(1, h.tp));
  }
  return T;
}

// Whether the holdings give `r` its shard of `layer`: whole, or every piece.
bool Covered(const std::vector<StageWorker::Held>& held, int layer, const RankInfo& r, int T) {
  if (std::any_of(held.begin(), held.end(), [&](const StageWorker::Held& h) { return HoldsShard(h, layer, r); })) {
    return true;
  }
  const int first = model::FirstPiece(r.tp, r.tp_rank, T);
  for (int piece = first; piece < first + T / r.tp; ++piece) {
    if (std::none_of(held.begin(), held.end(),
                     [&](const StageWorker::Held& h) { return HoldsPiece(h, layer, piece, T); })) {
      return false;
    }
  }
  return true;
}

// The transfers every rank derives alike (see the file comment).
Result<std::vector<Transfer>> PlanTransfers(const Topology& topo,
                                            const std::vector<StageWorker::Held>& held,
                                            const std::vector<plan::LayerFetch>& fetches, int T, bool tied) {
  const int L = topo.num_layers;
  // The ranks of each node (several when a node runs several stages).
  std::map<int, std::vector<int>> ranks_of;
  for (const auto& r : topo.ranks) ranks_of[r.node].push_back(r.rank);
  std::map<std::pair<int, int>, int> source;  // (node, layer) -> from_node
  for (const auto& f : fetches) source.emplace(std::make_pair(f.node, f.layer), f.from_node);
  // The first rank satisfying `has`: `self` when allowed, then of the
  // plan's from_node, of r's node, of any; -1 when none.
  auto find = [&](const RankInfo& r, int l, bool self, const std::function<bool(int)>& has) {
    if (self && has(r.rank)) return r.rank;
    auto it = source.find({r.node, l});
    if (it != source.end()) {
      auto f = ranks_of.find(it->second);
      if (f != ranks_of.end()) {
        for (int q : f->second) {
          if (q != r.rank && has(q)) return q;
        }
      }
    }
    for (int q : ranks_of[r.node]) {
      if (q != r.rank && has(q)) return q;
    }
    for (size_t q = 0; q < held.size(); ++q) {
      if (static_cast<int>(q) != r.rank && has(static_cast<int>(q))) return static_cast<int>(q);
    }
    return -1;
  };
  std::vector<Transfer> transfers;
  for (const auto& r : topo.ranks) {
    const StageWorker::Held& old = held[r.rank];
    bool tied_pending = tied && HoldsTied(r, L) && !HoldsShard(old, 0, r) && !HoldsShard(old, L - 1, r);
    for (int l = 0; l < L; ++l) {
      if (!HoldsLayer(r, l) || HoldsShard(old, l, r)) continue;
      const bool with_tied = tied_pending && (l == 0 || l == L - 1);
      if (with_tied) tied_pending = false;
      const int whole = find(r, l, false, [&](int q) { return HoldsShard(held[q], l, r); });
      if (whole >= 0) {
        transfers.push_back({r.rank, whole, l, -1, with_tied});
        continue;
      }
      const int first = model::FirstPiece(r.tp, r.tp_rank, T);
      for (int piece = first; piece < first + T / r.tp; ++piece) {
        const int from = find(r, l, true, [&](int q) { return HoldsPiece(held[q], l, piece, T); });
        if (from >= 0) {
          transfers.push_back({r.rank, from, l, piece, with_tied});
          continue;
        }
        std::string what = "layer " + std::to_string(l);
        if (r.tp > 1) what += " shard " + std::to_string(r.tp_rank) + " of " + std::to_string(r.tp);
        std::string holders;  // what each rank does hold: the reason is in there
        for (size_t q = 0; q < held.size(); ++q) {
          const StageWorker::Held& h = held[q];
          holders += (q == 0 ? "" : ", ") + std::to_string(q) + ": " +
                     (RangesOf(h).empty() ? "nothing" : LayersText(h));
        }
        return Status::Config("node " + std::to_string(r.node) + " " + what +
                              ": no rank of the new plan holds it (ranks hold " + holders + ")");
      }
    }
  }
  return transfers;
}

}  // namespace

Result<StageWorker::StartChoice> StageWorker::ChooseStart(const Topology& next,
                                                          const std::vector<PublishedSlots>& published,
                                                          int64_t not_before) {
  if (published.size() != next.ranks.size()) {
    return Status::Internal("snapshot lists of " + std::to_string(published.size()) + " ranks for " +
                            std::to_string(next.ranks.size()));
  }
  std::set<int64_t, std::greater<>> steps;  // newest first
  int64_t newest = -2;
  for (const auto& slots : published) {
    for (const auto& i : slots) {
      if (i.complete() && i.step >= not_before) steps.insert(i.step);
      newest = std::max(newest, i.step);
    }
  }
  // First the step every rank can restore on its own after a failure in
  // the middle of a step: the least newest step among ranks within one of
  // the newest (those further behind hold nothing current); then the rest,
  // newest first.
  std::vector<int64_t> order;
  {
    int64_t usual = newest;
    for (const auto& slots : published) {
      int64_t n = -2;
      for (const auto& i : slots) n = std::max(n, i.step);
      if (n >= newest - 1) usual = std::min(usual, n);
    }
    if (steps.count(usual)) order.push_back(usual);
    for (int64_t step : steps) {
      if (step != usual) order.push_back(step);
    }
  }
  for (int64_t step : order) {
    StartChoice c;
    c.step = step;
    c.held.resize(published.size());
    c.slot.assign(published.size(), -1);
    for (size_t q = 0; q < published.size(); ++q) {
      const RankInfo& runs = next.ranks[q];
      int best_own = -1, best_width = -1;
      for (int s = 0; s < SnapshotArena::kSlots; ++s) {
        const auto& i = published[q][static_cast<size_t>(s)];
        if (!i.complete() || i.step != step) continue;
        const int own = i.tp == runs.tp && i.tp_rank == runs.tp_rank ? RangesOverlap(RangesOf(i), RangesOf(runs)) : 0;
        const int width = RangesWidth(RangesOf(i));
        if (own > best_own || (own == best_own && width > best_width)) {
          best_own = own;
          best_width = width;
          c.slot[q] = s;
          c.held[q] = {i.first_layer, i.last_layer, i.tp, i.tp_rank, i.ranges};
        }
      }
    }
    bool complete = true;
    const int T = CommonPieces(next, c.held);
    for (const RankInfo& r : next.ranks) {
      for (int l = 0; complete && l < next.num_layers; ++l) complete = !HoldsLayer(r, l) || Covered(c.held, l, r, T);
    }
    if (complete) return c;
  }
  std::string what;
  for (size_t q = 0; q < published.size(); ++q) {
    what += (q == 0 ? "rank " : "; rank ") + std::to_string(q) + ":";
    bool any = false;
    for (const auto& i : published[q]) {
      if (!i.complete()) continue;
      what += (any ? ", step " : " step ") + std::to_string(i.step) + " " + LayersText(i);
      any = true;
    }
    if (!any) what += " nothing";
  }
  return Status::DataErr("no step from " + std::to_string(not_before) +
                         " on has every layer of the new plan in some rank's snapshot (" + what + ")");
}

Result<std::unique_ptr<StageWorker>> StageWorker::Restore(
    const model::GptConfig& cfg, const Topology& next, int new_rank,
    const c10::intrusive_ptr<c10d::Store>& store, const model::TrainOptions& opts,
    const model::TokenSource& data, int64_t step, const StageSnapshot* own,
    const std::vector<Held>& held, const std::vector<plan::LayerFetch>& fetches,
    std::chrono::milliseconds timeout, SnapshotArena* arena, int arena_keep) {
  const std::string who = "rank " + std::to_string(new_rank);
  if (new_rank < 0 || new_rank >= next.world_size() ||
      held.size() != static_cast<size_t>(next.world_size())) {
    return Status::Config(who + ": outside the new plan, or holdings for " +
                          std::to_string(held.size()) + " ranks");
  }
  const int T = CommonPieces(next, held);
  for (const Held& h : held) {
    if (!RangesOf(h).empty() && (h.tp < 1 || T % h.tp != 0 || cfg.n_head % T != 0 ||
                                          cfg.kv_heads() % T != 0 || cfg.mlp_width() % T != 0)) {
      return Status::Config(who + ": a snapshot of tensor parallelism " + std::to_string(h.tp) +
                            " cannot be cut into the " + std::to_string(T) + " pieces the new plan needs");
    }
  }
  const Held mine = held[new_rank];
  const RankInfo& me = next.ranks[new_rank];
  // Its own snapshot is its state only if it holds the shard it now runs;
  // otherwise it serves pieces (to itself, too) or the ranks of that shard.
  const bool own_shard = mine.tp == me.tp && mine.tp_rank == me.tp_rank;
  if (!RangesOf(mine).empty() && own == nullptr) {
    return Status::Config(who + ": claims " + LayersText(mine) + " but has no snapshot");
  }
  static const StageSnapshot kNothing;
  if (own == nullptr) own = &kNothing;
  OB_ASSIGN_OR_RETURN(std::vector<Transfer> transfers, PlanTransfers(next, held, fetches, T, cfg.tied));
  auto t_phase = Clock::now();
  // Not drawn: every parameter is set below (drawing gpt2-medium's takes
  // seconds a restarted worker must not spend).
  auto created = Build(cfg, next, new_rank, store, opts, data, timeout, /*init=*/false);
  if (!created.ok()) return created.status();
  std::unique_ptr<StageWorker> w = std::move(*created);
  w->restore_times_.build = SecondsSince(t_phase) - w->join_seconds_;
  t_phase = Clock::now();
  try {
    c10::intrusive_ptr<compat::Backend> group;
    if (std::any_of(transfers.begin(), transfers.end(), [](const Transfer& t) { return t.from != t.to; })) {
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>("recovery", store);
      group = compat::MakeProcessGroup(prefixed, new_rank, next.world_size(), opts.device,
                                       timeout);
    }
    // The new stage's keys, and the state each gets: own or received.
    std::map<std::string, torch::Tensor> params;  // key -> new parameter
    for (const auto& item : w->stage_->named_parameters()) {
      params[SnapshotKey(item.key(), item.value(), w->tied_)] = item.value();
    }
    std::map<std::string, TensorSnapshot> state;
    for (const auto& [key, p] : params) {
      auto it = own->tensors.find(key);
      if (own_shard && it != own->tensors.end()) state[key] = it->second;
    }
    // A piece of one of `h`'s snapshot tensors, or the whole (piece -1).
    auto cut = [&](const std::string& key, const TensorSnapshot& s, const Held& h, int piece) {
      if (piece < 0) return s;
      const std::string name = ShardName(key);
      TensorSnapshot out;
      out.value = model::PieceOf(name, s.value, h.tp, h.tp_rank, T, piece, cfg.vocab_size);
      out.exp_avg = model::PieceOf(name, s.exp_avg, h.tp, h.tp_rank, T, piece, cfg.vocab_size);
      out.exp_avg_sq = model::PieceOf(name, s.exp_avg_sq, h.tp, h.tp_rank, T, piece, cfg.vocab_size);
      out.adam_step = s.adam_step;
      return out;
    };
    // The keys a transfer moves: the layer's (a replicated one in the
    // receiver's first piece only), and the tied weight with it.
    auto keys_of = [&](const Transfer& t, const std::vector<std::string>& layer_keys) {
      std::vector<std::string> keys;
      const RankInfo& to = next.ranks[t.to];
      for (const auto& key : layer_keys) {
        if (t.piece >= 0 && t.piece != model::FirstPiece(to.tp, to.tp_rank, T) &&
            model::ShardKindOf(ShardName(key)) == model::ShardKind::kReplicated) {
          continue;
        }
        keys.push_back(key);
      }
      if (t.with_tied) keys.push_back(StageSnapshot::kTied);
      return keys;
    };

    const auto device = opts.device;
    std::vector<Work> works;                // sends and receives, all posted before any wait
    std::vector<torch::Tensor> in_flight;   // what the sends read from
    struct Pending {
      std::string key;
      int piece = -1;
      torch::Tensor packed, step;
    };
    std::vector<Pending> receives;
    std::map<std::string, std::map<int, TensorSnapshot>> pieces;  // key -> piece -> state
    std::map<std::pair<int, int>, int> sent;  // (from, to) -> tensors so far
    for (const Transfer& t : transfers) {
      if (t.from != new_rank && t.to != new_rank) continue;
      if (t.from == t.to) {  // a re-shard of this rank's own snapshot
        for (const auto& key : keys_of(t, LayerKeys(own->tensors, t.layer))) {
          pieces[key][t.piece] = cut(key, own->tensors.at(key), mine, t.piece);
        }
        continue;
      }
      int& index = sent[{t.from, t.to}];
      const bool sending = t.from == new_rank;
      const auto keys = keys_of(t, sending ? LayerKeys(own->tensors, t.layer) : LayerKeys(params, t.layer));
      for (const auto& key : keys) {
        // Tags count the pair's tensors in list order: both ends agree.
        const int tag = 2 * index++;
        if (sending) {
          const TensorSnapshot s = cut(key, own->tensors.at(key), mine, t.piece);
          std::vector<torch::Tensor> packed{
              torch::stack({s.value, s.exp_avg, s.exp_avg_sq}).to(device).contiguous()};
          std::vector<torch::Tensor> count{
              torch::full({1}, s.adam_step, torch::TensorOptions().dtype(torch::kLong))
                  .to(device)};
          works.push_back(group->send(packed, t.to, tag));
          works.push_back(group->send(count, t.to, tag + 1));
          in_flight.push_back(packed[0]);
          in_flight.push_back(count[0]);
        } else {
          const torch::Tensor& p = params.at(key);
          std::vector<int64_t> shape{3};
          if (t.piece < 0) {
            for (auto d : p.sizes()) shape.push_back(d);
          } else {  // the piece's shape: its views' with the rows added up
            auto views = model::PieceViews(ShardName(key), p, me.tp, me.tp_rank, T, t.piece, cfg.vocab_size);
            for (auto d : views[0].sizes()) shape.push_back(d);
            for (size_t v = 1; v < views.size(); ++v) shape[1] += views[v].size(0);
          }
          Pending r;
          r.key = key;
          r.piece = t.piece;
          r.packed = torch::empty(shape, p.options().device(device));
          r.step = torch::empty({1}, torch::TensorOptions().dtype(torch::kLong).device(device));
          receives.push_back(std::move(r));
          std::vector<torch::Tensor> a{receives.back().packed};
          std::vector<torch::Tensor> b{receives.back().step};
          works.push_back(group->recv(a, t.from, tag));
          works.push_back(group->recv(b, t.from, tag + 1));
        }
      }
    }
    for (const auto& work : works) WaitWork(work);
    w->restore_times_.transfers = SecondsSince(t_phase);
    t_phase = Clock::now();
    for (auto& r : receives) {
      auto packed = r.packed.cpu();
      TensorSnapshot s;
      s.value = packed[0].clone();
      s.exp_avg = packed[1].clone();
      s.exp_avg_sq = packed[2].clone();
      s.adam_step = r.step.cpu().item<int64_t>();
      if (r.piece < 0) {
        state[r.key] = std::move(s);
      } else {
        pieces[r.key][r.piece] = std::move(s);
      }
    }
    // A shard from its pieces (in piece order; a replicated tensor is one).
    for (auto& [key, by_piece] : pieces) {
      const std::string name = ShardName(key);
      std::vector<torch::Tensor> value, exp_avg, exp_avg_sq;
      for (auto& [piece, s] : by_piece) {
        value.push_back(s.value);
        exp_avg.push_back(s.exp_avg);
        exp_avg_sq.push_back(s.exp_avg_sq);
      }
      TensorSnapshot s;
      s.value = model::MergeShards(name, value);
      s.exp_avg = model::MergeShards(name, exp_avg);
      s.exp_avg_sq = model::MergeShards(name, exp_avg_sq);
      s.adam_step = by_piece.begin()->second.adam_step;
      state[key] = std::move(s);
    }

    torch::NoGradGuard no_grad;
    for (auto& [key, p] : params) {
      auto it = state.find(key);
      if (it == state.end()) {
        throw std::logic_error(who + ": no state for " + key + " after the transfers");
      }
      p.copy_(it->second.value);
      SetAdamState(*w->optimizer_, p, it->second);
    }
    w->restore_times_.load = SecondsSince(t_phase);
    t_phase = Clock::now();
    if (arena != nullptr) {  // the arena's slot may hold this state already
      Status st = w->AttachArena(arena, arena_keep, step);
      if (!st.ok()) return st;
    } else {
      CaptureSnapshot(w->stage_, w->tied_, *w->optimizer_, step, &w->snapshots_[0]);
      for (int s = 1; s < kSnapshots; ++s) w->snapshots_[s] = StageSnapshot();
      w->newest_ = 0;
    }
    w->restore_times_.snapshot = SecondsSince(t_phase);
  } catch (const std::logic_error& e) {
    return Status::Internal(FirstLine(e.what()));
  } catch (const std::exception& e) {
    return Status::Unavailable(who + ": recovery transfers failed: " + FirstLine(e.what()));
  }
  return Result<std::unique_ptr<StageWorker>>(std::move(w));
}

}  // namespace ob::runtime
