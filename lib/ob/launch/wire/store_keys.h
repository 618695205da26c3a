// The keys ob itself reads and writes in the job's rendezvous store
// (store.h), all built here so that the master, the workers and the tests
// agree on them. Communication groups add keys of their own under a
// generation's prefix (c10d PrefixStores named by runtime/topology.h).
//
//   ob/gen/<G>                    the Generation (control.proto) the master
//                                 publishes before starting its workers
//   ob/gen/<G>/...                everything generation G's workers write,
//                                 through a c10d::PrefixStore: their groups,
//                                 held/<R> (the snapshots rank R holds)
//   ob/gen/<G>/checkpoint-now     the step after which every worker saves
//   ob/gen/<G>/fatal/<R>          rank R's permanent failure, "<exit code> <one
//                                 line>", written before it exits with that
//                                 code: the master ends the run with it
//                                 instead of restarting what fails again
//   ob/input/<flag>               the file the job reads as --data (or
//                                 --eval-data): "<model::DataFingerprint>\n<who
//                                 read it>", set by the master when it can
//                                 read the file, else by the first worker;
//                                 every worker compares its own (worker.h
//                                 AgreeOnInput). Kept for the whole job.
//   ob/input-sum/<flag>           the same file's content sum: "xxh3=<16 hex>
//                                 over every byte\n<who read it>", set by the
//                                 master when it read the file whole, else by
//                                 the first worker that did; every worker that
//                                 read its copy whole compares (AgreeOnContent).
//                                 Kept for the whole job.
//   ob/input-file/<flag>          "<kernel boot id> <model::FileIdentity>" of
//                                 the file the master read whole: a worker
//                                 on the master's machine reading that very
//                                 file has nothing to compare (ContentCheck)
//   ob/input-check/<flag>/<host>/claim   "<generation> <rank> <identity>":
//                                 the worker of host that reads its copy
//                                 (model::FileIdentity) whole in the
//                                 background (ContentCheck), for a copy the
//                                 workers took on the master's facts; a
//                                 claim of an earlier generation is stale.
//                                 The copy is unchecked while done is not
//                                 its identity (checkpoints record it)
//   ob/input-check/<flag>/<host>/done    model::FileIdentity of the copy whose
//                                 sum agreed: not read again while it is so
//   ob/input-check/<flag>/<host>/differs the identity of a copy whose sum
//                                 differed (the master refutes checkpoints)
//   ob/ckpt-dir                   the line the master's lock wrote in
//                                 --ckpt-dir/.lock, which every worker must
//                                 read there (inputs.h SameCheckpointDir)
//
// The master erases ob/gen/<G - 2>/... when it publishes generation G: no
// worker of that generation is left to read it.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace ob::launch {

inline std::string GenerationKey(uint64_t generation) {
  return "ob/gen/" + std::to_string(generation);
}
// The generation `key` is the GenerationKey of, if it is one (set once, by
// the master, and never changed: agents keep what they read of it).
inline std::optional<uint64_t> GenerationOfKey(const std::string& key) {
  constexpr size_t kPrefix = 7;  // "ob/gen/"
  if (key.size() <= kPrefix || key.size() > kPrefix + 20 || key.compare(0, kPrefix, "ob/gen/") != 0) {
    return std::nullopt;
  }
  uint64_t g = 0;
  for (size_t i = kPrefix; i < key.size(); ++i) {
    if (key[i] < '0' || key[i] > '9') return std::nullopt;
    g = g * 10 + static_cast<uint64_t>(key[i] - '0');
  }
  if (GenerationKey(g) != key) return std::nullopt;  // "ob/gen/007", or past 2^64
  return g;
}
// The prefix generation G's workers give c10d::PrefixStore, which puts a
// '/' between it and each key: their keys are GenerationKeysPrefix(G) + key.
inline std::string GenerationStorePrefix(uint64_t generation) { return GenerationKey(generation); }
// What every key generation G's workers write starts with.
inline std::string GenerationKeysPrefix(uint64_t generation) { return GenerationKey(generation) + "/"; }
// Under GenerationStorePrefix: the snapshots rank R holds (worker.cc).
inline std::string HeldKey(int rank) { return "held/" + std::to_string(rank); }
inline std::string CheckpointNowKey(uint64_t generation) {
  return GenerationKeysPrefix(generation) + "checkpoint-now";
}

// Rank R's permanent failure (FatalValue), and its parse: the exit code
// (1-255) and the line; nullopt for a value that is not one.
inline std::string FatalKey(uint64_t generation, int rank) {
  return GenerationKeysPrefix(generation) + "fatal/" + std::to_string(rank);
}
inline std::string FatalValue(int code, const std::string& line) { return std::to_string(code) + " " + line; }
inline std::optional<std::pair<int, std::string>> ParseFatal(const std::string& value) {
  const size_t sp = value.find(' ');
  if (sp == 0 || sp == std::string::npos || sp > 3) return std::nullopt;
  int code = 0;
  for (size_t i = 0; i < sp; ++i) {
    if (value[i] < '0' || value[i] > '9') return std::nullopt;
    code = code * 10 + (value[i] - '0');
  }
  if (code == 0 || code > 255) return std::nullopt;
  return std::make_pair(code, value.substr(sp + 1));
}
// The job's --data (flag "--data") or --eval-data (inputs.h).
inline std::string InputKey(const std::string& flag) { return "ob/input/" + flag; }
inline std::string InputSumKey(const std::string& flag) { return "ob/input-sum/" + flag; }
inline std::string InputFileKey(const std::string& flag) { return "ob/input-file/" + flag; }
inline std::string InputFileValue(const std::string& boot_id, const std::string& identity) {
  return boot_id + " " + identity;
}
inline std::string InputCheckClaimKey(const std::string& flag, const std::string& host) {
  return "ob/input-check/" + flag + "/" + host + "/claim";
}
inline std::string InputCheckDoneKey(const std::string& flag, const std::string& host) {
  return "ob/input-check/" + flag + "/" + host + "/done";
}
// Set to the copy's identity when its bytes were found to differ from the
// job's (the checkpoints committed while it was compared are refuted).
inline std::string InputCheckDiffersKey(const std::string& flag, const std::string& host) {
  return "ob/input-check/" + flag + "/" + host + "/differs";
}
// A claim: "GENERATION RANK IDENTITY", the copy's model::FileIdentity last.
inline std::string InputCheckClaimValue(uint64_t generation, int rank, const std::string& identity) {
  return std::to_string(generation) + " " + std::to_string(rank) + " " + identity;
}
// The identity a claim names ("" when it names none).
inline std::string InputCheckClaimIdentity(const std::string& claim) {
  const size_t a = claim.find(' ');
  const size_t b = a == std::string::npos ? a : claim.find(' ', a + 1);
  return b == std::string::npos ? "" : claim.substr(b + 1);
}
inline std::string CheckpointDirKey() { return "ob/ckpt-dir"; }
inline std::string InputValue(const std::string& fingerprint, const std::string& who) {
  return fingerprint + "\n" + who;
}

}  // namespace ob::launch
