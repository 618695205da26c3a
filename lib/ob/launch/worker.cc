#include "ob/launch/worker.h"

#include <ATen/record_function.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <csignal>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <chrono>
#include <cstdlib>
#include <sstream>

#include "ob/build_info.h"
#include "ob/clock.h"
#include "ob/control.pb.h"
#include "ob/io/file.h"
#include "ob/io/message.h"
#include "ob/io/records.h"
#include "ob/launch/decision.h"
#include "ob/launch/devices.h"
#include "ob/launch/inject.h"
#include "ob/launch/inputs.h"
#include "ob/io/text.h"
#include "ob/launch/relay_store.h"
#include "ob/launch/run_checks.h"
#include "ob/launch/store_client.h"
#include "ob/launch/store_keys.h"
#include "ob/log.h"
#include "ob/metrics.pb.h"
#include "ob/model/cross_entropy.h"
#include "ob/model/data.h"
#include "ob/model/linear.h"
#include "ob/model/recompute.h"
#include "ob/plan/plan_io.h"
#include "ob/profile/profile.h"
#include "ob/ckpt/checkpoint.h"
#include "ob/runtime/checkpointer.h"
#include "ob/runtime/snapshot_arena.h"
#include "ob/runtime/stage_worker.h"
#include "ob/torch_compat.h"

