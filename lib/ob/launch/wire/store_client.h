// StoreClient: a worker's end of the store relay (design/launch.md, "The
// store"). The worker's agent hands it one end of a socketpair, inherited
// as $OB_STORE_FD (store_relay.h); the client writes each request there as
// a framed Control (channel.h's framing) and blocks until the reply with
// the same id comes back. Nothing is opened on the file system or the
// network, so only that worker process can use it.
//
// Limits on the worker's side: keys and values as store.h (checked before
// anything is sent), requests no larger than kMaxRelayFrameBytes, replies
// no larger than kMaxFrameBytes (a larger one ends the connection).
//
// Thread-safety: one request at a time, under a mutex; other callers wait
// their turn. Each call is bounded: a GET or WAIT by its own timeout plus
// kReplyGraceMs, the others by op_timeout (set_op_timeout; 60 s by
// default). A reply that comes after its call gave up is discarded.
// Failure: kUnavailable when the agent closed its end (it is gone, or it
// dropped us for a malformed frame) or no reply came in time; the
// connection is then unusable only if it broke (a late reply is fine).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>

#include "ob/launch/wire/channel.h"
#include "ob/launch/wire/store.h"

namespace ob::launch {

// The largest request frame a worker may send: the agent adds a client id
// before forwarding, and the result must fit the channel's frame.
inline constexpr uint32_t kMaxRelayFrameBytes = kMaxFrameBytes - 1024;
// How long past a GET's or WAIT's own timeout the client waits for the
// master's timeout reply (its sweep, and two hops).
inline constexpr int kReplyGraceMs = 5000;

class StoreClient : public RequestStore {
 public:
  // Takes `fd`, a connected stream socket (closed by the destructor, or
  // here on failure). kConfig when it is not one.
  static Result<std::unique_ptr<StoreClient>> FromFd(int fd);
  // From $OB_STORE_FD. kConfig when it is unset or not a socket: the
  // worker was not started by an agent.
  static Result<std::unique_ptr<StoreClient>> FromEnvironment();
  ~StoreClient() override;
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set_op_timeout(Timeout t);

 protected:
  Result<pb::StoreReply> Call(pb::StoreRequest& request, Timeout wait) override;

 private:
  explicit StoreClient(int fd) : fd_(fd) {}
  Status WriteAll(const std::string& bytes, std::chrono::steady_clock::time_point deadline);

  std::mutex mu_;
  int fd_;                                 // guarded by mu_ (reads and writes)
  uint64_t next_id_ = 1;                   // guarded by mu_
  FrameDecoder decoder_;                   // guarded by mu_
  std::vector<pb::Control> pending_;       // decoded, not yet consumed; guarded by mu_
  bool broken_ = false;                    // guarded by mu_
  Timeout op_timeout_{60000};              // guarded by mu_
};

}  // namespace ob::launch
