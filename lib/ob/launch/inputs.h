// One job reads one set of tokens (design §2): every host's workers read
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
// whole, and compares the fingerprint alone.
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

#include <string>

#include "ob/launch/store.h"
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
