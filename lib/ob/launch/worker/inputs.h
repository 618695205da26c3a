// One job reads one set of tokens (design/data.md): every host's workers read
// --data (and --eval-data) from files of their own, and a pipeline's first
// stage samples its inputs from its host's file while its last stage
// samples the targets from its own. Two hosts holding different files (a
// stale copy, a re-tokenized one) would train inputs against another
// file's targets, and data-parallel pipelines on other samples than the
// job's (seed, step) names, with nothing failing. So the job's store holds
// the fingerprint (model::DataFingerprint: size and the first and last MiB)
// of the file it reads, set by the master when it can read the file (main:
// --rsh local, or a shared file system) and otherwise by the first worker
// to get there, and every worker compares its own before it trains. A file
// replaced during the run is caught by the next worker that starts.
//
// The fingerprint reads a file's ends only, so a copy that differs in its
// middle alone (a dataset fixed in place on one node, a disk's bit rot)
// passes it. Every reader that reads its file whole anyway (for its
// largest token id: the master, and a worker whose file's size or time is
// not the master's) also compares that pass's sum of every byte, under
// InputSumKey (AgreeOnContent). A worker whose file has the master's size
// and modification time takes the master's facts instead of reading it
// whole (a restart must not pay a pass over the data), so for such a copy
// one worker of each host reads it whole in the background while training
// goes on (ContentCheck), and a copy found to differ ends the run between
// two steps; the last step waits for a check still under way.
//
// The checkpoint directory is the other path every host must see as the
// master does: workers write their parts of a checkpoint there and the
// master commits them from its own view. A --ckpt-dir on each node's local
// disk would save nothing for the whole run, found out at the first
// commit (hours in); so each worker reads the line the master's lock wrote
// in DIR/.lock (io/dir_lock.h) before it trains.
//
// Thread-safety: as the Store given.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "ob/launch/wire/store.h"
#include "ob/status.h"

namespace ob::launch {

// Compares `spec`'s fingerprint with the job's under InputKey(flag)
// (store_keys.h), setting it when it is not yet there; `who` names this
// reader ("rank 3 on host h1") for the message another gets. Ok for
// "synthetic" and for a file that cannot be read here (opening it reports
// that). kDataErr when the files differ: "--data PATH on host H is not the
// file the job reads: bytes=… xxh3=… here, bytes=… xxh3=… as WHO read it
// (…)"; the store's own errors as they are.
Status AgreeOnInput(Store& store, const std::string& flag, const std::string& spec, const std::string& host,
                    const std::string& who);

// As AgreeOnInput, for `sum`, the content sum of every byte of `spec`
// (model::TokenSource::content_sum), under InputSumKey(flag). Ok for an
// empty `sum` (the file was not read whole here). kDataErr when the sums
// differ: "--data PATH on host H is not the file the job reads: its bytes
// differ, though its size and ends may agree: xxh3=… over every byte here,
// xxh3=… as WHO read it (…)".
Status AgreeOnContent(Store& store, const std::string& flag, const std::string& spec, const std::string& host,
                      const std::string& who, const std::string& sum);

// The background read of a copy taken on the master's facts (above).
// Start claims the check for this host (InputCheckClaimKey: the first
// worker of a generation there; a claim of an earlier generation, whose
// worker is gone, is taken over) and reads `spec` on a thread of its own,
// at the lowest CPU and I/O priority; Poll, on the training thread between
// steps, compares the sum once it is known (AgreeOnContent) and records
// the copy as checked (InputCheckDoneKey: the file's identity, so that
// later workers do not read it again while it is unchanged).
// Thread-safety: Poll, Wait and the destructor on one thread.
class ContentCheck {
 public:
  // nullptr when there is nothing to do: synthetic data, a file that
  // cannot be stat'ed here (opening it reports that), one on a shared file
  // system (io::OnSharedFileSystem: every host reads the master's file,
  // and would read it once each), the very file the master read whole
  // (InputFileKey: its machine's boot id and the file's identity), this
  // copy checked already, or another worker of this generation checking it. The
  // store's errors as they are.
  //
  // A copy whose metadata changed during the run (TokenSource::Touched)
  // is read again: `identity` is the copy's now (FileIdentity of the file
  // mapped) and `read_path` the file mapped (TokenSource::ReadPath, which a
  // file renamed over it does not change); a claim of this generation for
  // another identity of the copy is taken over.
  static Result<std::unique_ptr<ContentCheck>> Start(Store& store, const std::string& flag,
                                                     const std::string& spec, const std::string& host,
                                                     const std::string& who, uint64_t generation, int rank,
                                                     const std::string& read_path = "",
                                                     const std::string& identity = "");
  ~ContentCheck();  // stops the read and joins its thread
  ContentCheck(const ContentCheck&) = delete;
  ContentCheck& operator=(const ContentCheck&) = delete;

  // Ok while the read goes on, and after the verdict; the verdict once:
  // kDataErr when the sums differ (AgreeOnContent's line, and the copy
  // recorded under InputCheckDiffersKey), Ok when they agree. A read that
  // failed (an I/O error) is logged and counts as no check, not as a
  // difference. `step`: the step just trained (HoldVerdictUntil).
  Status Poll(int64_t step);
  // No verdict from Poll before step `step` (ob-launch --inject
  // RANK:check=STEP: what a read of a large file looks like to the steps
  // that train meanwhile). Wait gives it regardless.
  void HoldVerdictUntil(int64_t step) { hold_until_ = step; }
  // Waits for the read (logging what it waits for), then Poll.
  Status Wait();
  bool finished() const { return finished_; }

 private:
  ContentCheck(Store& store, std::string flag, std::string spec, std::string host, std::string who,
               std::string identity, std::string read_path);
  Store& store_;
  const std::string flag_, spec_, host_, who_, identity_, read_path_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> read_{false};  // the thread's result is in sum_
  std::atomic<uint64_t> bytes_{0};
  Result<std::string> sum_ = Status::Unavailable("not read yet");
  std::thread thread_;
  bool finished_ = false;  // the verdict was given
  int64_t hold_until_ = 0;  // HoldVerdictUntil
};

// Whether `dir` on this host is the master's --ckpt-dir: its .lock holds
// the line the store has under CheckpointDirKey (not there: nothing to
// compare, Ok). Read again for up to `patience_ms` while it differs (a
// network file system's attribute cache). kConfig otherwise: "--ckpt-dir
// DIR on host H is not the directory the master saves into: …
// (checkpoints need one directory that every host and the master share:
// NFS, Lustre, ...)".
Status SameCheckpointDir(Store& store, const std::string& dir, const std::string& host, int patience_ms = 3000);

// The messages above, from the two fingerprints (or sums: `sums`) and the
// store's value (InputValue); "" when they agree. For tests.
std::string InputMismatch(const std::string& flag, const std::string& spec, const std::string& host,
                          const std::string& mine, const std::string& stored, bool sums = false);

}  // namespace ob::launch
