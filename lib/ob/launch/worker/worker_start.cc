// How a worker starts (worker.h): its generation read from the store, its
// inputs opened and agreed on with the master's, its device and precision,
// the training options, and the weights it starts from: initial, a
// checkpoint (whatever layout saved it) or the snapshots its peers hold.
#include "ob/launch/worker/worker_impl.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <cstdlib>
#include <sstream>

#include "ob/ckpt/checkpoint.h"
#include "ob/io/text.h"
#include "ob/launch/wire/devices.h"
#include "ob/launch/wire/plan_data.h"
#include "ob/launch/wire/store_keys.h"
#include "ob/launch/wire/weight_source.h"
#include "ob/launch/worker/mfu.h"
#include "ob/log.h"

namespace ob::launch::detail {
namespace {

Result<model::TokenSource> OpenData(const std::string& spec, const model::GptConfig& cfg,
                                    uint64_t seed, const std::string& facts) {
  if (spec == "synthetic") return model::TokenSource::Synthetic(cfg.vocab_size, seed);
  if (facts.empty()) return model::TokenSource::Open(spec);
  OB_ASSIGN_OR_RETURN(model::TokenFileFacts known, model::TokenFileFacts::Decode(facts));
  return model::TokenSource::Open(spec, model::TokenFormat::kAuto, &known);
}

void StoreSet(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key,
              const std::string& value) {
  store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

// Where a SNAPSHOTS generation starts from: every rank publishes the
// complete snapshots of the generation's lineage its arena holds, and all
// derive the same answer (StageWorker::ChooseStart).
struct StartPoint {
  int64_t step = -1;                 // S: the state after it is restored
  std::vector<runtime::StageWorker::Held> held;
  int own_slot = -1;                 // this rank's arena slot at S
};

Result<StartPoint> AgreeOnStart(const c10::intrusive_ptr<c10d::Store>& store,
                                const runtime::SnapshotArena& arena, int rank,
                                const runtime::Topology& topo, const pb::WeightSource& source) {
  using Arena = runtime::SnapshotArena;
  std::ostringstream mine;
  for (int s = 0; s < Arena::kSlots; ++s) {
    Arena::SlotInfo i = arena.info(s);
    if (i.lineage != source.lineage()) i = Arena::SlotInfo();  // another lineage's: never ours
    mine << i.step << " " << i.first_layer << " " << i.last_layer << " " << i.tp << " " << i.tp_rank << " "
         << runtime::RangesText(i.ranges) << " ";
  }
  StoreSet(store, HeldKey(rank), mine.str());
  OB_LOG(Debug) << "own snapshots of lineage " << source.lineage()
                << " (step first last tp shard ranges, per slot): " << mine.str();
  std::vector<runtime::StageWorker::PublishedSlots> all(static_cast<size_t>(topo.world_size()));
  int64_t newest = -2;
  for (int q = 0; q < topo.world_size(); ++q) {
    std::istringstream in(StoreGet(store, HeldKey(q)));
    for (auto& i : all[static_cast<size_t>(q)]) {
      std::string ranges;
      if (!(in >> i.step >> i.first_layer >> i.last_layer >> i.tp >> i.tp_rank >> ranges) ||
          !runtime::ParseRanges(ranges, &i.ranges)) {
        return Status::DataErr("rank " + std::to_string(q) + " published a malformed snapshot list");
      }
      newest = std::max(newest, i.step);
    }
  }
  auto chosen = runtime::StageWorker::ChooseStart(topo, all, std::max<int64_t>(source.step(), -1));
  if (!chosen.ok()) {
    return Status::DataErr("the generation's source is the snapshots of lineage " +
                           std::to_string(source.lineage()) + " from step " + std::to_string(source.step()) +
                           " on, and " + chosen.status().message() + ": refusing to start from anything else");
  }
  if (chosen->step < newest - 1 && rank == 0) {
    OB_LOG(Warn) << "restoring step " << chosen->step << ", not the newest snapshot (step " << newest
                 << "): only at step " << chosen->step << " does some rank hold every layer of the new plan";
  }
  StartPoint sp;
  sp.step = chosen->step;
  sp.held = std::move(chosen->held);
  sp.own_slot = chosen->slot[static_cast<size_t>(rank)];
  return sp;
}

}  // namespace

Status WorkerRun::ReadGeneration() {
  gen_key_ = GenerationKey(o_.generation);
  try {
    const std::string bytes = StoreGet(root_, gen_key_);
    if (!gen_.ParseFromString(bytes)) {
      return Status::DataErr("the rendezvous store's " + gen_key_ + " is not an ob Generation");
    }
  } catch (const std::exception& e) {
    return Status::Unavailable("cannot read " + gen_key_ + " from the rendezvous store: " +
                               FirstLine(e.what()));
  }
  auto loaded = plan::FromProto(gen_.plan());
  if (!loaded.ok()) return loaded.status().WithContext(gen_key_);
  loaded_ = std::move(loaded).value();
  cfg_ = model::GptConfig::FromProto(gen_.plan().model());
  OB_RETURN_IF_ERROR(cfg_.Validate().WithContext(gen_key_));
  OB_ASSIGN_OR_RETURN(topo_, runtime::BuildTopology(loaded_.templates, loaded_.instantiation,
                                                    loaded_.problem.microbatch_size));
  if (o_.world != topo_.world_size())
    return Status::Config("worker started for a world of " + std::to_string(o_.world) +
                          ", generation " + std::to_string(o_.generation) + " has " +
                          std::to_string(topo_.world_size()) + " ranks");
  if (o_.rank < 0 || o_.rank >= topo_.world_size())
    return Status::Config("rank " + std::to_string(o_.rank) + " out of range");
  return Status::Ok();
}

// The data: the file every host reads, and the checkpoint directory every
// host shares (inputs.h). A mistake here (the file missing, malformed, not
// the job's; the directory not the master's) meets every restart again:
// Permanent.
Status WorkerRun::OpenInputs() {
  model::TokenSource d = model::TokenSource::Synthetic(cfg_.vocab_size, o_.seed);
  Status st = OpenTrainingData(&d);
  if (!st.ok()) {
    const bool lasting = st.code() == Code::kDataErr || st.code() == Code::kNoInput || st.code() == Code::kUsage;
    return lasting ? Permanent(st) : st;
  }
  data_ = std::move(d);
  st = SameCheckpointDir(*client_, o_.ckpt_dir, o_.host);
  if (!st.ok()) return st.code() == Code::kConfig ? Permanent(st) : st;
  return Status::Ok();
}

// --data opened and agreed on, and the evaluation data: a file of its own,
// or the held-out end of --data (then *d is the rest).
Status WorkerRun::OpenTrainingData(model::TokenSource* d) {
  OB_ASSIGN_OR_RETURN(*d, OpenData(o_.data, cfg_, o_.seed, o_.data_facts));
  OB_RETURN_IF_ERROR(AgreeOnInput(*client_, "--data", o_.data, o_.host, who_));
  OB_RETURN_IF_ERROR(AgreeOnContent(*client_, "--data", o_.data, o_.host, who_, d->content_sum()));
  if (d->content_sum().empty()) {
    OB_ASSIGN_OR_RETURN(check_,
                        ContentCheck::Start(*client_, "--data", o_.data, o_.host, who_, o_.generation, o_.rank));
  }
  const int seq = SequenceLength(gen_.plan(), cfg_);
  OB_RETURN_IF_ERROR(d->Check(seq, cfg_.vocab_size));
  if (!o_.eval_data.empty()) {
    OB_ASSIGN_OR_RETURN(model::TokenSource e, OpenData(o_.eval_data, cfg_, o_.seed + 1, ""));
    OB_RETURN_IF_ERROR(AgreeOnInput(*client_, "--eval-data", o_.eval_data, o_.host, who_));
    OB_RETURN_IF_ERROR(AgreeOnContent(*client_, "--eval-data", o_.eval_data, o_.host, who_, e.content_sum()));
    OB_RETURN_IF_ERROR(e.Check(seq, cfg_.vocab_size));
    eval_ = std::move(e);
  } else if (o_.eval_split > 0) {
    model::TokenSource kept = *d, held = *d;
    OB_RETURN_IF_ERROR(model::SplitForEval(*d, o_.eval_split, seq, &kept, &held));
    *d = kept;
    eval_ = held;
  }
  return Status::Ok();
}

// The device and precision (devices.h), and our share of the host's cores:
// the agent sets OMP_NUM_THREADS, which a standby that already started
// LibTorch's pool must apply itself.
Status WorkerRun::ChooseDevice() {
  OB_ASSIGN_OR_RETURN(DeviceKind asked, ParseDevice(o_.device));
  const int gpus = asked == DeviceKind::kCpu ? 0 : compat::CudaDeviceCount();
  const DeviceKind device = ResolveDevice(asked, gpus);
  if (device == DeviceKind::kCuda && gpus == 0) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return Status::Unavailable("--device cuda: this worker sees no GPU (CUDA_VISIBLE_DEVICES=" +
                               std::string(visible != nullptr ? visible : "unset") + ", LibTorch " +
                               compat::TorchVersion() + ")");
  }
  cuda_ = device == DeviceKind::kCuda;
  OB_ASSIGN_OR_RETURN(precision_name_, ResolvePrecision(o_.precision, device));
  OB_ASSIGN_OR_RETURN(precision_, model::ParsePrecision(precision_name_));
  if (const std::string& dtype = gen_.plan().profile().dtype();
      !dtype.empty() && dtype != model::PrecisionDtype(precision_)) {
    OB_LOG(Warn) << "the plan was profiled in " << dtype << ", this run trains in " << precision_name_;
  }
  if (const char* omp = std::getenv("OMP_NUM_THREADS"); omp != nullptr) {
    const int n = std::atoi(omp);
    if (n > 0 && n != at::get_num_threads()) at::set_num_threads(n);
  }
  runtime_ = DescribeRuntime(DeviceName(device), precision_name_);
  return Status::Ok();
}

void WorkerRun::SetTrainOptions() {
  model::TrainOptions& t = t_;
  t.device = cuda_ ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  t.precision = precision_;
  t.steps = o_.steps;
  t.global_batch = topo_.global_batch();
  t.microbatch = topo_.microbatch_size;
  t.seq_len = static_cast<int>(gen_.plan().sequence_length());
  t.lr = o_.lr;
  t.warmup_steps = o_.warmup_steps;
  t.min_lr = o_.min_lr;
  t.cosine = o_.lr_schedule != "constant";
  t.weight_decay = o_.weight_decay;
  t.beta1 = o_.beta1;
  t.beta2 = o_.beta2;
  t.eps = o_.eps;
  t.grad_clip = o_.clip_norm;
  if (o_.rank == 0 && o_.generation == 1) {
    std::ostringstream line;
    line << "optimizer: AdamW lr " << t.lr << " (" << t.warmup_steps << " warm-up steps, then ";
    if (t.cosine) line << "cosine to " << t.min_lr << " at step " << t.steps;
    else line << "constant";
    line << "), weight decay " << t.weight_decay << ", betas " << t.beta1 << "/" << t.beta2 << ", eps " << t.eps
         << ", clip norm ";
    if (t.grad_clip > 0) line << t.grad_clip;
    else line << "none";
    OB_LOG(Info) << line.str();
  }
  t.seed = o_.seed;
  // The overlap benchmark compares against the schedule without overlap.
  if (const char* ov = std::getenv("OB_OVERLAP"); ov != nullptr && std::string(ov) == "0") {
    t.overlap_allreduce = false;
  }
  // Snapshots in the background (runtime/snapshot.h) on CUDA, where a side
  // stream's DMA copies them while the GPU computes. On the CPU the copy
  // needs cores and memory bandwidth the step uses: on this project's
  // 2-vCPU machine a background copy made gpt2's steps 1.3x (one intra-op
  // thread) to 1.5x (two) slower than copying on the training thread
  // (bench/snapshot_cost.sh, docs/benchmarks.md), so the CPU default is the
  // training thread. OB_SNAPSHOT_ASYNC=0/1 decides instead.
  t.async_snapshot = t.device.is_cuda();
  if (const char* as = std::getenv("OB_SNAPSHOT_ASYNC"); as != nullptr && *as != '\0') {
    t.async_snapshot = std::string(as) != "0";
  }
  OB_LOG(Info) << "host snapshots: "
               << (t.async_snapshot ? "copied in the background" : "copied on the training thread")
               << " (" << at::get_num_threads() << " intra-op threads)";
}

// The dense peak MFU is over: this GPU's, not the one the plan was priced
// for (mfu.h MfuPeakFlops); none on the CPU.
void WorkerRun::ChoosePeak() {
  if (!t_.device.is_cuda()) return;
  std::string from;
  peak_flops_ = MfuPeakFlops(compat::CudaDeviceName(t_.device.index()), precision_,
                             gen_.plan().profile().device().peak_tflops(), gen_.plan().profile().dtype(), &from);
  if (o_.rank == 0 || peak_flops_ <= 0) {
    OB_LOG(Info) << "MFU over " << (peak_flops_ > 0 ? io::FormatDouble(peak_flops_ / 1e12) + " TFLOP/s, " : "")
                 << from;
  }
}

Status WorkerRun::Refuse(const Status& why) const {
  return Status::DataErr("generation " + std::to_string(o_.generation) + ": cannot start from " +
                         DescribeSource(gen_.source()) + ": " + why.message());
}

// The snapshot arena, the generation's groups, and the weights: the
// initial ones, or RestoreWeights.
Status WorkerRun::StartWeights() {
  {
    const char* fd = std::getenv("OB_SNAPSHOT_FD");
    auto opened = fd != nullptr && *fd != '\0'
                      ? runtime::SnapshotArena::Open(std::atoi(fd), "snapshot memory (fd " + std::string(fd) + ")")
                      : runtime::SnapshotArena::Anonymous();
    if (!opened.ok()) return opened.status();
    arena_ = std::move(opened).value();
  }
  // Groups of this generation live under its own prefix: nothing of an
  // earlier generation's half-built groups can leak in.
  gen_store_ = c10::make_intrusive<c10d::PrefixStore>(GenerationStorePrefix(o_.generation), root_);
  rep_.phase = pb::PHASE_JOINING;
  const pb::WeightSource& source = gen_.source();
  arena_->set_lineage(source.lineage());
  if (source.kind() == pb::WeightSource::INITIAL) {
    if (o_.generation > 1) {
      OB_LOG(Warn) << "starting from the initial weights, as the master decided";
    }
    auto created = runtime::StageWorker::Create(cfg_, topo_, o_.rank, gen_store_, t_, *data_, timeout_, arena_.get());
    if (!created.ok()) return created.status();
    worker_ = std::move(created).value();
    return Status::Ok();
  }
  if (source.kind() == pb::WeightSource::CHECKPOINT || source.kind() == pb::WeightSource::SNAPSHOTS) {
    return RestoreWeights();
  }
  return Status::DataErr(gen_key_ + ": the generation names no weight source");
}

// From a checkpoint (whatever layout saved it) or from the snapshots of the
// lineage the peers hold (AgreeOnStart), with the layers this rank lacks
// fetched from those that hold them.
Status WorkerRun::RestoreWeights() {
  const pb::WeightSource& source = gen_.source();
  StartPoint sp;
  runtime::StageSnapshot own;
  if (source.kind() == pb::WeightSource::CHECKPOINT) {
    const auto& me = topo_.ranks[static_cast<size_t>(o_.rank)];
    auto manifest = ckpt::LoadManifest(source.checkpoint());
    if (!manifest.ok()) return Refuse(manifest.status());
    if (static_cast<int64_t>(manifest->step()) != source.step()) {
      return Refuse(Status::DataErr("it holds step " + std::to_string(manifest->step())));
    }
    auto loaded_state = runtime::LoadStageSnapshot(
        source.checkpoint(), runtime::RangesOf(me), cfg_.tied && (me.Holds(0) || me.Holds(topo_.num_layers - 1)),
        me.tp, me.tp_rank);
    if (!loaded_state.ok()) return Refuse(loaded_state.status());
    own = std::move(loaded_state).value();
    sp.step = source.step();
    for (const auto& r : topo_.ranks) sp.held.push_back({r.first_layer, r.last_layer, r.tp, r.tp_rank, r.ranges});
  } else {
    Result<StartPoint> agreed = Status::Internal("");
    try {
      agreed = AgreeOnStart(gen_store_, *arena_, o_.rank, topo_, source);
    } catch (const std::exception& e) {
      return Status::Unavailable("generation " + std::to_string(o_.generation) +
                                 ": peers did not publish their snapshots: " + FirstLine(e.what()));
    }
    if (!agreed.ok()) return Refuse(agreed.status());
    sp = std::move(agreed).value();
    if (sp.own_slot >= 0) {
      auto view = arena_->View(sp.own_slot);
      if (!view.ok()) return view.status();
      own = std::move(view).value();
    }
  }
  OB_LOG(Info) << "restoring step " << sp.step << " from " << DescribeSource(source);
  const bool have_own = source.kind() == pb::WeightSource::CHECKPOINT || sp.own_slot >= 0;
  std::vector<plan::LayerFetch> fetches;
  for (const auto& f : gen_.fetches()) {
    fetches.push_back({static_cast<int>(f.node()), static_cast<int>(f.layer()), static_cast<int>(f.from_node()), 0});
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto restored = runtime::StageWorker::Restore(cfg_, topo_, o_.rank, gen_store_, t_, *data_, sp.step,
                                                have_own ? &own : nullptr, sp.held, fetches, timeout_,
                                                arena_.get(), sp.own_slot);
  if (!restored.ok()) return restored.status().WithContext("restoring step " + std::to_string(sp.step));
  worker_ = std::move(restored).value();
  restore_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() -
                     worker_->join_seconds();
  const auto& rt = worker_->restore_times();
  auto ms = [](double s) { return std::to_string(static_cast<int64_t>(s * 1000 + 0.5)); };
  OB_LOG(Info) << "restored step " << sp.step << " in " << ms(restore_seconds_) << " ms: build " << ms(rt.build)
               << ", transfers " << ms(rt.transfers) << ", load " << ms(rt.load) << ", snapshot " << ms(rt.snapshot)
               << " (joining the groups " << ms(worker_->join_seconds()) << " ms more)";
  first_step_ = sp.step + 1;
  return Status::Ok();
}

// Fault injection for tests ($OB_INJECT, from ob-launch --inject).
Status WorkerRun::Inject() {
  const char* spec = std::getenv("OB_INJECT");
  if (spec == nullptr) return Status::Ok();
  OB_ASSIGN_OR_RETURN(inject_, ParseInjection(spec, o_.rank, o_.generation));
  if (inject_.any()) {
    OB_LOG(Warn) << "fault injection: " << spec;
  }
  if (inject_.park_at >= 0 && std::getenv("OB_INJECT_RELEASE") == nullptr) {
    return Status::Usage("--inject " + std::to_string(o_.rank) + ":park=" + std::to_string(inject_.park_at) +
                         ": no $OB_INJECT_RELEASE names the file that releases it");
  }
  worker_->SetSlowdown(inject_.slow, inject_.spin);
  worker_->SetStall(inject_.stall_at);
  if (check_) check_->HoldVerdictUntil(inject_.check_at);
  return Status::Ok();
}

// The checkpointer (--ckpt-dir; ckpt_every 0: the last step, and when the
// master asks).
Status WorkerRun::MakeSaver() {
  now_key_ = CheckpointNowKey(o_.generation);
  if (o_.ckpt_dir.empty()) return Status::Ok();
  c10::intrusive_ptr<compat::Backend> tp_group;
  const auto& me = topo_.ranks[static_cast<size_t>(o_.rank)];
  if (me.tp > 1) {  // the shards of a save go to TP rank 0 over a CPU group of their own
    const std::vector<int>& ranks = topo_.TpGroupOf(o_.rank);
    try {
      tp_group = compat::MakeProcessGroup(
          c10::make_intrusive<c10d::PrefixStore>("ckpt/" + runtime::Topology::TpGroupName(ranks), gen_store_),
          me.tp_rank, me.tp, torch::kCPU, timeout_);
    } catch (const std::exception& e) {
      return Status::Unavailable("joining the checkpoint group failed: " + FirstLine(e.what()));
    }
  }
  saver_ = std::make_unique<runtime::Checkpointer>(o_.ckpt_dir, o_.ckpt_every, topo_, o_.rank, tp_group,
                                                   cfg_.vocab_size);
  return Status::Ok();
}

}  // namespace ob::launch::detail
