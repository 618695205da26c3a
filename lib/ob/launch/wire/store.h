// Store: the job's rendezvous key-value store (design/launch.md),
// shaped like c10d's Store (set/get/add/compareSet/check/wait/deleteKey/
// getNumKeys) so that a c10d adapter (relay_store.h) is a thin shim.
//
// There is one store per job, held by the master in memory
// (store_server.h) and reached by workers only through their agent
// (store_relay.h, store_client.h); keys are built by store_keys.h.
// Implementations here:
//   - ServerStore (store_server.h): the in-memory server in this process;
//   - StoreClient (store_client.h): a worker's end of its agent's socket.
// tests/unit/store_test.cc runs one conformance list over every one.
//
// Semantics (as c10d's HashStore/TCPStore): Set overwrites; Get waits for
// the key up to `timeout`; Add treats an absent key as 0 and keeps the sum
// as decimal text; CompareSet sets `desired` when the key holds `expected`
// (or is absent and `expected` is empty) and returns what the key holds
// afterwards (`expected` when it is absent and was not set); Wait returns
// once every key exists. A timeout of 0 (c10d's "no timeout") waits
// kMaxStoreWaitMs: nothing waits unbounded.
//
// Thread-safety: every implementation may be called from any number of
// threads at once. Failure: values, never exceptions: kUnavailable when a
// wait times out or the store cannot be reached, kDataErr when the request
// is refused (a key, a value or the store's total over its limit; a
// non-numeric value under Add).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ob/status.h"

namespace ob::pb {
class StoreRequest;
class StoreReply;
}  // namespace ob::pb

namespace ob::launch {

// Limits every store implementation enforces on what it is given, and the
// master on what it holds. A refused request changes nothing.
inline constexpr size_t kMaxStoreKeyBytes = 1024;
inline constexpr size_t kMaxStoreValueBytes = 3u << 20;  // fits a 4 MiB control frame
inline constexpr size_t kMaxStoreKeysPerRequest = 4096;
// The longest a GET or WAIT is held, whatever the client asks.
inline constexpr int64_t kMaxStoreWaitMs = 3600 * 1000;

class Store {
 public:
  using Timeout = std::chrono::milliseconds;
  virtual ~Store() = default;

  virtual Status Set(const std::string& key, const std::string& value) = 0;
  virtual Result<std::string> Get(const std::string& key, Timeout timeout) = 0;
  virtual Result<int64_t> Add(const std::string& key, int64_t delta) = 0;
  virtual Result<std::string> CompareSet(const std::string& key, const std::string& expected,
                                         const std::string& desired) = 0;
  // True when every key exists (no waiting).
  virtual Result<bool> Check(const std::vector<std::string>& keys) = 0;
  virtual Status Wait(const std::vector<std::string>& keys, Timeout timeout) = 0;
  // True when the key existed.
  virtual Result<bool> DeleteKey(const std::string& key) = 0;
  virtual Result<int64_t> NumKeys() = 0;
};

// Checks a request against the limits above; kDataErr naming what is over.
Status CheckStoreKey(const std::string& key);
Status CheckStoreValue(const std::string& key, const std::string& value);

// A Store whose operations are control.proto's StoreRequest/StoreReply
// messages, answered by Call: every implementation here is one, so they
// all build requests and read replies the same way. Limits are checked
// before Call (a refused request is never sent).
class RequestStore : public Store {
 public:
  Status Set(const std::string& key, const std::string& value) override;
  Result<std::string> Get(const std::string& key, Timeout timeout) override;
  Result<int64_t> Add(const std::string& key, int64_t delta) override;
  Result<std::string> CompareSet(const std::string& key, const std::string& expected,
                                 const std::string& desired) override;
  Result<bool> Check(const std::vector<std::string>& keys) override;
  Status Wait(const std::vector<std::string>& keys, Timeout timeout) override;
  Result<bool> DeleteKey(const std::string& key) override;
  Result<int64_t> NumKeys() override;

 protected:
  // Sends `request` (id and client are the implementation's to set) and
  // returns its reply. `wait` is how long the server may hold it (GET,
  // WAIT; 0 for the others): Call gives up a little after that.
  // kUnavailable when no reply comes. A reply's own error is not a failure
  // of Call: the caller turns it into a Status.
  virtual Result<pb::StoreReply> Call(pb::StoreRequest& request, Timeout wait) = 0;
};

// The Status a StoreReply carries: ok, or its code (an unknown code reads
// as kSoftware) and error.
Status StoreReplyStatus(const pb::StoreReply& reply);

}  // namespace ob::launch
