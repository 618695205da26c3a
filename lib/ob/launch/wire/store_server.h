// StoreServer: the job's rendezvous store, in the master's memory (design/launch.md,
// "The store"). A pure class: requests in (control.proto's
// StoreRequest), replies out through a callback; no sockets, threads or
// clocks of its own, so the master runs it on its loop thread and tests
// drive it directly.
//
// Every request is answered exactly once through its ReplyFn: at once, or,
// for GET and WAIT on keys that do not exist yet, when a later request
// creates them (the ReplyFn then runs inside that request's Handle) or when
// Sweep finds its deadline passed (code kUnavailable, "timed out"). Replies
// are made after the store's state is updated, so a ReplyFn may call back
// into the server.
//
// Limits (Limits below): a key, a value, the keys of one request, the
// number of held requests and the total bytes held (keys and values, and
// the keys of held requests, each with a fixed overhead) are bounded. A
// request over a limit is refused with kDataErr and changes nothing: the
// store never grows past max_total_bytes.
//
// Ownership: the server owns the keys, values and held ReplyFns; a ReplyFn
// must stay callable until it is called (the master's hold a weak
// reference to the agent's connection). Destroying the server drops the
// held requests without calling them. Thread-safety: none; one thread (the
// master's loop), or callers that hold a lock (ServerStore).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ob/control.pb.h"
#include "ob/launch/wire/store.h"

namespace ob::launch {

class StoreServer {
 public:
  struct Limits {
    size_t max_key_bytes = kMaxStoreKeyBytes;
    size_t max_value_bytes = kMaxStoreValueBytes;
    size_t max_keys_per_request = kMaxStoreKeysPerRequest;
    size_t max_waiters = 16384;             // GET/WAIT requests held at once
    size_t max_total_bytes = size_t{128} << 20;
  };
  // Bytes counted for each key held or waited for, beyond its own size.
  static constexpr size_t kEntryOverhead = 64;

  using ReplyFn = std::function<void(pb::StoreReply)>;

  StoreServer() : StoreServer(Limits()) {}
  explicit StoreServer(const Limits& limits) : limits_(limits) {}
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // Answers `request` through `reply` (see above). `now_ms`: a monotonic
  // clock, the same one Sweep gets.
  void Handle(const pb::StoreRequest& request, int64_t now_ms, ReplyFn reply);
  // Answers every held request whose deadline is at or before `now_ms`
  // with a timeout. Returns how many.
  size_t Sweep(int64_t now_ms);

  // The master's own writes (it publishes generations so): a SET, with the
  // same limits. kDataErr when refused.
  Status Set(const std::string& key, const std::string& value);
  // The master's own reads: the value of `key`, nullopt when absent.
  std::optional<std::string> Get(const std::string& key) const;
  // Removes every key that starts with `prefix` (a finished generation's);
  // returns how many.
  size_t ErasePrefix(const std::string& prefix);

  // Called after every change of a key: its new value, or nullptr when it
  // was removed (the master mirrors its store to the standby master so).
  using ChangeFn = std::function<void(const std::string& key, const std::string* value)>;
  void OnChange(ChangeFn f) { on_change_ = std::move(f); }
  // Removes `key`; true when it was there.
  bool Erase(const std::string& key);
  // Every key and its value, in key order.
  const std::map<std::string, std::string>& data() const { return data_; }

  size_t num_keys() const { return data_.size(); }
  size_t waiters() const { return waiting_.size(); }
  size_t bytes_held() const { return bytes_; }  // as counted against max_total_bytes
  const Limits& limits() const { return limits_; }

 private:
  struct Waiter {
    pb::StoreRequest request;
    int64_t deadline_ms = 0;
    size_t bytes = 0;
    ReplyFn reply;
  };
  using Ready = std::vector<std::pair<ReplyFn, pb::StoreReply>>;

  // Validates and executes; fills `out` (or holds the request). Replies
  // that become due (this one's, or held ones a new key satisfies) go to
  // `ready`, to be called once the state is consistent.
  void Execute(const pb::StoreRequest& r, int64_t now_ms, ReplyFn reply, Ready* ready);
  Status Put(const std::string& key, std::string value, Ready* ready);
  bool HasAll(const pb::StoreRequest& r) const;
  void Wake(const std::string& key, Ready* ready);
  pb::StoreReply Answer(const pb::StoreRequest& r) const;

  Limits limits_;
  std::map<std::string, std::string> data_;
  std::list<Waiter> waiting_;
  size_t bytes_ = 0;
  ChangeFn on_change_;
};

// A Store (store.h) over a StoreServer in this process: each call takes a
// lock, hands the request to the server, and blocks (lock released) until
// its reply or its deadline. For tools and tests that hold the whole store
// in-process. Thread-safe.
class ServerStore : public RequestStore {
 public:
  explicit ServerStore(const StoreServer::Limits& limits = StoreServer::Limits())
      : server_(limits) {}

 protected:
  Result<pb::StoreReply> Call(pb::StoreRequest& request, Timeout wait) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  StoreServer server_;  // guarded by mu_
};

}  // namespace ob::launch
