#include "ob/launch/master/ckpt_keeper.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "ob/clock.h"
#include "ob/io/file.h"
#include "ob/io/message.h"
#include "ob/io/text.h"
#include "ob/log.h"
#include "ob/model/config.h"
#include "ob/model/data.h"

namespace ob::launch {

Status CheckpointKeeper::Open(const Options& o, const pb::Plan* plan, int num_layers, EventLog* events) {
  o_ = o;
  plan_ = plan;
  events_ = events;
  job_.set_seed(o.seed);
  job_.set_data(o.data);
  own_data_fingerprint_ = model::DataFingerprint(o.data);
  job_.set_data_fingerprint(own_data_fingerprint_);
  job_.set_data_sum(o.data_sum);
  job_.set_eval_split(o.eval_split);
  if (!o.dir.empty()) {
    // Two jobs saving into one directory overwrite each other's steps and
    // remove each other's unfinished saves.
    OB_RETURN_IF_ERROR(io::MakeDirs(o.dir, "checkpoint directory"));
    Result<io::DirLock> lock = io::DirLock::Acquire(o.dir, o.holder);
    if (lock.ok()) {
      lock_ = std::move(lock).value();
    } else if (o.predecessor_may_hold && lock.status().code() == Code::kConfig) {
      OB_LOG(Warn) << lock.status().message() << ": the master this one replaces, fenced; the run's checkpoints "
                   << "are written without the lock";
    } else {
      return lock.status();
    }
    commits_ = std::make_unique<CommitQueue>(o.dir, o.keep, num_layers);
    // Saves a killed run left half-written would mix with ours.
    Result<std::vector<std::string>> removed = ckpt::RemovePartials(o.dir);
    if (!removed.ok() && removed.status().code() != Code::kNoInput) return removed.status();
    if (removed.ok() && !removed->empty()) {
      OB_LOG(Info) << "removed " << removed->size() << " unfinished checkpoint(s) from " << o.dir;
    }
  }
  if (o.resume.empty()) return Status::Ok();
  // Every checksum, before any host starts: a damaged checkpoint is never
  // half loaded.
  pb::Manifest m;
  std::string from;
  if (o.resume == "auto") {
    if (o.dir.empty()) return Status::Usage("--resume auto needs --ckpt-dir");
    Result<ckpt::Verified> v = Usable();
    if (v.ok()) {
      from = v->path;
      m = v->manifest;
    } else if (v.status().code() != Code::kNoInput) {
      return v.status();  // there are checkpoints, none usable: never a silent fresh start
    } else {
      OB_LOG(Info) << "--resume auto: no checkpoint in " << o.dir << " yet; starting afresh";
      return Status::Ok();
    }
  } else if (std::error_code ec; !std::filesystem::exists(o.resume + "/manifest.pb", ec) &&
                                  std::filesystem::is_directory(o.resume, ec)) {
    // A checkpoint root (what --ckpt-dir holds), not one checkpoint: its
    // newest verified one, as --resume auto takes from --ckpt-dir, named.
    Result<ckpt::Verified> v =
        ckpt::NewestVerified(o.resume, [this](const pb::Manifest& mf) { return OtherJob(mf); });
    if (!v.ok() && v.status().code() == Code::kNoInput) {
      return Status::NoInput(o.resume + ": neither a checkpoint (no manifest.pb) nor a root holding a committed one");
    }
    if (!v.ok()) return v.status();
    for (const std::string& why : v->skipped) {
      events_->Write("skip-checkpoint", why);
      OB_LOG(Warn) << "skipping checkpoint " << why;
    }
    from = v->path;
    m = v->manifest;
    OB_LOG(Info) << "--resume " << o.resume << " is a checkpoint root: resuming from its newest verified checkpoint, "
                 << from << " (step " << m.step() << ")";
  } else {
    OB_RETURN_IF_ERROR(ckpt::Verify(o.resume));
    OB_ASSIGN_OR_RETURN(m, ckpt::LoadManifest(o.resume));
    if (const std::string why = OtherJob(m); !why.empty()) return Status::Config(o.resume + ": " + why);
    from = o.resume;
  }
  // One architecture, whatever its name: a config file's name is its path,
  // which a copy or another working directory changes.
  if (const std::string d = model::ArchitectureDifference(m.model(), plan_->model(), "there", "in the plan");
      !d.empty()) {
    return Status::Config(from + ": holds another model than the plan's (" + d + "; " + m.model().name() +
                          " there, " + plan_->model().name() + " in the plan)");
  }
  const int64_t step = static_cast<int64_t>(m.step());
  if (o.resume == "auto" && o.steps > 0 && step + 1 == o.steps) {
    // The job's own last step is saved: a requeue (or a supervisor's rerun)
    // of a job that trained to its end has nothing to do, and that is no
    // mistake of its command line (it exited 64, which a supervisor reads
    // as a permanent failure of a finished job).
    resume_ = {from, step};
    trained_ = true;
    return Status::Ok();
  }
  if (o.steps > 0 && step + 1 >= o.steps) {
    return Status::Usage(from + ": the checkpoint is of step " + std::to_string(step) + " and --steps " +
                         std::to_string(o.steps) + " ends at step " + std::to_string(o.steps - 1) +
                         ": nothing left to train (raise --steps)");
  }
  resume_ = {from, step};
  if (m.unchecked_size() > 0) {
    // Not refuted (Verify): the copies were not found to differ, or the run
    // that saved it ended before they were read whole.
    std::vector<std::string> copies;
    for (const pb::UncheckedCopy& u : m.unchecked()) copies.push_back(u.flag() + " on host " + u.host());
    // The usual case for the first run on a data set: its copies were
    // judged good after the commit, or the run was killed first.
    OB_LOG(Info) << from << " was committed while " << io::NameSome(copies, 8)
                 << " had not yet been compared with the job's, byte for byte; this run compares the hosts' "
                    "copies again, and refutes it if one of them differs and is unchanged since";
  }
  if (!o.resume_from_other && m.has_job()) {
    resume_data_fingerprint_ = m.job().data_fingerprint();
    resume_data_sum_ = m.job().data_sum();
  }
  if (o.steps == 0 && m.has_job() && m.job().has_eval_split() && o.eval_split > m.job().eval_split()) {
    // Evaluated on the last eval_split of the tokens; trained on all but
    // the checkpoint's own (smaller) split of them.
    OB_LOG(Warn) << from << " was trained with --eval-split " << io::FormatDouble(m.job().eval_split())
                 << ": of the tokens --eval-split " << io::FormatDouble(o.eval_split)
                 << " evaluates, some were trained on, so this is not a held-out loss";
  }
  if (m.has_optimizer()) {  // changes are allowed, and said
    for (const io::FieldDifference& f : io::FieldDifferences(m.optimizer(), o.optimizer)) {
      optimizer_changes_.push_back(f.name + " " + f.a + " -> " + f.b);
    }
  }
  return Status::Ok();
}

namespace {
// This machine's reading, else the resumed checkpoint's record, else none.
std::pair<std::string, std::string> Expected(const std::string& data, const std::string& own,
                                             const std::string& resumed, const std::string& resume_path) {
  if (data == "synthetic") return {"", ""};
  if (!own.empty()) return {own, "the master"};
  if (!resumed.empty()) return {resumed, "the job that saved " + resume_path};
  return {"", ""};
}
}  // namespace

std::pair<std::string, std::string> CheckpointKeeper::ExpectedData() const {
  return Expected(o_.data, own_data_fingerprint_, resume_data_fingerprint_, resume_.path);
}

std::pair<std::string, std::string> CheckpointKeeper::ExpectedDataSum() const {
  return Expected(o_.data, o_.data_sum, resume_data_sum_, resume_.path);
}

std::string CheckpointKeeper::OtherJob(const pb::Manifest& m) const {
  if (o_.resume_from_other || !m.has_job()) return "";  // (saved before job identities)
  const pb::JobIdentity& j = m.job();
  std::string why;
  if (j.seed() != job_.seed()) {
    why = "seed " + std::to_string(j.seed()) + ", this run's is " + std::to_string(job_.seed());
  } else if (!j.data_fingerprint().empty() && !job_.data_fingerprint().empty() &&
             j.data_fingerprint() != job_.data_fingerprint()) {
    why = "data " + j.data() + " (" + j.data_fingerprint() + "), this run reads " + job_.data() + " (" +
          job_.data_fingerprint() + ")";
  } else if (!j.data_sum().empty() && !job_.data_sum().empty() && j.data_sum() != job_.data_sum()) {
    // The same size and ends, other bytes between them.
    why = "data " + j.data() + " (" + j.data_sum() + " over every byte), this run reads " + job_.data() + " (" +
          job_.data_sum() + ")";
  } else if (o_.steps > 0 && j.has_eval_split() && j.eval_split() != job_.eval_split()) {
    // Another split trains on other tokens: what was held out, or not.
    why = "--eval-split " + io::FormatDouble(j.eval_split()) + ", this run's is " +
          io::FormatDouble(job_.eval_split()) + ": it would train on other tokens";
  }
  return why.empty() ? "" : "saved by another job (" + why + "); --resume-from-other takes it anyway";
}

Result<ckpt::Verified> CheckpointKeeper::Usable() {
  Result<ckpt::Verified> v =
      ckpt::NewestVerified(o_.dir, [this](const pb::Manifest& m) { return OtherJob(m); });
  if (v.ok()) {
    for (const std::string& why : v->skipped) {
      events_->Write("skip-checkpoint", why);
      OB_LOG(Warn) << "skipping checkpoint " << why;
    }
  }
  return v;
}

Result<CheckpointRef> CheckpointKeeper::Newest() {
  if (o_.dir.empty()) return Status::NoInput("no --ckpt-dir");
  OB_ASSIGN_OR_RETURN(ckpt::Verified v, Usable());
  return CheckpointRef{v.path, static_cast<int64_t>(v.manifest.step())};
}

void CheckpointKeeper::Failed(int64_t step, const std::string& why) {
  if (step > failed_step_) {
    failed_step_ = step;
    failure_ = why;
  }
}

void CheckpointKeeper::Part(const pb::Metrics& m, size_t world) {
  const pb::CheckpointPart& c = m.checkpoint();
  if (!commits_) return;
  if (c.error().empty()) {
    commits_->Part(c.step(), m.rank(), world);
    return Poll();
  }
  Failed(static_cast<int64_t>(c.step()), "rank " + std::to_string(m.rank()) + ": " + c.error());
  if (commits_->Failed(c.step())) {
    events_->Write("checkpoint-failed", "step=" + std::to_string(c.step()) + " rank=" +
                                            std::to_string(m.rank()) + " " + c.error());
    OB_LOG(Error) << "checkpoint of step " << c.step() << " failed on rank " << m.rank() << ": "
                  << c.error() << " (training goes on)";
  }
}

void CheckpointKeeper::Poll(bool wait) {
  if (!commits_) return;
  auto base = [this](int64_t step) {
    pb::Manifest m;
    m.set_format_version(io::kManifestFormatVersion);
    m.set_step(static_cast<uint64_t>(step));
    *m.mutable_model() = plan_->model();
    m.set_data_seed(o_.seed);
    m.set_samples_seen(static_cast<uint64_t>(step + 1) * plan_->global_batch());
    m.set_created_unix_ms(UnixMs());
    m.set_plan(plan_->SerializeAsString());
    *m.mutable_job() = job_;
    *m.mutable_optimizer() = o_.optimizer;
    // Its steps read copies whose bytes are not yet known to be the job's.
    if (unchecked_) {
      for (pb::UncheckedCopy& u : unchecked_()) *m.add_unchecked() = std::move(u);
    }
    return m;
  };
  const std::optional<CommitQueue::Outcome> done = commits_->Poll(base, wait);
  if (!done) return;
  const std::string step = std::to_string(done->step);
  if (done->manifest.ok()) {
    good_step_ = std::max(good_step_, done->step);
    uint64_t bytes = 0;
    for (const auto& f : done->manifest->files()) bytes += f.size();
    events_->Write("checkpoint", "step=" + step + " files=" + std::to_string(done->manifest->files_size()) +
                                     " bytes=" + std::to_string(bytes) +
                                     " commit_ms=" + std::to_string(done->commit_ms));
    OB_LOG(Info) << "checkpoint of step " << step << " committed (" << (bytes >> 20) << " MiB)";
  } else {
    Failed(done->step, done->manifest.status().message());
    events_->Write("checkpoint-failed", "step=" + step + " " + done->manifest.status().message());
    OB_LOG(Error) << "checkpoint of step " << step << ": " << done->manifest.status().message()
                  << " (training goes on)";
  }
}

std::vector<int64_t> CheckpointKeeper::RefuteTrainedOn(const std::vector<pb::UncheckedCopy>& differing) {
  std::vector<int64_t> steps;
  if (!commits_ || differing.empty()) return steps;
  Result<std::vector<ckpt::CheckpointInfo>> all = ckpt::List(o_.dir);
  if (!all.ok()) {
    OB_LOG(Error) << "cannot list " << o_.dir << " to refute what trained on another copy of the data: "
                  << all.status().message();
    return steps;
  }
  for (const ckpt::CheckpointInfo& c : *all) {
    if (!c.complete || !c.refuted.empty()) continue;
    Result<pb::Manifest> m = ckpt::LoadManifest(c.path);
    if (!m.ok()) continue;
    auto trained_on = [&](const pb::UncheckedCopy& u) {
      return std::any_of(differing.begin(), differing.end(), [&](const auto& d) { return SameCopy(u, d); });
    };
    const auto found = std::find_if(m->unchecked().begin(), m->unchecked().end(), trained_on);
    if (found == m->unchecked().end()) continue;
    const pb::UncheckedCopy* hit = &*found;
    const std::string why = "trained while host " + hit->host() + "'s copy of " + hit->flag() + " " + o_.data +
                            " was still being compared with the job's, and its bytes differ";
    if (Status st = ckpt::Refute(c.path, why); !st.ok()) {
      OB_LOG(Error) << c.path << ": " << why << ", but it cannot be refuted: " << st.message();
      events_->Write("refute-checkpoint", "step=" + std::to_string(c.step) + " failed: " + st.message());
      continue;
    }
    events_->Write("refute-checkpoint", "step=" + std::to_string(c.step) + " " + why);
    steps.push_back(c.step);
  }
  return steps;
}

Status CheckpointKeeper::Verdict() const {
  if (failed_step_ <= good_step_) return Status::Ok();
  // Asked to checkpoint, and the newest save failed: the work since the
  // latest good one is not on disk, and the exit status must say so.
  Result<std::string> good = ckpt::Latest(o_.dir);
  return Status::IoErr("the checkpoint of step " + std::to_string(failed_step_) + " failed (" + failure_ +
                       "); the latest good one is " + (good.ok() ? *good : std::string("none")));
}

}  // namespace ob::launch
