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
//
// The master erases ob/gen/<G - 2>/... when it publishes generation G: no
// worker of that generation is left to read it.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

namespace ob::launch {

inline std::string GenerationKey(uint64_t generation) {
  return "ob/gen/" + std::to_string(generation);
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

}  // namespace ob::launch
