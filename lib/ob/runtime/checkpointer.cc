// Background checkpoint saves from pinned snapshots, and loading a stage's
// layers from any checkpoint (see checkpointer.h).
#include "ob/runtime/checkpointer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <thread>
#include <utility>

#include "ob/ckpt/checkpoint.h"
#include "ob/ckpt/safetensors.h"
#include "ob/manifest.pb.h"
#include "ob/model/tensor_parallel.h"

namespace ob::runtime {

namespace {

Result<ckpt::DType> ToDType(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Double: return ckpt::DType::kF64;
    case c10::ScalarType::Float: return ckpt::DType::kF32;
    case c10::ScalarType::Half: return ckpt::DType::kF16;
    case c10::ScalarType::BFloat16: return ckpt::DType::kBF16;
    case c10::ScalarType::Long: return ckpt::DType::kI64;
    case c10::ScalarType::Int: return ckpt::DType::kI32;
    default: return Status::Internal(std::string("no checkpoint dtype for ") + c10::toString(t));
  }
}

Result<c10::ScalarType> FromDType(ckpt::DType t) {
  switch (t) {
    case ckpt::DType::kF64: return c10::ScalarType::Double;
    case ckpt::DType::kF32: return c10::ScalarType::Float;
    case ckpt::DType::kF16: return c10::ScalarType::Half;
    case ckpt::DType::kBF16: return c10::ScalarType::BFloat16;
    case ckpt::DType::kI64: return c10::ScalarType::Long;
    case ckpt::DType::kI32: return c10::ScalarType::Int;
    default: return Status::DataErr(std::string("unsupported dtype ") + ckpt::DTypeName(t));
  }
}

// The names a snapshot key is stored under: the weight, its two moments,
// and the metadata key of its AdamW step count.
struct Names {
  std::string value, exp_avg, exp_avg_sq, adam_step;
};
Names StoredNames(const std::string& key) {
  return {key, key + ".exp_avg", key + ".exp_avg_sq", key + ".adam_step"};
}

std::string LayerPrefix(int layer) { return std::to_string(layer) + "."; }

// Whether snapshot key `key` belongs to the files of `layers` (the tied
// weight with layer 0 when `with_tied`).
bool InLayers(const std::string& key, const std::vector<int>& layers, bool with_tied) {
  if (key == StageSnapshot::kTied) {
    return with_tied && std::find(layers.begin(), layers.end(), 0) != layers.end();
  }
  const int layer = std::stoi(key.substr(0, key.find('.')));
  return std::find(layers.begin(), layers.end(), layer) != layers.end();
}

// Tensor parallelism: TP rank 0 of a stage receives the other ranks'
// shards of the keys it writes and returns them merged, whole; the others
// send theirs and return an empty snapshot. Keys in map order, for each
// the value and both moments, tag = their index: both ends agree. Shards
// have rank 0's shape but for the rows of a vocabulary shard.
StageSnapshot GatherShards(const StageSnapshot& snap, const std::vector<int>& layers, bool with_tied,
                           int t, int r, compat::Backend& group, int64_t vocab) {
  using Work = c10::intrusive_ptr<c10d::Work>;
  std::vector<Work> works;
  std::vector<torch::Tensor> keep;
  struct Parts {
    std::vector<torch::Tensor> value, exp_avg, exp_avg_sq;
  };
  std::map<std::string, Parts> parts;
  int tag = 0;
  for (const auto& [key, s] : snap.tensors) {
    if (!InLayers(key, layers, with_tied)) continue;
    const std::string name = ShardName(key);
    Parts& p = parts[key];
    for (const torch::Tensor* own : {&s.value, &s.exp_avg, &s.exp_avg_sq}) {
      std::vector<torch::Tensor>& out = own == &s.value ? p.value : own == &s.exp_avg ? p.exp_avg : p.exp_avg_sq;
      if (r != 0) {
        std::vector<torch::Tensor> buf{own->contiguous()};
        keep.push_back(buf[0]);
        works.push_back(group.send(buf, 0, tag));
      } else {
        out.push_back(*own);
        for (int q = 1; q < t; ++q) {
          std::vector<int64_t> shape(own->sizes().begin(), own->sizes().end());
          if (model::ShardKindOf(name) == model::ShardKind::kVocabRows) {
            auto [lo, hi] = model::VocabRange(vocab, t, q);
            shape[0] = hi - lo;
          }
          std::vector<torch::Tensor> buf{torch::empty(shape, own->options())};
          out.push_back(buf[0]);
          works.push_back(group.recv(buf, q, tag));
        }
      }
      ++tag;
    }
  }
  for (auto& w : works) {
    if (!w->wait()) throw std::runtime_error("gathering the shards was aborted");
  }
  StageSnapshot whole;
  whole.step = snap.step;
  whole.first_layer = snap.first_layer;
  whole.last_layer = snap.last_layer;
  whole.ranges = snap.ranges;
  if (r != 0) return whole;
  for (auto& [key, p] : parts) {
    const std::string name = ShardName(key);
    TensorSnapshot m;
    m.value = model::MergeShards(name, p.value).contiguous();
    m.exp_avg = model::MergeShards(name, p.exp_avg).contiguous();
    m.exp_avg_sq = model::MergeShards(name, p.exp_avg_sq).contiguous();
    m.adam_step = snap.tensors.at(key).adam_step;
    whole.tensors[key] = std::move(m);
  }
  return whole;
}

Status AddTensor(const std::string& name, const torch::Tensor& t, std::vector<ckpt::TensorView>* out) {
  OB_ASSIGN_OR_RETURN(ckpt::DType dtype, ToDType(t.scalar_type()));
  if (!t.is_contiguous() || t.device().type() != c10::DeviceType::CPU) {
    return Status::Internal(name + ": snapshot tensor is not contiguous host memory");
  }
  ckpt::TensorView v;
  v.name = name;
  v.dtype = dtype;
  v.shape.assign(t.sizes().begin(), t.sizes().end());
  v.data = t.data_ptr();
  v.bytes = static_cast<uint64_t>(t.nbytes());
  out->push_back(std::move(v));
  return Status::Ok();
}

// The tensors of `layer` in `snap` (with the tied weight for layer 0 when
// `with_tied`), and their metadata.
Status LayerViews(const StageSnapshot& snap, int layer, bool with_tied, int64_t step,
                  std::vector<ckpt::TensorView>* views, std::map<std::string, std::string>* meta) {
  (*meta)["step"] = std::to_string(step);
  const std::string prefix = LayerPrefix(layer);
  for (const auto& [key, t] : snap.tensors) {
    const bool mine = key.compare(0, prefix.size(), prefix) == 0 ||
                      (with_tied && layer == 0 && key == StageSnapshot::kTied);
    if (!mine) continue;
    const Names n = StoredNames(key);
    OB_RETURN_IF_ERROR(AddTensor(n.value, t.value, views));
    OB_RETURN_IF_ERROR(AddTensor(n.exp_avg, t.exp_avg, views));
    OB_RETURN_IF_ERROR(AddTensor(n.exp_avg_sq, t.exp_avg_sq, views));
    (*meta)[n.adam_step] = std::to_string(t.adam_step);
  }
  return Status::Ok();
}

// Layer files written at once: keeps the disk busy while one thread copies
// (measured on the development VM: 1 writer 0.26 of dd's bandwidth, 2 writers
// 0.5, 4 no better).
constexpr size_t kWriters = 2;

// Writes the layers' files and this rank's part; runs on the save thread,
// which fans the files out over kWriters threads.
Checkpointer::Done Save(const std::string& dir, int64_t step, int rank, std::vector<int> layers,
                        bool with_tied, const StageSnapshot* snap, int t, int r,
                        c10::intrusive_ptr<compat::Backend> group, int64_t vocab) {
  const auto start = std::chrono::steady_clock::now();
  Checkpointer::Done done;
  done.step = step;
  pb::Manifest part;
  Status st = ckpt::BeginStep(dir, step);
  StageSnapshot whole;
  if (t > 1 && st.ok()) {
    try {
      whole = GatherShards(*snap, layers, with_tied, t, r, *group, vocab);
      snap = &whole;
    } catch (const std::exception& e) {
      st = Status::Unavailable("step " + std::to_string(step) + ": gathering the tensor-parallel shards failed: " +
                               FirstLine(e.what()));
    }
    if (r != 0) layers.clear();  // TP rank 0 writes them
  }
  std::vector<Result<pb::CheckpointFile>> files(layers.size(), Status::Internal("not written"));
  std::atomic<size_t> next{0};
  auto writer = [&] {
    for (size_t i = next++; i < layers.size(); i = next++) {
      std::vector<ckpt::TensorView> views;
      std::map<std::string, std::string> meta;
      Status s = LayerViews(*snap, layers[i], with_tied, step, &views, &meta);
      files[i] = s.ok() ? ckpt::WriteLayer(dir, step, layers[i], views, meta) : Result<pb::CheckpointFile>(s);
    }
  };
  if (st.ok()) {
    std::vector<std::thread> pool;
    for (size_t k = 1; k < std::min(kWriters, layers.size()); ++k) pool.emplace_back(writer);
    writer();
    for (auto& t : pool) t.join();
  }
  for (auto& f : files) {
    if (!st.ok()) break;
    if (!f.ok()) {
      st = f.status();
      break;
    }
    done.bytes += f->size();
    *part.add_files() = *f;
  }
  if (st.ok()) st = ckpt::WritePart(dir, step, rank, part);
  if (!st.ok()) done.error = st.message();
  done.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return done;
}

}  // namespace

