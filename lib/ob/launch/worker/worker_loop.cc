// A worker's training loop (worker.h): each step, then the data checked
// unchanged, the step's record (with an evaluation where one is due) and a
// checkpoint where one is due or the master asks; fault injection and
// traces for tests and benches.
#include "ob/launch/worker/worker_impl.h"

#include <ATen/record_function.h>

#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "ob/log.h"
#include "ob/model/cross_entropy.h"
#include "ob/model/linear.h"
#include "ob/model/recompute.h"

namespace ob::launch::detail {

void ReportCheckpoint(const runtime::Checkpointer::Done& d, pb::Metrics* m) {
  auto* c = m->mutable_checkpoint();
  c->set_step(d.step);
  c->set_error(d.error);
  c->set_seconds(d.seconds);
  c->set_bytes(d.bytes);
  if (!d.error.empty()) {
    OB_LOG(Error) << "checkpoint of step " << d.step << ": " << d.error;
  }
}

Status WorkerRun::Train() {
  // OB_TRACE=DIR: a Kineto trace (ops, and CUDA kernels on a GPU) of steps
  // OB_TRACE_STEPS=A-B (default 20-21) of generation 1, written as Chrome
  // trace JSON to DIR/trace-rank-R.json (bench/gpu.sh, bench/trace_summary.py).
  if (const char* dir = std::getenv("OB_TRACE"); dir != nullptr && *dir != '\0' && o_.generation == 1) {
    trace_first_ = 20;
    trace_last_ = 21;
    if (const char* range = std::getenv("OB_TRACE_STEPS"); range != nullptr && *range != '\0') {
      long long a = -1, b = -1;
      if (std::sscanf(range, "%lld-%lld", &a, &b) != 2 || a < 0 || b < a) {
        return Status::Usage("OB_TRACE_STEPS '" + std::string(range) + "': expected FIRST-LAST, e.g. 20-21");
      }
      trace_first_ = a;
      trace_last_ = b;
    }
    trace_path_ = std::string(dir) + "/trace-rank-" + std::to_string(o_.rank) + ".json";
  }
  for (int64_t step = first_step_; step < o_.steps; ++step) {
    OB_RETURN_IF_ERROR(BeforeStep(step));
    const int64_t before = rep_.progress.load();
    rep_.in_step = 1;
    Result<runtime::StepResult> stepped = worker_->Step(step);
    rep_.in_step = 0;
    if (rep_.progress.load() != before) rep_.runtime_counts = true;
    rep_.progress.fetch_add(1);
    AfterStepTrace(step);
    OB_ASSIGN_OR_RETURN(runtime::StepResult r, std::move(stepped));
    OB_RETURN_IF_ERROR(CheckData(step));
    // What the loop does between steps (metrics, evaluation, checkpoints),
    // as a range in a trace (OB_TRACE; bench/trace_summary.py).
    std::optional<at::RecordFunction> between(std::in_place, at::RecordScope::USER_SCOPE);
    if (between->isActive()) between->before("ob::between_steps");
    rep_.last_done = step;
    if (step == inject_.nan_at) r.loss = std::nan("");
    pb::Metrics m = rep_.Record(step);
    if (eval_ && ((o_.eval_every > 0 && (step + 1) % o_.eval_every == 0) || step == o_.steps - 1)) {
      OB_RETURN_IF_ERROR(Evaluate(&m));
    }
    Fill(step, r, &m);
    if (saver_) Save(step, &m);
    OB_RETURN_IF_ERROR(rep_.Emit(m));
  }
  return Status::Ok();
}

// A trace begun, and the faults injected before or in `step`.
Status WorkerRun::BeforeStep(int64_t step) {
  if (step == trace_first_) {
    compat::Synchronize(t_.device);
    if (!compat::TraceStart(t_.device.is_cuda())) {
      OB_LOG(Warn) << "OB_TRACE: this LibTorch's profiler would not start; not tracing";
      trace_first_ = -1;
    }
  }
  if (step == inject_.hang_at) {
    OB_LOG(Warn) << "fault injection: stopping before step " << step;
    ::raise(SIGSTOP);
  }
  if (step == inject_.park_at) {
    const char* release = std::getenv("OB_INJECT_RELEASE");
    OB_LOG(Warn) << "fault injection: parked before step " << step << " until " << release << " exists";
    rep_.off_step = 1;  // alive, and saying so: a parked run is no hang
    while (::access(release, F_OK) != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    rep_.off_step = 0;
    OB_LOG(Info) << "fault injection: released before step " << step;
  }
  if (step == inject_.stall_at) {
    OB_LOG(Warn) << "fault injection: stalling in step " << step
                 << " (the training loop stops; the process and its heartbeats go on)";
    // The StageWorker stalls inside the step once its schedule counts
    // progress (SetStall); before that, or in a generation's first step,
    // the loop stops here, between steps, and the peers block in their
    // next receive or collective all the same.
    if (!rep_.runtime_counts.load()) {
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }
  }
  return Status::Ok();
}

void WorkerRun::AfterStepTrace(int64_t step) {
  if (step != trace_last_ || trace_first_ < 0) return;
  compat::Synchronize(t_.device);
  if (compat::TraceStop(trace_path_)) {
    OB_LOG(Info) << "traced steps " << trace_first_ << "-" << trace_last_ << " into " << trace_path_;
  } else {
    OB_LOG(Warn) << "OB_TRACE: this LibTorch wrote no trace to " << trace_path_ << " (built without Kineto?)";
  }
}

// The data as it was opened: a file rewritten in place feeds its new bytes
// through the mapping, and the step may have trained on them. Neither it
// nor what follows is saved, reported or trained from.
Status WorkerRun::CheckData(int64_t step) {
  Status same = data_->Unchanged();
  if (same.ok() && eval_) same = eval_->Unchanged();
  if (const std::string now = same.ok() ? data_->Touched() : ""; !now.empty()) {
    // Its metadata changed, its size and time did not: a chmod, a link, a
    // rename, or a rewrite that set its time back, which only its bytes
    // tell apart. They are read again (the file mapped, through its own
    // descriptor), against the job's sum, while training goes on; the
    // checkpoints committed meanwhile list the copy (ckpt_keeper.h).
    OB_LOG(Info) << o_.data << ": its metadata changed after step " << step
                 << " (size and time kept); reading it whole again to compare its bytes";
    check_.reset();
    Result<std::unique_ptr<ContentCheck>> again = ContentCheck::Start(
        *client_, "--data", o_.data, o_.host, who_, o_.generation, o_.rank, data_->ReadPath(), now);
    if (!again.ok()) return again.status();  // the store's: this worker's, not the job's
    check_ = std::move(again).value();
  }
  if (same.ok() && check_) same = check_->Poll(step);
  if (!same.ok()) return Permanent(same);
  return Status::Ok();
}

// The evaluation loss into `m`. An evaluation counts as progress, as a step
// does (the hang watch).
Status WorkerRun::Evaluate(pb::Metrics* m) {
  rep_.in_step = 1;
  Result<double> e = worker_->Evaluate(*eval_, o_.eval_batches);
  rep_.in_step = 0;
  rep_.progress.fetch_add(1);
  OB_RETURN_IF_ERROR(e.status());
  m->set_eval_loss(*e);
  return Status::Ok();
}

// A step's figures into its record, and what its first step tells the log.
void WorkerRun::Fill(int64_t step, const runtime::StepResult& r, pb::Metrics* m) {
  m->set_step_seconds(r.seconds);
  m->set_forward_seconds(r.forward_seconds);
  m->set_backward_seconds(r.backward_seconds);
  m->set_communication_seconds(r.comm_seconds);
  m->set_loss(r.loss);
  m->set_grad_norm(r.grad_norm);
  m->set_tokens_per_second(r.tokens_per_second);
  m->set_memory_bytes(static_cast<uint64_t>(r.memory_bytes));
  m->set_peak_memory_bytes(static_cast<uint64_t>(r.peak_memory_bytes));
  m->set_allreduce_exposed_seconds(r.allreduce_exposed_seconds);
  m->set_snapshot_seconds(r.snapshot_seconds);
  if (struct rusage ru{}; ::getrusage(RUSAGE_SELF, &ru) == 0)
    m->set_peak_rss_bytes(static_cast<uint64_t>(ru.ru_maxrss) * 1024);  // Linux: KiB
  if (peak_flops_ > 0 && r.seconds > 0) {
    m->set_mfu(r.model_flops / r.seconds / peak_flops_);
    m->set_mfu_llmc(r.llmc_flops / r.seconds / peak_flops_);
  }
  if (step != first_step_) return;
  if (t_.device.is_cuda()) {
    const auto [forwards, backwards] = model::GeluMlpEpilogueCounts();
    OB_LOG(Info) << "step " << step << ": the MLP's cuBLASLt GELU epilogues ran in " << forwards
                 << " forward(s) and " << backwards << " backward(s) (0: ATen's kernels); the layer norms' "
                 << "gain and bias gradient kernels in " << model::LayerNormKernelCount() << " backward(s); "
                 << "the fused loss " << (model::FusedCrossEntropyOn(t_.device) ? "on" : "off")
                 << ", gradients summed by cuBLAS into fp32 " << (model::GradientGemmsOn(t_.device) ? "on" : "off");
  }
  const model::Recompute mode = worker_->info().recompute;
  if (mode != model::Recompute::kNone) {
    OB_LOG(Info) << "step " << step << ": " << model::RecomputeCount() << " recomputation(s) in its backwards ("
                 << model::RecomputeName(mode) << ")";
  }
  m->set_process_start_unix_ms(process_start_ms_);
  m->set_ready_unix_ms(ready_ms_);
  m->set_restore_seconds(restore_seconds_);
}

// A checkpoint after `step` where one is due, or where the master asked for
// one ("checkpoint now": save after step K), reported in `m`.
void WorkerRun::Save(int64_t step, pb::Metrics* m) {
  runtime::Checkpointer::Done done;
  double waited = 0;
  bool now = false;
  try {
    if (root_->check({now_key_})) {
      const int64_t k = std::stoll(StoreGet(root_, now_key_));
      now = k == step || (k < step && k > now_done_);
      if (now) now_done_ = step;
    }
  } catch (const std::exception& e) {
    OB_LOG(Warn) << "cannot read " << now_key_ << ": " << FirstLine(e.what());
  }
  rep_.off_step = 1;
  const bool saved = saver_->AfterStep(*worker_, step, o_.steps - 1, &done, &waited, now);
  rep_.off_step = 0;
  if (saved) ReportCheckpoint(done, m);
  m->set_checkpoint_stall_seconds(waited);
}

}  // namespace ob::launch::detail