namespace ob::launch {
namespace {

Result<model::TokenSource> OpenData(const std::string& spec, const model::GptConfig& cfg,
                                    uint64_t seed, const std::string& facts) {
  if (spec == "synthetic") return model::TokenSource::Synthetic(cfg.vocab_size, seed);
  if (facts.empty()) return model::TokenSource::Open(spec);
  OB_ASSIGN_OR_RETURN(model::TokenFileFacts known, model::TokenFileFacts::Decode(facts));
  return model::TokenSource::Open(spec, model::TokenFormat::kAuto, &known);
}

}  // namespace

int VisibleGpus() { return compat::CudaDeviceCount(); }

std::string DescribeRuntime(const std::string& device, const std::string& precision) {
  const bool cuda = device == "cuda";
  const int threads = at::get_num_threads();
  const std::string gpu = !cuda ? "" : compat::CudaDeviceCount() > 0 ? " (" + compat::CudaDeviceName(0) + ")" : " (no GPU visible)";
  std::string s = "device " + device + gpu + ", backend " + (cuda ? "nccl" : "gloo") + ", precision " + precision +
                  ", " + std::to_string(threads) + " thread" + (threads == 1 ? "" : "s") + ", LibTorch " +
                  compat::TorchVersion();
  const std::string cuda_version = OB_CUDA_VERSION, nccl_version = OB_NCCL_VERSION;
  if (!nccl_version.empty()) {
    s += ", CUDA " + (cuda_version.empty() ? std::string("yes") : cuda_version) + ", NCCL " + nccl_version;
  }
  return s;
}

namespace {

std::string StoreGet(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key) {
  std::vector<uint8_t> v = store->get(key);
  return std::string(v.begin(), v.end());
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

// Calls `beat` every kBeatMs on a thread of its own until destroyed.
class Heartbeat {
 public:
  static constexpr int kBeatMs = 500;
  explicit Heartbeat(std::function<void()> beat) : beat_(std::move(beat)) {
    thread_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!cv_.wait_for(lock, std::chrono::milliseconds(kBeatMs), [this] { return stop_; })) {
        lock.unlock();
        beat_();
        lock.lock();
      }
    });
  }
  ~Heartbeat() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::function<void()> beat_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

Result<StartPoint> AgreeOnStart(const c10::intrusive_ptr<c10d::Store>& store,
                                const runtime::SnapshotArena& arena, int rank,
                                const runtime::Topology& topo, const pb::WeightSource& source) {
  using Arena = runtime::SnapshotArena;
  std::ostringstream mine;
  for (int s = 0; s < Arena::kSlots; ++s) {
    Arena::SlotInfo i = arena.info(s);
    if (i.lineage != source.lineage()) i = Arena::SlotInfo();  // another lineage's: never ours
    mine << i.step << " " << i.first_layer << " " << i.last_layer << " " << i.tp << " " << i.tp_rank << " ";
  }
  StoreSet(store, HeldKey(rank), mine.str());
  OB_LOG(Debug) << "own snapshots of lineage " << source.lineage()
                << " (step first last tp shard, per slot): " << mine.str();
  std::vector<runtime::StageWorker::PublishedSlots> all(static_cast<size_t>(topo.world_size()));
  int64_t newest = -2;
  for (int q = 0; q < topo.world_size(); ++q) {
    std::istringstream in(StoreGet(store, HeldKey(q)));
    for (auto& i : all[static_cast<size_t>(q)]) {
      if (!(in >> i.step >> i.first_layer >> i.last_layer >> i.tp >> i.tp_rank)) {
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

void WarmUpLibTorch(bool cuda) {
  std::vector<torch::Device> devices = {torch::kCPU};
  if (cuda && compat::CudaDeviceCount() > 0) devices.emplace_back(torch::kCUDA, 0);
  for (const torch::Device& d : devices) {
    try {  // on CUDA this creates the context and runs the first kernels
      auto w = torch::randn({64, 64}, torch::TensorOptions().device(d).requires_grad(true));
      auto x = torch::randn({8, 64}, torch::TensorOptions().device(d));
      auto y = torch::layer_norm(torch::gelu(torch::matmul(x, w)), {64}).softmax(-1);
      torch::nn::functional::cross_entropy(y, torch::zeros({8}, torch::TensorOptions().dtype(torch::kLong).device(d)))
          .backward();
      torch::optim::AdamW opt(std::vector<torch::Tensor>{w});
      opt.step();
      compat::Synchronize(d);
    } catch (const std::exception& e) {
      OB_LOG(Debug) << "warm-up on " << d.str() << ": " << FirstLine(e.what());
    }
  }
}

Status RunWorker(const WorkerOptions& o) {
  const int64_t process_start_ms = UnixMs();  // (a standby's: when it got its role)
  // A peer that dies closes its sockets, and Gloo writes with writev(2),
  // which cannot ask for MSG_NOSIGNAL: the next write to it would kill this
  // survivor by SIGPIPE (its agent starts it with the default disposition)
  // and turn one failure into two. Ignored, the write fails with EPIPE,
  // which the collective reports and the master recovers from.
  ::signal(SIGPIPE, SIG_IGN);
  // ps, top and pgrep show which rank a process is (a standby's command line
  // does not say).
  const std::string comm = "ob-worker-" + std::to_string(o.rank);
  ::prctl(PR_SET_NAME, comm.c_str(), 0, 0, 0);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  // Records on stdout, which our agent relays: a heartbeat now, as we take
  // the role, and every kBeatMs from a thread of its own until we exit (a
  // stopped process stops beating, a blocked one does not), each with our
  // phase; and one record per completed step. `self` is what every record
  // says of us (our stage once we know it), guarded by out_mu.
  io::RecordWriter out(STDOUT_FILENO, "<stdout>");
  std::mutex out_mu;
  pb::Metrics self;
  self.set_format_version(io::kMetricsFormatVersion);
  self.set_host(o.host);
  self.set_rank(static_cast<uint32_t>(o.rank));
  self.set_generation(o.generation);
  std::atomic<int> phase{pb::PHASE_STARTING};
  std::atomic<int64_t> last_done{-1};
  // Progress (hang_watch.h), on every record. The StageWorker advances
  // `progress` after every forward, backward, receive and collective and
  // sets `peer_wait` while it waits for a peer, once its schedule counts
  // (then `runtime_counts`: the counter moved inside a Step); we add one
  // per completed step in any case. Until the runtime counts, a rank is
  // taken as waiting for a peer while it is inside Step (where its loop can
  // only stop in a receive or a collective, or in compute) and as not
  // waiting outside it. While the training thread waits for work that
  // reports no progress of its own (a checkpoint write it must not
  // overtake, the last save), `off_step` makes every heartbeat count.
  std::atomic<int64_t> progress{0};
  std::atomic<int> peer_wait{0}, in_step{0}, off_step{0};
  std::atomic<bool> runtime_counts{false};
  auto stamp = [&](pb::Metrics* m) {  // REQUIRES: out_mu held
    if (off_step.load() != 0) progress.fetch_add(1);
    m->set_progress(static_cast<uint64_t>(progress.load()));
    m->set_waiting(runtime_counts.load() ? peer_wait.load() != 0 : in_step.load() != 0);
  };
  auto beat = [&] {
    std::lock_guard<std::mutex> lock(out_mu);
    pb::Metrics m = self;
    m.set_step(static_cast<uint64_t>(std::max<int64_t>(0, last_done.load())));
    m.set_unix_ms(UnixMs());
    m.set_heartbeat(true);
    m.set_phase(static_cast<pb::WorkerPhase>(phase.load()));
    stamp(&m);
    (void)out.Write(m);
  };
  beat();
  Heartbeat heartbeat(beat);
  // The job's store, through the socket our agent passed ($OB_STORE_FD);
  // Gloo listens on $OB_GLOO_ADDR, which the agent sets.
  OB_ASSIGN_OR_RETURN(std::shared_ptr<StoreClient> client, StoreClient::FromEnvironment());
  client->set_op_timeout(timeout);
  c10::intrusive_ptr<c10d::Store> root = c10::make_intrusive<RelayStore>(client, timeout);
  pb::Generation gen;
  const std::string gen_key = GenerationKey(o.generation);
  try {
    const std::string bytes = StoreGet(root, gen_key);
    if (!gen.ParseFromString(bytes)) {
      return Status::DataErr("the rendezvous store's " + gen_key + " is not an ob Generation");
    }
  } catch (const std::exception& e) {
    return Status::Unavailable("cannot read " + gen_key + " from the rendezvous store: " +
                               FirstLine(e.what()));
  }
  auto loaded = plan::FromProto(gen.plan());
  if (!loaded.ok()) return loaded.status().WithContext(gen_key);
  const model::GptConfig cfg = model::GptConfig::FromProto(gen.plan().model());
  OB_RETURN_IF_ERROR(cfg.Validate().WithContext(gen_key));
  OB_ASSIGN_OR_RETURN(runtime::Topology topo,
                      runtime::BuildTopology(loaded->templates, loaded->instantiation,
                                             loaded->problem.microbatch_size));
  if (o.world != topo.world_size())
    return Status::Config("worker started for a world of " + std::to_string(o.world) +
                          ", generation " + std::to_string(o.generation) + " has " +
                          std::to_string(topo.world_size()) + " ranks");
  if (o.rank < 0 || o.rank >= topo.world_size())
    return Status::Config("rank " + std::to_string(o.rank) + " out of range");
  // The data: the file every host reads, and the checkpoint directory
  // every host shares (inputs.h). A mistake here (the file missing,
  // malformed, not the job's; the directory not the master's) meets every
  // restart again, so the master is told it is permanent (store_keys.h
  // FatalKey) and ends the run with it rather than recovering into it.
  auto permanent = [&](const Status& st) {
    (void)client->Set(FatalKey(o.generation, o.rank), FatalValue(static_cast<int>(st.code()), st.message()));
    return st;
  };
  std::optional<model::TokenSource> train, eval;
  std::unique_ptr<ContentCheck> check;  // of a copy taken on the master's facts (inputs.h)
  const std::string who = "rank " + std::to_string(o.rank) + " on host " + o.host;  // for the store's readings
  {
    Status st = [&]() -> Status {
      OB_ASSIGN_OR_RETURN(model::TokenSource d, OpenData(o.data, cfg, o.seed, o.data_facts));
      OB_RETURN_IF_ERROR(AgreeOnInput(*client, "--data", o.data, o.host, who));
      OB_RETURN_IF_ERROR(AgreeOnContent(*client, "--data", o.data, o.host, who, d.content_sum()));
      if (d.content_sum().empty()) {
        OB_ASSIGN_OR_RETURN(check, ContentCheck::Start(*client, "--data", o.data, o.host, who, o.generation, o.rank));
      }
      // Evaluation data: a file of its own, or the held-out end of `data`.
      const int seq = SequenceLength(gen.plan(), cfg);
      OB_RETURN_IF_ERROR(d.Check(seq, cfg.vocab_size));
      if (!o.eval_data.empty()) {
        OB_ASSIGN_OR_RETURN(model::TokenSource e, OpenData(o.eval_data, cfg, o.seed + 1, ""));
        OB_RETURN_IF_ERROR(AgreeOnInput(*client, "--eval-data", o.eval_data, o.host, who));
        OB_RETURN_IF_ERROR(AgreeOnContent(*client, "--eval-data", o.eval_data, o.host, who, e.content_sum()));
        OB_RETURN_IF_ERROR(e.Check(seq, cfg.vocab_size));
        eval = std::move(e);
      } else if (o.eval_split > 0) {
        model::TokenSource kept = d, held = d;
        OB_RETURN_IF_ERROR(model::SplitForEval(d, o.eval_split, seq, &kept, &held));
        d = kept;
        eval = held;
      }
      train = std::move(d);
      return Status::Ok();
    }();
    if (!st.ok()) {
      const bool lasting = st.code() == Code::kDataErr || st.code() == Code::kNoInput || st.code() == Code::kUsage;
      return lasting ? permanent(st) : st;
    }
    st = SameCheckpointDir(*client, o.ckpt_dir, o.host);
    if (!st.ok()) return st.code() == Code::kConfig ? permanent(st) : st;
  }
  model::TokenSource data = std::move(*train);

  // The device and precision (devices.h), and our share of the host's
  // cores: the agent sets OMP_NUM_THREADS, which a standby that already
  // started LibTorch's pool must apply itself.
  OB_ASSIGN_OR_RETURN(DeviceKind asked, ParseDevice(o.device));
  const int gpus = asked == DeviceKind::kCpu ? 0 : compat::CudaDeviceCount();
  const DeviceKind device = ResolveDevice(asked, gpus);
  if (device == DeviceKind::kCuda && gpus == 0) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return Status::Unavailable("--device cuda: this worker sees no GPU (CUDA_VISIBLE_DEVICES=" +
                               std::string(visible != nullptr ? visible : "unset") + ", LibTorch " +
                               compat::TorchVersion() + ")");
  }
  OB_ASSIGN_OR_RETURN(std::string precision_name, ResolvePrecision(o.precision, device));
  OB_ASSIGN_OR_RETURN(model::Precision precision, model::ParsePrecision(precision_name));
  if (const std::string& dtype = gen.plan().profile().dtype();
      !dtype.empty() && dtype != model::PrecisionDtype(precision)) {
    OB_LOG(Warn) << "the plan was profiled in " << dtype << ", this run trains in " << precision_name;
  }
  if (const char* omp = std::getenv("OMP_NUM_THREADS"); omp != nullptr) {
    const int n = std::atoi(omp);
    if (n > 0 && n != at::get_num_threads()) at::set_num_threads(n);
  }
  const std::string runtime = DescribeRuntime(DeviceName(device), precision_name);

  model::TrainOptions t;
  t.device = device == DeviceKind::kCuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  t.precision = precision;
  t.steps = o.steps;
  t.global_batch = topo.global_batch();
  t.microbatch = topo.microbatch_size;
  t.seq_len = static_cast<int>(gen.plan().sequence_length());
  t.lr = o.lr;
  t.warmup_steps = o.warmup_steps;
  t.min_lr = o.min_lr;
  t.cosine = o.lr_schedule != "constant";
  t.weight_decay = o.weight_decay;
  t.beta1 = o.beta1;
  t.beta2 = o.beta2;
  t.eps = o.eps;
  t.grad_clip = o.clip_norm;
  if (o.rank == 0 && o.generation == 1) {
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
  t.seed = o.seed;
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
  // The dense peak MFU is over: this GPU's, not the one the plan was
  // priced for (devices.h MfuPeakFlops); none on the CPU.
  double peak_flops = 0;
  if (t.device.is_cuda()) {
    std::string from;
    peak_flops = MfuPeakFlops(compat::CudaDeviceName(t.device.index()), precision,
                              gen.plan().profile().device().peak_tflops(), gen.plan().profile().dtype(), &from);
    if (o.rank == 0 || peak_flops <= 0) {
      OB_LOG(Info) << "MFU over " << (peak_flops > 0 ? io::FormatDouble(peak_flops / 1e12) + " TFLOP/s, " : "")
                   << from;
    }
  }

  std::unique_ptr<runtime::SnapshotArena> arena;
  {
    const char* fd = std::getenv("OB_SNAPSHOT_FD");
    auto opened = fd != nullptr && *fd != '\0'
                      ? runtime::SnapshotArena::Open(std::atoi(fd), "snapshot memory (fd " + std::string(fd) + ")")
                      : runtime::SnapshotArena::Anonymous();
    if (!opened.ok()) return opened.status();
    arena = std::move(opened).value();
  }
  // Groups of this generation live under its own prefix: nothing of an
  // earlier generation's half-built groups can leak in.
  c10::intrusive_ptr<c10d::Store> gen_store =
      c10::make_intrusive<c10d::PrefixStore>(GenerationStorePrefix(o.generation), root);
  std::unique_ptr<runtime::StageWorker> worker;
  phase = pb::PHASE_JOINING;
  int64_t first_step = 0;
  double restore_seconds = 0;
  const pb::WeightSource& source = gen.source();
  arena->set_lineage(source.lineage());
  auto refuse = [&](const Status& why) {
    return Status::DataErr("generation " + std::to_string(o.generation) + ": cannot start from " +
                           DescribeSource(source) + ": " + why.message());
  };
  if (source.kind() == pb::WeightSource::INITIAL) {
    if (o.generation > 1) {
      OB_LOG(Warn) << "starting from the initial weights, as the master decided";
    }
    auto created = runtime::StageWorker::Create(cfg, topo, o.rank, gen_store, t, data, timeout, arena.get());
    if (!created.ok()) return created.status();
    worker = std::move(created).value();
  } else if (source.kind() == pb::WeightSource::CHECKPOINT ||
             source.kind() == pb::WeightSource::SNAPSHOTS) {
    StartPoint sp;
    runtime::StageSnapshot own;
    if (source.kind() == pb::WeightSource::CHECKPOINT) {  // whatever layout saved it
      const auto& me = topo.ranks[static_cast<size_t>(o.rank)];
      auto manifest = ckpt::LoadManifest(source.checkpoint());
      if (!manifest.ok()) return refuse(manifest.status());
      if (static_cast<int64_t>(manifest->step()) != source.step()) {
        return refuse(Status::DataErr("it holds step " + std::to_string(manifest->step())));
      }
      auto loaded_state = runtime::LoadStageSnapshot(
          source.checkpoint(), me.first_layer, me.last_layer,
          cfg.tied && (me.first_layer == 0 || me.last_layer == topo.num_layers - 1), me.tp, me.tp_rank);
      if (!loaded_state.ok()) return refuse(loaded_state.status());
      own = std::move(loaded_state).value();
      sp.step = source.step();
      for (const auto& r : topo.ranks) sp.held.push_back({r.first_layer, r.last_layer, r.tp, r.tp_rank});
    } else {
      Result<StartPoint> agreed = Status::Internal("");
      try {
        agreed = AgreeOnStart(gen_store, *arena, o.rank, topo, source);
      } catch (const std::exception& e) {
        return Status::Unavailable("generation " + std::to_string(o.generation) +
                                   ": peers did not publish their snapshots: " + FirstLine(e.what()));
      }
      if (!agreed.ok()) return refuse(agreed.status());
      sp = std::move(agreed).value();
      if (sp.own_slot >= 0) {
        auto view = arena->View(sp.own_slot);
        if (!view.ok()) return view.status();
        own = std::move(view).value();
      }
    }
    OB_LOG(Info) << "restoring step " << sp.step << " from " << DescribeSource(source);
    const bool have_own = source.kind() == pb::WeightSource::CHECKPOINT || sp.own_slot >= 0;
    std::vector<plan::LayerFetch> fetches;
    for (const auto& f : gen.fetches()) {
      fetches.push_back({static_cast<int>(f.node()), static_cast<int>(f.layer()),
                         static_cast<int>(f.from_node()), 0});
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto restored = runtime::StageWorker::Restore(cfg, topo, o.rank, gen_store, t, data, sp.step,
                                                  have_own ? &own : nullptr, sp.held, fetches,
                                                  timeout, arena.get(), sp.own_slot);
    if (!restored.ok()) return restored.status().WithContext("restoring step " + std::to_string(sp.step));
    worker = std::move(restored).value();
    restore_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() -
                      worker->join_seconds();
    const auto& rt = worker->restore_times();
    auto ms = [](double s) { return std::to_string(static_cast<int64_t>(s * 1000 + 0.5)); };
    OB_LOG(Info) << "restored step " << sp.step << " in " << ms(restore_seconds) << " ms: build "
                 << ms(rt.build) << ", transfers " << ms(rt.transfers) << ", load " << ms(rt.load)
                 << ", snapshot " << ms(rt.snapshot) << " (joining the groups " << ms(worker->join_seconds())
                 << " ms more)";
    first_step = sp.step + 1;
  } else {
    return Status::DataErr(gen_key + ": the generation names no weight source");
  }
  const int64_t ready_ms = UnixMs();
  worker->SetProgress(&progress, &peer_wait);
  const auto& me = worker->info();
  Injection inject;
  if (const char* spec = std::getenv("OB_INJECT"); spec != nullptr) {
    OB_ASSIGN_OR_RETURN(inject, ParseInjection(spec, o.rank, o.generation));
    if (inject.any()) {
      OB_LOG(Warn) << "fault injection: " << spec;
    }
    if (inject.park_at >= 0 && std::getenv("OB_INJECT_RELEASE") == nullptr) {
      return Status::Usage("--inject " + std::to_string(o.rank) + ":park=" + std::to_string(inject.park_at) +
                           ": no $OB_INJECT_RELEASE names the file that releases it");
    }
    worker->SetSlowdown(inject.slow, inject.spin);
    worker->SetStall(inject.stall_at);
    if (check) check->HoldVerdictUntil(inject.check_at);
  }
  OB_LOG(Info) << "generation " << o.generation << ": pipeline " << me.pipeline << " stage "
               << me.stage << " layers " << me.first_layer << "-" << me.last_layer << ", "
               << me.num_microbatches << " micro-batches per step"
               << (me.recompute != model::Recompute::kNone
                       ? std::string(", recomputation ") + model::RecomputeName(me.recompute)
                       : std::string())
               << (first_step > 0 ? ", resuming after step " + std::to_string(first_step - 1) : "") << "; "
               << runtime;

  std::unique_ptr<runtime::Checkpointer> saver;
  if (!o.ckpt_dir.empty()) {  // ckpt_every 0: the last step, and when the master asks
    c10::intrusive_ptr<compat::Backend> tp_group;
    const auto& me = topo.ranks[static_cast<size_t>(o.rank)];
    if (me.tp > 1) {  // the shards of a save go to TP rank 0 over a CPU group of their own
      const std::vector<int>& ranks = topo.TpGroupOf(o.rank);
      try {
        tp_group = compat::MakeProcessGroup(
            c10::make_intrusive<c10d::PrefixStore>("ckpt/" + runtime::Topology::TpGroupName(ranks), gen_store),
            me.tp_rank, me.tp, torch::kCPU, timeout);
      } catch (const std::exception& e) {
        return Status::Unavailable("joining the checkpoint group failed: " + FirstLine(e.what()));
      }
    }
    saver = std::make_unique<runtime::Checkpointer>(o.ckpt_dir, o.ckpt_every, topo, o.rank, tp_group,
                                                    cfg.vocab_size);
  }
  auto report = [](const runtime::Checkpointer::Done& d, pb::Metrics* m) {
    auto* c = m->mutable_checkpoint();
    c->set_step(d.step);
    c->set_error(d.error);
    c->set_seconds(d.seconds);
    c->set_bytes(d.bytes);
    if (!d.error.empty()) {
      OB_LOG(Error) << "checkpoint of step " << d.step << ": " << d.error;
    }
  };
  const std::string now_key = CheckpointNowKey(o.generation);
  int64_t now_done = -1;
  // From here on every record names our stage.
  {
    std::lock_guard<std::mutex> lock(out_mu);
    self.set_pipeline(me.pipeline);
    self.set_stage(me.stage);
    self.set_first_layer(me.first_layer);
    self.set_last_layer(me.last_layer);
    self.set_num_microbatches(me.num_microbatches);
    self.set_phase(pb::PHASE_TRAINING);
  }
  last_done = first_step - 1;
  phase = pb::PHASE_TRAINING;
  auto record = [&](int64_t step) {
    std::lock_guard<std::mutex> lock(out_mu);
    pb::Metrics m = self;
    m.set_step(static_cast<uint64_t>(std::max<int64_t>(0, step)));
    m.set_unix_ms(UnixMs());
    stamp(&m);
    return m;
  };
  auto emit = [&](const pb::Metrics& m) {
    std::lock_guard<std::mutex> lock(out_mu);
    return out.Write(m);
  };
  // An evaluation counts as progress, as a step does (the hang watch).
  auto evaluate = [&]() -> Result<double> {
    in_step = 1;
    Result<double> e = worker->Evaluate(*eval, o.eval_batches);
    in_step = 0;
    progress.fetch_add(1);
    return e;
  };
  if (o.steps == 0 && eval) {  // ob-launch --steps 0 --resume: evaluate the weights restored, and stop
    OB_ASSIGN_OR_RETURN(double eval_loss, evaluate());
    pb::Metrics m = record(first_step - 1);
    m.set_loss(std::nan(""));
    m.set_eval_loss(eval_loss);
    m.set_evaluation_only(true);
    OB_RETURN_IF_ERROR(emit(m));
  }
  // OB_TRACE=DIR: a Kineto trace (ops, and CUDA kernels on a GPU) of steps
  // OB_TRACE_STEPS=A-B (default 20-21) of generation 1, written as Chrome
  // trace JSON to DIR/trace-rank-R.json (bench/gpu.sh, bench/trace_summary.py).
  int64_t trace_first = -1, trace_last = -1;
  std::string trace_path;
  if (const char* dir = std::getenv("OB_TRACE"); dir != nullptr && *dir != '\0' && o.generation == 1) {
    trace_first = 20;
    trace_last = 21;
    if (const char* range = std::getenv("OB_TRACE_STEPS"); range != nullptr && *range != '\0') {
      long long a = -1, b = -1;
      if (std::sscanf(range, "%lld-%lld", &a, &b) != 2 || a < 0 || b < a) {
        return Status::Usage("OB_TRACE_STEPS '" + std::string(range) + "': expected FIRST-LAST, e.g. 20-21");
      }
      trace_first = a;
      trace_last = b;
    }
    trace_path = std::string(dir) + "/trace-rank-" + std::to_string(o.rank) + ".json";
  }
  for (int64_t step = first_step; step < o.steps; ++step) {
    if (step == trace_first) {
      compat::Synchronize(t.device);
      if (!compat::TraceStart(t.device.is_cuda())) {
        OB_LOG(Warn) << "OB_TRACE: this LibTorch's profiler would not start; not tracing";
        trace_first = -1;
      }
    }
    if (step == inject.hang_at) {
      OB_LOG(Warn) << "fault injection: stopping before step " << step;
      ::raise(SIGSTOP);
    }
    if (step == inject.park_at) {
      const char* release = std::getenv("OB_INJECT_RELEASE");
      OB_LOG(Warn) << "fault injection: parked before step " << step << " until " << release << " exists";
      off_step = 1;  // alive, and saying so: a parked run is no hang
      while (::access(release, F_OK) != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      off_step = 0;
      OB_LOG(Info) << "fault injection: released before step " << step;
    }
    if (step == inject.stall_at) {
      OB_LOG(Warn) << "fault injection: stalling in step " << step
                   << " (the training loop stops; the process and its heartbeats go on)";
      // The StageWorker stalls inside the step once its schedule counts
      // progress (SetStall); before that, or in a generation's first step,
      // the loop stops here, between steps, and the peers block in their
      // next receive or collective all the same.
      if (!runtime_counts.load()) {
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
      }
    }
    const int64_t before = progress.load();
    in_step = 1;
    Result<runtime::StepResult> stepped = worker->Step(step);
    in_step = 0;
    if (progress.load() != before) runtime_counts = true;
    progress.fetch_add(1);
    if (step == trace_last && trace_first >= 0) {
      compat::Synchronize(t.device);
      if (compat::TraceStop(trace_path)) {
        OB_LOG(Info) << "traced steps " << trace_first << "-" << trace_last << " into " << trace_path;
      } else {
        OB_LOG(Warn) << "OB_TRACE: this LibTorch wrote no trace to " << trace_path << " (built without Kineto?)";
      }
    }
    OB_ASSIGN_OR_RETURN(runtime::StepResult r, std::move(stepped));
    // The data as it was opened: a file rewritten in place feeds its new
    // bytes through the mapping, and the step may have trained on them.
    // Neither it nor what follows is saved, reported or trained from.
    Status same = data.Unchanged();
    if (same.ok() && eval) same = eval->Unchanged();
    if (const std::string now = same.ok() ? data.Touched() : ""; !now.empty()) {
      // Its metadata changed, its size and time did not: a chmod, a link,
      // a rename, or a rewrite that set its time back, which only its bytes
      // tell apart. They are read again (the file mapped, through its own
      // descriptor), against the job's sum, while training goes on; the
      // checkpoints committed meanwhile list the copy (ckpt_keeper.h).
      OB_LOG(Info) << o.data << ": its metadata changed after step " << step
                   << " (size and time kept); reading it whole again to compare its bytes";
      check.reset();
      Result<std::unique_ptr<ContentCheck>> again =
          ContentCheck::Start(*client, "--data", o.data, o.host, who, o.generation, o.rank, data.ReadPath(), now);
      if (!again.ok()) return again.status();  // the store's: this worker's, not the job's
      check = std::move(again).value();
    }
    if (same.ok() && check) same = check->Poll(step);
    if (!same.ok()) return permanent(same);
    // What the loop does between steps (metrics, evaluation, checkpoints),
    // as a range in a trace (OB_TRACE; bench/trace_summary.py).
    std::optional<at::RecordFunction> between(std::in_place, at::RecordScope::USER_SCOPE);
    if (between->isActive()) between->before("ob::between_steps");
    last_done = step;
    if (step == inject.nan_at) r.loss = std::nan("");
    pb::Metrics m = record(step);
    if (eval && ((o.eval_every > 0 && (step + 1) % o.eval_every == 0) || step == o.steps - 1)) {
      OB_ASSIGN_OR_RETURN(double eval_loss, evaluate());
      m.set_eval_loss(eval_loss);
    }
    m.set_step_seconds(r.seconds);
    m.set_forward_seconds(r.forward_seconds);
    m.set_backward_seconds(r.backward_seconds);
    m.set_communication_seconds(r.comm_seconds);
    m.set_loss(r.loss);
    m.set_grad_norm(r.grad_norm);
    m.set_tokens_per_second(r.tokens_per_second);
    m.set_memory_bytes(static_cast<uint64_t>(r.memory_bytes));
    m.set_peak_memory_bytes(static_cast<uint64_t>(r.peak_memory_bytes));
    m.set_allreduce_exposed_seconds(r.allreduce_exposed_seconds);
    m.set_snapshot_seconds(r.snapshot_seconds);
    if (struct rusage ru{}; ::getrusage(RUSAGE_SELF, &ru) == 0)
      m.set_peak_rss_bytes(static_cast<uint64_t>(ru.ru_maxrss) * 1024);  // Linux: KiB
    if (peak_flops > 0 && r.seconds > 0) m.set_mfu(r.model_flops / r.seconds / peak_flops);
    if (step == first_step && t.device.is_cuda()) {
      const auto [forwards, backwards] = model::GeluMlpEpilogueCounts();
      OB_LOG(Info) << "step " << step << ": the MLP's cuBLASLt GELU epilogues ran in " << forwards
                   << " forward(s) and " << backwards << " backward(s) (0: ATen's kernels); the layer norms' "
                   << "gain and bias gradient kernels in " << model::LayerNormKernelCount() << " backward(s); "
                   << "the fused loss " << (model::FusedCrossEntropyOn(t.device) ? "on" : "off")
                   << ", gradients summed by cuBLAS into fp32 "
                   << (model::GradientGemmsOn(t.device) ? "on" : "off");
    }
    if (step == first_step && me.recompute != model::Recompute::kNone) {
      OB_LOG(Info) << "step " << step << ": " << model::RecomputeCount() << " recomputation(s) in its backwards ("
                   << model::RecomputeName(me.recompute) << ")";
    }
    if (step == first_step) {
      m.set_process_start_unix_ms(process_start_ms);
      m.set_ready_unix_ms(ready_ms);
      m.set_restore_seconds(restore_seconds);
    }
    if (saver) {
      runtime::Checkpointer::Done done;
      double waited = 0;
      bool now = false;  // the master's "checkpoint now": save after step K
      try {
        if (root->check({now_key})) {
          const int64_t k = std::stoll(StoreGet(root, now_key));
          now = k == step || (k < step && k > now_done);
          if (now) now_done = step;
        }
      } catch (const std::exception& e) {
        OB_LOG(Warn) << "cannot read " << now_key << ": " << FirstLine(e.what());
      }
      off_step = 1;
      const bool saved = saver->AfterStep(*worker, step, o.steps - 1, &done, &waited, now);
      off_step = 0;
      if (saved) report(done, &m);
      m.set_checkpoint_stall_seconds(waited);
    }
    OB_RETURN_IF_ERROR(emit(m));
  }
  off_step = 1;  // the last save, and the way out, report no progress of their own
  // Past the last step: the agent and the master judge what is left (the
  // last save, the exit) as the end of a run, not as a step or a start.
  phase = pb::PHASE_FINISHING;
  beat();
  if (check) {  // a run is not done on a copy not yet compared
    if (Status st = check->Wait(); !st.ok()) return permanent(st);
  }
  runtime::Checkpointer::Done done;
  if (saver && saver->Finish(*worker, &done)) {  // the last save, in a record of its own
    pb::Metrics m = record(o.steps - 1);
    m.set_heartbeat(true);
    report(done, &m);
    OB_RETURN_IF_ERROR(emit(m));
  }
  return Status::Ok();
}

}  // namespace ob::launch