Checkpointer::Checkpointer(std::string dir, int64_t every, const Topology& topo, int rank,
                           c10::intrusive_ptr<compat::Backend> tp_group, int64_t vocab_size)
    : dir_(std::move(dir)),
      every_(every),
      rank_(rank),
      tp_(topo.ranks[static_cast<size_t>(rank)].tp),
      tp_rank_(topo.ranks[static_cast<size_t>(rank)].tp_rank),
      tp_group_(std::move(tp_group)),
      vocab_size_(vocab_size),
      num_layers_(topo.num_layers) {
  // The layers whose shard-0 writer is this stage's TP rank 0 (every TP
  // rank of that stage takes part in writing them).
  const int stage_rank0 = rank - tp_rank_;
  for (int l = 0; l < topo.num_layers; ++l) {
    const auto& owners = topo.layer_groups[static_cast<size_t>(topo.layer_group_of[static_cast<size_t>(l)])].ranks;
    if (!owners.empty() && owners.front() == stage_rank0) layers_.push_back(l);
  }
  // The tied weight goes with layer 0, written by layer 0's writer, which
  // holds it (the embedding stage owns the tied weight).
  writes_tied_ = std::find(layers_.begin(), layers_.end(), 0) != layers_.end();
}

Checkpointer::~Checkpointer() {
  if (pending_.valid()) pending_.wait();
}

