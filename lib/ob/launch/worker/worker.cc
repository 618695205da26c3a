// A worker's life (worker.h): it takes its role, reports as it goes, reads
// its generation, starts (worker_start.cc), trains (worker_loop.cc) and
// finishes; and what ob-launch-worker --probe and the standbys need of
// LibTorch.
#include "ob/launch/worker/worker_impl.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>

#include "ob/build_info.h"
#include "ob/clock.h"
#include "ob/io/message.h"
#include "ob/launch/wire/store_keys.h"
#include "ob/launch/worker/relay_store.h"
#include "ob/log.h"

namespace ob::launch {

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

namespace detail {

std::string StoreGet(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key) {
  std::vector<uint8_t> v = store->get(key);
  return std::string(v.begin(), v.end());
}

Heartbeat::Heartbeat(std::function<void()> beat) : beat_(std::move(beat)) {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(kBeatMs), [this] { return stop_; })) {
      lock.unlock();
      beat_();
      lock.lock();
    }
  });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Reporter::Reporter(const WorkerOptions& o) : out_(STDOUT_FILENO, "<stdout>") {
  self_.set_format_version(io::kMetricsFormatVersion);
  self_.set_host(o.host);
  self_.set_rank(static_cast<uint32_t>(o.rank));
  self_.set_generation(o.generation);
}

void Reporter::Stamp(pb::Metrics* m) {
  if (off_step.load() != 0) progress.fetch_add(1);
  m->set_progress(static_cast<uint64_t>(progress.load()));
  m->set_waiting(runtime_counts.load() ? peer_wait.load() != 0 : in_step.load() != 0);
}

void Reporter::Beat() {
  std::lock_guard<std::mutex> lock(mu_);
  pb::Metrics m = self_;
  m.set_step(static_cast<uint64_t>(std::max<int64_t>(0, last_done.load())));
  m.set_unix_ms(UnixMs());
  m.set_heartbeat(true);
  m.set_phase(static_cast<pb::WorkerPhase>(phase.load()));
  Stamp(&m);
  (void)out_.Write(m);
}

pb::Metrics Reporter::Record(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  pb::Metrics m = self_;
  m.set_step(static_cast<uint64_t>(std::max<int64_t>(0, step)));
  m.set_unix_ms(UnixMs());
  Stamp(&m);
  return m;
}

Status Reporter::Emit(const pb::Metrics& m) {
  std::lock_guard<std::mutex> lock(mu_);
  return out_.Write(m);
}

void Reporter::SetStage(const runtime::RankInfo& me) {
  std::lock_guard<std::mutex> lock(mu_);
  self_.set_pipeline(me.pipeline);
  self_.set_stage(me.stage);
  self_.set_first_layer(me.first_layer);
  self_.set_last_layer(me.last_layer);
  self_.set_num_microbatches(me.num_microbatches);
  self_.set_phase(pb::PHASE_TRAINING);
}

WorkerRun::WorkerRun(const WorkerOptions& o)
    : o_(o),
      process_start_ms_(UnixMs()),
      timeout_(static_cast<int64_t>(o.timeout_s * 1000)),
      rep_(o),
      who_("rank " + std::to_string(o.rank) + " on host " + o.host) {}

Status WorkerRun::Permanent(const Status& st) {
  (void)client_->Set(FatalKey(o_.generation, o_.rank), FatalValue(static_cast<int>(st.code()), st.message()));
  return st;
}

Status WorkerRun::Run() {
  rep_.Beat();
  Heartbeat heartbeat([this] { rep_.Beat(); });
  // The job's store, through the socket our agent passed ($OB_STORE_FD);
  // Gloo listens on $OB_GLOO_ADDR, which the agent sets.
  OB_ASSIGN_OR_RETURN(client_, StoreClient::FromEnvironment());
  client_->set_op_timeout(timeout_);
  root_ = c10::make_intrusive<RelayStore>(client_, timeout_);
  OB_RETURN_IF_ERROR(ReadGeneration());
  OB_RETURN_IF_ERROR(OpenInputs());
  OB_RETURN_IF_ERROR(ChooseDevice());
  SetTrainOptions();
  ChoosePeak();
  OB_RETURN_IF_ERROR(StartWeights());
  ready_ms_ = UnixMs();
  worker_->SetProgress(&rep_.progress, &rep_.peer_wait);
  OB_RETURN_IF_ERROR(Inject());
  const auto& me = worker_->info();
  OB_LOG(Info) << "generation " << o_.generation << ": pipeline " << me.pipeline << " stage "
               << me.stage << " layers " << runtime::RangesText(runtime::RangesOf(me)) << ", "
               << me.num_microbatches << " micro-batches per step, schedule " << me.schedule->name
               << (me.recompute != model::Recompute::kNone
                       ? std::string(", recomputation ") + model::RecomputeName(me.recompute)
                       : std::string())
               << (first_step_ > 0 ? ", resuming after step " + std::to_string(first_step_ - 1) : "") << "; "
               << runtime_;
  OB_RETURN_IF_ERROR(MakeSaver());
  rep_.SetStage(me);
  rep_.last_done = first_step_ - 1;
  rep_.phase = pb::PHASE_TRAINING;
  if (o_.steps == 0 && eval_) {  // ob-launch --steps 0 --resume: evaluate the weights restored, and stop
    pb::Metrics m = rep_.Record(first_step_ - 1);
    OB_RETURN_IF_ERROR(Evaluate(&m));
    m.set_loss(std::nan(""));
    m.set_evaluation_only(true);
    OB_RETURN_IF_ERROR(rep_.Emit(m));
  }
  OB_RETURN_IF_ERROR(Train());
  return Finish();
}

// Past the last step: the agent and the master judge what is left (the
// last save, the exit) as the end of a run, not as a step or a start.
Status WorkerRun::Finish() {
  rep_.off_step = 1;  // the last save, and the way out, report no progress of their own
  rep_.phase = pb::PHASE_FINISHING;
  rep_.Beat();
  if (check_) {  // a run is not done on a copy not yet compared
    if (Status st = check_->Wait(); !st.ok()) return Permanent(st);
  }
  runtime::Checkpointer::Done done;
  if (saver_ && saver_->Finish(*worker_, &done)) {  // the last save, in a record of its own
    pb::Metrics m = rep_.Record(o_.steps - 1);
    m.set_heartbeat(true);
    ReportCheckpoint(done, &m);
    OB_RETURN_IF_ERROR(rep_.Emit(m));
  }
  return Status::Ok();
}

}  // namespace detail

Status RunWorker(const WorkerOptions& o) {
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
  detail::WorkerRun run(o);
  return run.Run();
}

}  // namespace ob::launch
