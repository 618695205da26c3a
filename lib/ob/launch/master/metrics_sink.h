// Where the workers' records go (design/watch.md): --metrics (a file created 0600,
// or "-" for standard output, never a terminal), every watcher of the
// control socket, the progress line (step, loss, tokens/s) the master logs
// once a second, and the closing summary.
//
// Thread model: the master's loop calls every method.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>

#include "ob/io/records.h"
#include "ob/control.pb.h"
#include "ob/launch/master/hang_watch.h"
#include "ob/launch/master/operator_socket.h"
#include "ob/metrics.pb.h"
#include "ob/status.h"

namespace ob::launch {

class MetricsSink {
 public:
  // `watchers`: the operator socket whose watchers get every record (null: none).
  explicit MetricsSink(OperatorSocket* watchers) : watchers_(watchers) {}
  ~MetricsSink();
  MetricsSink(const MetricsSink&) = delete;
  MetricsSink& operator=(const MetricsSink&) = delete;

  // `path`: a file, "-" or "" (none). kUsage for "-" on a terminal, kIoErr.
  Status Open(const std::string& path);
  // A standby master taking over (design/master.md): its own copy of the
  // records, kept at `copy` while it followed, goes first into `path`,
  // which it writes from then on.
  Status TakeOver(const std::string& path, const std::string& copy);
  // Records as another sink wrote them (MasterSync.metrics_so_far), to the
  // file as they are.
  Status WriteRaw(const std::string& bytes);
  // The run id Publish stamps on every record (Metrics.run).
  void set_run(const std::string& run) { run_ = run; }
  // To --metrics and every watcher, stamped with the run id (but for a
  // worker's heartbeat) and the time it is published
  // (Metrics.received_unix_ms). A write that fails ends --metrics, once,
  // with a log line; training goes on (lost() says so again at the end).
  // Watchers get every heartbeat; --metrics a rank's plain heartbeat (no
  // hang, no checkpoint) only when that rank has had no record there for
  // kFileBeatMs, or its phase changed: two beats a second a worker were
  // most of a long run's file (7 GB a day at 1,024 workers), and a rank
  // still has a record there at least every kFileBeatMs (plus one beat's
  // period), a third of ob-watch's default hang timeout.
  void Publish(const pb::Metrics& m);
  static constexpr int64_t kFileBeatMs = 1000;
  // "" while every record reached --metrics; else which did not, and why.
  const std::string& lost() const { return lost_; }
  // A worker's exit, as a record of its own (host, rank, generation, its
  // last step, unix_ms and Metrics.exit): ob-watch's crash detector reads it.
  void Exited(const std::string& host, const pb::WorkerExited& x, uint64_t generation, uint64_t step);
  // A rank judged hung (hang_watch.h), as a record of its own (host, rank,
  // generation, the step it was in, unix_ms, heartbeat and Metrics.hang
  // with `line`): ob-watch's hang detector reads it.
  void Hung(const std::string& host, const HangWatch::Named& n, uint64_t generation,
            const std::string& line);
  // A completed step of the current generation (not a heartbeat).
  void Step(const pb::Metrics& m);
  // Whether a step record of this rank and generation, this step or a
  // later one, was published (a record sent again after a takeover).
  bool Seen(const pb::Metrics& m) const;
  void NewGeneration();
  uint64_t last_step() const { return last_step_; }
  // Whether any rank completed a step in this run.
  bool stepped() const { return stepped_; }
  // The run's last step is total_steps - 1 (0: not known): the progress
  // line shows how far it is, and when it should end.
  void set_total_steps(int64_t total_steps) { total_steps_ = total_steps; }
  // The progress line, when a step came since the last one ("" otherwise):
  // "step 24/40  loss 3.1416  eval 3.2001  tokens/s 1234  MFU 31.2%  GPU
  // memory 17.4 GiB (rank 3)  ETA 1m05s" (eval: the newest evaluation, once
  // one came; memory: the largest peak of any rank, on GPUs), the loss and
  // rates those of the newest step (MFU: the mean over the ranks that
  // report one; "-" on a device without a known peak), the ETA from the
  // mean of rank 0's last step times.
  std::string Progress();
  // "trained N steps: final loss L[, eval loss E], T tokens/s" (N the
  // steps the weights have had; a resumed run adds " over the K steps of
  // this run (resumed after step R)"); with a
  // prediction (> 0, ob-plan's iteration time for the layout that ran
  // last), then "; a step X s measured (median of rank 0's last steps) vs Y s
  // predicted (R x)"; with --steps 0, "evaluated the weights after step S:
  // eval loss E"; "" before any step. `priced_for`: the device ob-plan
  // priced the plan for when it is not the one the run ran on (a plan of an
  // analytic H100 profile run on the CPU): the prediction is named as that
  // device's, with no ratio, which would measure nothing.
  std::string Summary(double predicted_step_seconds = 0, const std::string& priced_for = "") const;
  // Not OK (65, naming the steps) when training ran and rank 0's last loss
  // is NaN or infinite: the weights it ends with are not usable, and a run
  // must not report success for them. OK for --steps 0 (no training).
  Status LossVerdict() const;

 private:
  OperatorSocket* watchers_;
  int fd_ = -1;
  std::unique_ptr<io::RecordWriter> out_;
  std::map<uint32_t, pb::Metrics> last_;  // each rank's newest step of this generation
  std::map<std::pair<uint64_t, uint32_t>, uint64_t> published_;  // (generation, rank) -> newest step published
  // Each rank's newest record in --metrics: when (steady ms) and its phase,
  // by generation and rank (an older generation's beats may come late).
  struct Written {
    int64_t at_ms = 0;
    int phase = 0;
  };
  std::map<std::pair<uint64_t, uint32_t>, Written> written_;
  bool ToFile(const pb::Metrics& m);  // whether --metrics gets it (Publish's rule)
  uint64_t last_step_ = 0;
  int64_t total_steps_ = 0;
  std::string Compared(double predicted, const std::string& priced_for) const;  // Summary's comparison with the plan
  std::deque<double> recent_step_seconds_;  // rank 0's, the last kEtaSteps
  static constexpr size_t kEtaSteps = 20;
  bool stepped_ = false;
  double eval_loss_ = 0;  // rank 0's newest evaluation
  bool have_eval_ = false;
  bool fresh_ = false;
  // Rank 0's steps, their summed time and last loss (every rank reports the
  // global loss and throughput).
  uint64_t steps_done_ = 0;
  double step_seconds_sum_ = 0, tokens_sum_ = 0, last_loss_ = 0;
  int64_t first_step_ = -1;        // rank 0's first step: > 0 when the run resumed
  int64_t last_finite_step_ = -1;  // rank 0's newest step with a finite loss
  int64_t nonfinite_since_ = -1;   // the first step of rank 0's current run of non-finite losses
  std::string lost_;               // lost()
  std::string run_;                // set_run()
};

}  // namespace ob::launch