bool Checkpointer::IsCheckpointStep(int64_t step, int64_t last_step) const {
  // The last step always: a run given a checkpoint directory ends with its
  // weights there, whatever `every` says.
  return step == last_step || (every_ > 0 && (step + 1) % every_ == 0);
}

bool Checkpointer::AfterStep(StageWorker& worker, int64_t step, int64_t last_step, Done* finished,
                             double* waited, bool force) {
  *waited = 0;
  bool have = false;
  const bool save = force || IsCheckpointStep(step, last_step);
  if (pending_.valid() &&
      (save || pending_.wait_for(std::chrono::seconds(0)) == std::future_status::ready)) {
    const auto t0 = std::chrono::steady_clock::now();
    *finished = pending_.get();  // waits only at a checkpoint step
    *waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    worker.Unpin();
    have = true;
  }
  if (!save) return have;
  const StageSnapshot* snap = worker.Pin(step);
  if (snap != nullptr) {
    pending_ = std::async(std::launch::async, Save, dir_, step, rank_, layers_, writes_tied_, snap, tp_, tp_rank_,
                          tp_group_, vocab_size_);
  }
  return have;
}

bool Checkpointer::Finish(StageWorker& worker, Done* finished) {
  if (!pending_.valid()) return false;
  *finished = pending_.get();
  worker.Unpin();
  return true;
}

