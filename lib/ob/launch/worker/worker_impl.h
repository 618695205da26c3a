// A worker's insides (worker.h says what it does), shared by its files:
// worker.cc (its life, from the role to the last record), worker_start.cc
// (the generation, inputs and device it starts with, and the weights it
// starts from), worker_loop.cc (the training loop: steps, evaluations,
// checkpoints, fault injection).
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "ob/control.pb.h"
#include "ob/io/records.h"
#include "ob/launch/wire/store_client.h"
#include "ob/launch/worker/inject.h"
#include "ob/launch/worker/inputs.h"
#include "ob/launch/worker/worker.h"
#include "ob/metrics.pb.h"
#include "ob/model/data.h"
#include "ob/model/train.h"
#include "ob/plan/plan_io.h"
#include "ob/runtime/checkpointer.h"
#include "ob/runtime/snapshot_arena.h"
#include "ob/runtime/stage_worker.h"
#include "ob/runtime/topology.h"
#include "ob/status.h"
#include "ob/torch_compat.h"

namespace ob::launch::detail {

std::string StoreGet(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key);
// A checkpoint's outcome into a record (logged too when it failed).
void ReportCheckpoint(const runtime::Checkpointer::Done& d, pb::Metrics* m);

// Calls `beat` every kBeatMs on a thread of its own until destroyed.
class Heartbeat {
 public:
  static constexpr int kBeatMs = 500;
  explicit Heartbeat(std::function<void()> beat);
  ~Heartbeat();

 private:
  std::function<void()> beat_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// The records a worker writes on stdout, which its agent relays: a
// heartbeat as it takes the role and every Heartbeat::kBeatMs from a thread
// of its own until it exits (a stopped process stops beating, a blocked one
// does not), each with its phase; and one record per completed step. Every
// record says who the worker is (its stage once known) and its progress.
//
// Progress (hang_watch.h), on every record. The StageWorker advances
// `progress` after every forward, backward, receive and collective and sets
// `peer_wait` while it waits for a peer, once its schedule counts (then
// `runtime_counts`: the counter moved inside a Step); the loop adds one per
// completed step in any case. Until the runtime counts, a rank is taken as
// waiting for a peer while it is inside Step (where its loop can only stop
// in a receive or a collective, or in compute) and as not waiting outside
// it. While the training thread waits for work that reports no progress of
// its own (a checkpoint write it must not overtake, the last save),
// `off_step` makes every heartbeat count.
class Reporter {
 public:
  explicit Reporter(const WorkerOptions& o);
  void Beat();
  // A record of `step` (a step's, before its figures are filled in).
  pb::Metrics Record(int64_t step);
  Status Emit(const pb::Metrics& m);
  // From here on every record names this stage.
  void SetStage(const runtime::RankInfo& me);

  std::atomic<int> phase{pb::PHASE_STARTING};
  std::atomic<int64_t> last_done{-1};
  std::atomic<int64_t> progress{0};
  std::atomic<int> peer_wait{0}, in_step{0}, off_step{0};
  std::atomic<bool> runtime_counts{false};

 private:
  void Stamp(pb::Metrics* m);  // REQUIRES: mu_ held
  std::mutex mu_;
  io::RecordWriter out_;
  pb::Metrics self_;  // guarded by mu_
};

// One run of a worker, from its role to its last record.
class WorkerRun {
 public:
  explicit WorkerRun(const WorkerOptions& o);
  Status Run();

 private:
  // worker_start.cc
  Status ReadGeneration();
  Status OpenInputs();
  Status OpenTrainingData(model::TokenSource* d);
  Status ChooseDevice();
  void SetTrainOptions();
  void ChoosePeak();
  Status StartWeights();
  Status RestoreWeights();
  Status Inject();
  Status MakeSaver();
  // worker_loop.cc
  Status Train();
  Status BeforeStep(int64_t step);
  void AfterStepTrace(int64_t step);
  Status CheckData(int64_t step);
  Status Evaluate(pb::Metrics* m);
  void Fill(int64_t step, const runtime::StepResult& r, pb::Metrics* m);
  void Save(int64_t step, pb::Metrics* m);
  Status Finish();
  // A mistake that meets every restart again: the master is told it is
  // permanent (store_keys.h FatalKey) and ends the run with it rather than
  // recovering into it.
  Status Permanent(const Status& st);
  Status Refuse(const Status& why) const;

  const WorkerOptions& o_;
  const int64_t process_start_ms_;  // (a standby's: when it got its role)
  const std::chrono::milliseconds timeout_;
  Reporter rep_;
  std::string who_;  // "rank R on host H", for the store's readings
  std::shared_ptr<StoreClient> client_;
  c10::intrusive_ptr<c10d::Store> root_, gen_store_;
  pb::Generation gen_;
  std::string gen_key_;
  plan::LoadedPlan loaded_;
  model::GptConfig cfg_;
  runtime::Topology topo_;
  std::optional<model::TokenSource> data_, eval_;
  std::unique_ptr<ContentCheck> check_;  // of a copy taken on the master's facts (inputs.h)
  model::Precision precision_ = model::Precision::kFp32;
  std::string precision_name_, runtime_;
  bool cuda_ = false;
  model::TrainOptions t_;
  double peak_flops_ = 0;
  std::unique_ptr<runtime::SnapshotArena> arena_;
  std::unique_ptr<runtime::StageWorker> worker_;
  int64_t first_step_ = 0;
  double restore_seconds_ = 0;
  int64_t ready_ms_ = 0;
  Injection inject_;
  std::unique_ptr<runtime::Checkpointer> saver_;
  std::string now_key_;
  int64_t now_done_ = -1;
  // OB_TRACE=DIR: steps traced, and the file.
  int64_t trace_first_ = -1, trace_last_ = -1;
  std::string trace_path_;
};

}  // namespace ob::launch::detail
