// The master's checkpoints (design/ckpt.md), in one place: the checkpoint
// directory's lock, the job's identity, the choice of --resume, the commits
// of the parts the workers report (commit_queue.h), the newest checkpoint
// a recovery may restore, and whether the run may exit 0.
//
// One job per directory: Open locks the directory (io::DirLock; a second
// master there gets kConfig naming the run that holds it, exit 78) and
// removes the saves a killed run left half-written. Every manifest records
// the job (seed, --data and its fingerprint, --eval-split: what training
// samples); a checkpoint another job saved is passed over (Newest) or
// refused (--resume PATH), unless resume_from_other. Evaluating a checkpoint
// (--steps 0) with another --eval-split is allowed, with a warning when the
// tokens evaluated include some it trained on. Checkpoints that do not verify are passed over with a
// *skip-checkpoint* line each.
//
// Never lie: a run asked to checkpoint whose newest save failed ends with
// kIoErr (exit 74) naming that step and the latest good checkpoint
// (Verdict).
//
// Thread model: the master's loop calls every method (commits run on the
// queue's own thread).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ob/ckpt/checkpoint.h"
#include "ob/io/dir_lock.h"
#include "ob/launch/master/commit_queue.h"
#include "ob/launch/master/decision.h"
#include "ob/launch/master/event_log.h"
#include "ob/manifest.pb.h"
#include "ob/metrics.pb.h"
#include "ob/plan.pb.h"
#include "ob/status.h"

namespace ob::launch {

// One host's copy of one input as it was (Manifest.unchecked): host, flag
// and identity alike.
inline bool SameCopy(const pb::UncheckedCopy& a, const pb::UncheckedCopy& b) {
  return a.host() == b.host() && a.flag() == b.flag() && a.identity() == b.identity();
}

class CheckpointKeeper {
 public:
  struct Options {
    std::string dir;             // "" = no checkpoints
    int keep = 0;                // > 0: keep only the newest that many after each commit
    std::string resume;          // "", "auto" or a checkpoint directory
    bool resume_from_other = false;
    int64_t steps = 0;           // the run's last step is steps - 1 (0: not checked)
    uint64_t seed = 0;
    std::string data;            // --data as the workers get it
    std::string data_sum;        // its content sum as the master read it ("": it could not)
    double eval_split = 0;       // --eval-split: training samples the first 1 - eval_split of data
    std::string holder;          // who holds the lock, for a second master's message
    pb::OptimizerSettings optimizer;  // recorded in every manifest; compared on resume
    // A standby master taking over (design/master.md): the master it
    // replaces may live on, fenced, holding the directory's lock (a SIGSTOP);
    // the run's checkpoints are then written without it.
    bool predecessor_may_hold = false;
  };

  // Locks and cleans the directory, and picks the checkpoint --resume names
  // (every checksum verified, before any host starts). `plan` is the
  // master's current plan, read at every commit; it must outlive us.
  // Errors: kUsage (--resume auto without a directory; a checkpoint past
  // the last step, or at it with --resume PATH: with --resume auto that is
  // trained()), kConfig (locked; another job's; another model),
  // kDataErr (none usable), kIoErr.
  Status Open(const Options& o, const pb::Plan* plan, int num_layers, EventLog* events);

  bool enabled() const { return commits_ != nullptr; }
  // What this run's lock of the directory wrote in DIR/.lock ("" without
  // a directory): every worker must read the same there (inputs.h).
  const std::string& lock_line() const { return lock_.line(); }
  // The checkpoint to resume from ("" path: start afresh).
  const CheckpointRef& resume() const { return resume_; }
  // --resume auto found the run's last step (--steps - 1) saved, in resume():
  // the job is trained, and there is nothing to start.
  bool trained() const { return trained_; }
  // How this run's optimizer settings differ from the resumed checkpoint's,
  // one "name A -> B" each ("" when the same, or none recorded).
  const std::vector<std::string>& optimizer_changes() const { return optimizer_changes_; }
  // The fingerprint (model::DataFingerprint) every worker's --data must
  // have (inputs.h), and whose reading it is: this machine's ("the
  // master"); where this machine cannot read the file, resuming a
  // checkpoint (not --resume-from-other), the one that checkpoint's job
  // recorded ("the job that saved DIR/step-…"); otherwise {"", ""}.
  std::pair<std::string, std::string> ExpectedData() const;
  // The same for the content sum of every byte (Options::data_sum; the
  // resumed job's JobIdentity.data_sum), which workers that read their
  // file whole compare (inputs.h AgreeOnContent).
  std::pair<std::string, std::string> ExpectedDataSum() const;
  // The workers' reading of --data (inputs.h), recorded in the manifests
  // of a job whose master cannot read the file (its own reading first).
  void LearnDataFingerprint(const std::string& fingerprint) {
    if (job_.data_fingerprint().empty()) job_.set_data_fingerprint(fingerprint);
  }
  void LearnDataSum(const std::string& sum) {
    if (job_.data_sum().empty()) job_.set_data_sum(sum);
  }
  // Where the copies of --data not yet compared with the job's come from
  // (inputs.h ContentCheck): recorded in the manifest of every commit
  // (Manifest.unchecked).
  void set_unchecked(std::function<std::vector<pb::UncheckedCopy>()> f) { unchecked_ = std::move(f); }
  // Refutes (ckpt::Refute) every committed checkpoint of the directory
  // whose manifest lists one of `differing` (host, flag and identity alike)
  // as unchecked: its steps read that copy's bytes, which are not the
  // job's. A line each in events.log (*refute-checkpoint*); returns their
  // steps. Call after Finish.
  std::vector<int64_t> RefuteTrainedOn(const std::vector<pb::UncheckedCopy>& differing);
  // The newest checkpoint of the directory that verifies and is this job's.
  Result<CheckpointRef> Newest();
  // A rank's report of its part of a save (Metrics.checkpoint) of a world of `world`.
  void Part(const pb::Metrics& m, size_t world);
  // Parts of earlier generations' workers no longer count.
  void NewGeneration() {
    if (commits_) commits_->ForgetParts();
  }
  // Reports a finished commit and starts the next queued one; with `wait`,
  // waits for the running one. Finish: every queued one.
  void Poll(bool wait = false);
  void Finish() {
    while (commits_ && !commits_->idle()) Poll(true);
  }
  // The newest step committed by this run, and the newest that failed (-1: none).
  int64_t good_step() const { return good_step_; }
  int64_t failed_step() const { return failed_step_; }
  // OK, or kIoErr when the newest save failed (after Finish).
  Status Verdict() const;

 private:
  Result<ckpt::Verified> Usable();
  std::string OtherJob(const pb::Manifest& m) const;
  void Failed(int64_t step, const std::string& why);

  Options o_;
  const pb::Plan* plan_ = nullptr;
  EventLog* events_ = nullptr;
  pb::JobIdentity job_;
  io::DirLock lock_;
  std::unique_ptr<CommitQueue> commits_;
  CheckpointRef resume_;
  bool trained_ = false;  // trained()
  std::string own_data_fingerprint_;     // this machine's reading of --data ("": none)
  std::string resume_data_fingerprint_;  // the resumed checkpoint's record of it
  std::string resume_data_sum_;          // and of its content sum
  int64_t good_step_ = -1, failed_step_ = -1;  // the newest committed, the newest failed
  std::string failure_;
  std::vector<std::string> optimizer_changes_;
  std::function<std::vector<pb::UncheckedCopy>()> unchecked_;  // set_unchecked
};

}  // namespace ob::launch