Result<StageSnapshot> LoadStageSnapshot(const std::string& ckpt_dir, int first, int last, bool tied, int tp,
                                        int tp_rank) {
  return LoadStageSnapshot(ckpt_dir, LayerRanges{{first, last}}, tied, tp, tp_rank);
}

Result<StageSnapshot> LoadStageSnapshot(const std::string& ckpt_dir, const LayerRanges& ranges, bool tied, int tp,
                                        int tp_rank) {
  StageSnapshot out;
  out.first_layer = ranges.empty() ? 0 : ranges.front().first;
  out.last_layer = -1;
  for (const auto& [first, last] : ranges) {
    out.first_layer = std::min(out.first_layer, first);
    out.last_layer = std::max(out.last_layer, last);
  }
  if (ranges.size() > 1) out.ranges = ranges;
  out.tp = tp;
  out.tp_rank = tp_rank;
  std::vector<int> layers;
  for (const auto& [first, last] : ranges) {
    for (int l = first; l <= last; ++l) layers.push_back(l);
  }
  std::sort(layers.begin(), layers.end());
  if (tied && (layers.empty() || layers.front() != 0)) layers.insert(layers.begin(), 0);  // the tied weight lives with layer 0
  int64_t step = -2;
  for (int layer : layers) {
    const std::string path = ckpt_dir + "/" + ckpt::LayerFileName(layer);
    OB_ASSIGN_OR_RETURN(ckpt::SafetensorsHeader h, ckpt::ReadSafetensorsHeader(path));
    std::map<std::string, const ckpt::SafetensorsEntry*> by_name;
    for (const auto& e : h.tensors) by_name[e.name] = &e;
    auto read = [&](const std::string& tensor) -> Result<torch::Tensor> {
      auto it = by_name.find(tensor);
      if (it == by_name.end()) return Status::DataErr(path + ": no tensor " + tensor);
      OB_ASSIGN_OR_RETURN(c10::ScalarType type, FromDType(it->second->dtype));
      torch::Tensor t = torch::empty(it->second->shape, torch::TensorOptions().dtype(type));
      OB_RETURN_IF_ERROR(ckpt::ReadTensor(path, h, *it->second, t.data_ptr()));
      return t;
    };
    const bool own_layer = InRanges(ranges, layer);
    for (const auto& e : h.tensors) {
      const std::string& key = e.name;
      const bool is_value = key.find(".exp_avg") == std::string::npos;
      if (!is_value) continue;
      const bool is_tied = key == StageSnapshot::kTied;
      if ((is_tied && !tied) || (!is_tied && !own_layer)) continue;
      const Names n = StoredNames(key);
      TensorSnapshot t;
      OB_ASSIGN_OR_RETURN(t.value, read(n.value));
      OB_ASSIGN_OR_RETURN(t.exp_avg, read(n.exp_avg));
      OB_ASSIGN_OR_RETURN(t.exp_avg_sq, read(n.exp_avg_sq));
      auto m = h.metadata.find(n.adam_step);
      if (m == h.metadata.end()) return Status::DataErr(path + ": no metadata " + n.adam_step);
      try {
        t.adam_step = std::stoll(m->second);
      } catch (const std::exception&) {
        return Status::DataErr(path + ": metadata " + n.adam_step + " is not a number");
      }
      if (tp > 1) {  // this rank's shard of the whole tensors
        const std::string name = ShardName(key);
        if (!model::SplitsInto(name, t.value, tp)) {
          return Status::DataErr(path + ": " + key + " does not split in " + std::to_string(tp) + " shards");
        }
        t.value = model::ShardOf(name, t.value, tp, tp_rank);
        t.exp_avg = model::ShardOf(name, t.exp_avg, tp, tp_rank);
        t.exp_avg_sq = model::ShardOf(name, t.exp_avg_sq, tp, tp_rank);
      }
      out.tensors[key] = std::move(t);
    }
    auto s = h.metadata.find("step");
    if (s != h.metadata.end()) step = std::stoll(s->second);
  }
  if (tied && out.tensors.count(StageSnapshot::kTied) == 0) {
    return Status::DataErr(ckpt_dir + ": layer 0 holds no tied weight");
  }
  out.step = step;
  return out;
}

}  // namespace ob::runtime
