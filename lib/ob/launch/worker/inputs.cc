#include "ob/launch/worker/inputs.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>

#include "ob/io/file.h"
#include "ob/io/text.h"
#include "ob/launch/wire/devices.h"
#include "ob/launch/wire/store_keys.h"
#include "ob/log.h"
#include "ob/model/data.h"

namespace ob::launch {

std::string InputMismatch(const std::string& flag, const std::string& spec, const std::string& host,
                          const std::string& mine, const std::string& stored, bool sums) {
  const size_t nl = stored.find('\n');
  const std::string theirs = stored.substr(0, nl);
  if (theirs == mine) return "";
  const std::string who = nl == std::string::npos ? "another reader" : stored.substr(nl + 1);
  const std::string what = sums ? " over every byte" : "";
  return flag + " " + spec + " on host " + host + " is not the file the job reads: " +
         (sums ? "its bytes differ, though its size and ends may agree: " : "") + mine + what + " here, " +
         theirs + what + " as " + who + " read it (every host must read the same tokens: give each the same " +
         "file, or put it on a shared file system)";
}

Status AgreeOnInput(Store& store, const std::string& flag, const std::string& spec, const std::string& host,
                    const std::string& who) {
  if (spec.empty() || spec == "synthetic") return Status::Ok();
  const std::string mine = model::DataFingerprint(spec);
  if (mine.empty()) return Status::Ok();
  OB_ASSIGN_OR_RETURN(std::string stored, store.CompareSet(InputKey(flag), "", InputValue(mine, who)));
  const std::string why = InputMismatch(flag, spec, host, mine, stored);
  return why.empty() ? Status::Ok() : Status::DataErr(why);
}

Status AgreeOnContent(Store& store, const std::string& flag, const std::string& spec, const std::string& host,
                      const std::string& who, const std::string& sum) {
  if (sum.empty()) return Status::Ok();
  OB_ASSIGN_OR_RETURN(std::string stored, store.CompareSet(InputSumKey(flag), "", InputValue(sum, who)));
  const std::string why = InputMismatch(flag, spec, host, sum, stored, /*sums=*/true);
  return why.empty() ? Status::Ok() : Status::DataErr(why);
}

namespace {

// The value under `key`, or nullopt when no one set it (no waiting for it).
Result<std::optional<std::string>> ValueIfSet(Store& store, const std::string& key) {
  OB_ASSIGN_OR_RETURN(bool set, store.Check({key}));
  if (!set) return std::optional<std::string>();
  OB_ASSIGN_OR_RETURN(std::string value, store.Get(key, std::chrono::milliseconds(10000)));
  return std::optional<std::string>(std::move(value));
}

// The calling thread's CPU and I/O priority at their lowest: a read of the
// whole data set must not slow the step that shares the host.
void LowestPriority() {
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 19);
  constexpr int kWhoProcess = 1, kClassIdle = 3, kClassShift = 13;  // linux/ioprio.h
  (void)::syscall(SYS_ioprio_set, kWhoProcess, 0, kClassIdle << kClassShift);
}

}  // namespace

Result<std::unique_ptr<ContentCheck>> ContentCheck::Start(Store& store, const std::string& flag,
                                                           const std::string& spec, const std::string& host,
                                                           const std::string& who, uint64_t generation,
                                                           int rank, const std::string& read_path,
                                                           const std::string& copy_identity) {
  if (spec.empty() || spec == "synthetic") return std::unique_ptr<ContentCheck>();
  const std::string file = model::DataFile(spec);  // a Megatron prefix's .bin
  const std::string identity = copy_identity.empty() ? model::FileIdentity(file) : copy_identity;
  if (identity.empty()) return std::unique_ptr<ContentCheck>();
  // Nothing to compare: a file every host mounts as one (read by each, it
  // would be read as many times as there are hosts), or the very file the
  // master read whole (a host on its machine: --rsh local).
  if (io::OnSharedFileSystem(file)) {
    OB_LOG(Debug) << flag << " " << spec << ": on a shared file system, the file the master read";
    return std::unique_ptr<ContentCheck>();
  }
  OB_ASSIGN_OR_RETURN(std::optional<std::string> master_file, ValueIfSet(store, InputFileKey(flag)));
  if (master_file == InputFileValue(BootId(), identity)) return std::unique_ptr<ContentCheck>();
  OB_ASSIGN_OR_RETURN(std::optional<std::string> done, ValueIfSet(store, InputCheckDoneKey(flag, host)));
  if (done == identity) return std::unique_ptr<ContentCheck>();  // checked already
  const std::string claim_key = InputCheckClaimKey(flag, host);
  const std::string mine = InputCheckClaimValue(generation, rank, identity);
  OB_ASSIGN_OR_RETURN(std::string claim, store.CompareSet(claim_key, "", mine));
  if (claim != mine) {
    // Taken over from a worker of an earlier generation (every generation
    // starts its workers anew, so that one is gone); one of this
    // generation's is reading it already.
    // A claim for another identity of the copy (its metadata changed
    // since: TokenSource::Touched) is stale too.
    unsigned long long g = 0;
    const bool stale = InputCheckClaimIdentity(claim) != identity;
    if (!stale && (std::sscanf(claim.c_str(), "%llu", &g) != 1 || g >= generation)) {
      return std::unique_ptr<ContentCheck>();
    }
    OB_ASSIGN_OR_RETURN(claim, store.CompareSet(claim_key, claim, mine));
    if (claim != mine) return std::unique_ptr<ContentCheck>();
  }
  std::unique_ptr<ContentCheck> c(
      new ContentCheck(store, flag, spec, host, who, identity, read_path.empty() ? spec : read_path));
  return c;
}

ContentCheck::ContentCheck(Store& store, std::string flag, std::string spec, std::string host, std::string who,
                           std::string identity, std::string read_path)
    : store_(store), flag_(std::move(flag)), spec_(std::move(spec)), host_(std::move(host)),
      who_(std::move(who)), identity_(std::move(identity)), read_path_(std::move(read_path)) {
  OB_LOG(Debug) << flag_ << " " << spec_ << ": this host's copy has the master's size and time; reading it "
               << "whole in the background to compare its bytes";
  thread_ = std::thread([this] {
    LowestPriority();
    sum_ = model::FileContentSum(read_path_, &stop_, &bytes_);
    read_ = true;
  });
}

ContentCheck::~ContentCheck() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

Status ContentCheck::Poll(int64_t step) {
  if (finished_ || !read_ || step < hold_until_) return Status::Ok();
  finished_ = true;
  thread_.join();
  if (!sum_.ok()) {
    OB_LOG(Warn) << flag_ << " " << spec_ << ": could not read this host's copy whole to compare it ("
                 << sum_.status().message() << "); its fingerprint agreed";
    return Status::Ok();
  }
  if (Status agree = AgreeOnContent(store_, flag_, spec_, host_, who_, *sum_); !agree.ok()) {
    // What was trained on it so far is not the job's: the master refutes
    // the checkpoints committed meanwhile (ckpt_keeper.h).
    if (agree.code() == Code::kDataErr) {
      if (Status st = store_.Set(InputCheckDiffersKey(flag_, host_), identity_); !st.ok()) {
        OB_LOG(Warn) << "cannot record that " << spec_ << " differs: " << st.message();
      }
    }
    return agree;
  }
  // Checked: later workers of this host need not read this copy again.
  if (Status st = store_.Set(InputCheckDoneKey(flag_, host_), identity_); !st.ok()) {
    OB_LOG(Warn) << "cannot record the check of " << spec_ << ": " << st.message();
  }
  OB_LOG(Info) << flag_ << " " << spec_ << ": this host's copy has the job's bytes (" << *sum_ << ")";
  return Status::Ok();
}

Status ContentCheck::Wait() {
  if (finished_) return Status::Ok();
  if (!read_) {
    OB_LOG(Info) << "waiting for the background read of " << spec_ << " (" << bytes_.load() / (1u << 20)
                 << " MiB read) before finishing: a copy not yet compared may not be the job's";
    while (!read_) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  hold_until_ = 0;
  return Poll(0);
}

Status SameCheckpointDir(Store& store, const std::string& dir, const std::string& host, int patience_ms) {
  if (dir.empty()) return Status::Ok();
  OB_ASSIGN_OR_RETURN(std::optional<std::string> published, ValueIfSet(store, CheckpointDirKey()));
  if (!published) return Status::Ok();
  const std::string& want = *published;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(patience_ms);
  for (;;) {
    Result<std::string> read = io::ReadRegularFile(dir + "/.lock", 4096);
    const std::string seen = read.ok() ? io::Trim(*read) : "";
    if (read.ok() && seen == want) return Status::Ok();
    if (std::chrono::steady_clock::now() >= deadline) {
      const std::string what =
          read.ok() ? "its .lock says \"" + log::Printable(seen, 200) + "\", the master's \"" + want + "\""
                    : "no .lock of the master's there (" + read.status().message() + ")";
      return Status::Config("--ckpt-dir " + dir + " on host " + host +
                            " is not the directory the master saves into: " + what +
                            " (checkpoints need one directory that every host and the master share: NFS, "
                            "Lustre, ...)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

}  // namespace ob::launch
