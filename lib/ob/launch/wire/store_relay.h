// The store relay (design/launch.md): how a worker's store
// requests reach the master's StoreServer without anything listening.
//
//   worker ──socketpair($OB_STORE_FD)──▶ agent ──control channel──▶ master
//   StoreClient                          StoreRelay                 ServeStoreRequest
//
// StoreRelay (the agent's half) makes one socketpair per worker process it
// starts (standby workers included): the worker inherits one end, the agent
// watches the other on its loop. Each framed StoreRequest a worker sends is
// tagged with that endpoint's client id (whatever the worker put there is
// overwritten) and forwarded; each StoreReply from the master goes back to
// the endpoint its client id names, or is dropped when that endpoint is
// closed (the worker exited, or was replaced). An endpoint that sends a
// malformed or oversized frame (over kMaxRelayFrameBytes), or anything but
// a StoreRequest, or lets more than kMaxRelayBacklogBytes of replies pile
// up unread, is closed: its worker sees end of file.
//
// Thread model: everything on the agent's loop thread (docs/threads.md);
// the ForwardFn runs there. Ownership: the relay owns its endpoints' uv
// handles and closes them in Close and its destructor, which must run
// while the loop is still alive (the handles are freed by the loop).
// Failure: Open returns kUnavailable when socketpair(2) fails.
//
// A generation's plan (GenerationKey: set once by the master, never
// changed) is asked for by every worker of the host at once: the first GET
// goes to the master, the others wait for its answer here, and the newest
// kKeptGenerations values answer later GETs at once. At 8 workers a host,
// 1,024 hosts and a 258 KB plan, every (re)start of the workers sent
// 2.1 GB out of the master; now 264 MB. A GET the master refuses (timed
// out) is answered so to its worker only: the others' go on to the master.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include <uv.h>

#include "ob/control.pb.h"
#include "ob/launch/wire/channel.h"
#include "ob/launch/wire/store_server.h"
#include "ob/status.h"

namespace ob::launch {

// Replies queued for one worker and not yet read, before it is cut off.
inline constexpr size_t kMaxRelayBacklogBytes = size_t{16} << 20;
// The generations whose plan a relay keeps (the current one and the one before).
inline constexpr size_t kKeptGenerations = 2;

class StoreRelay {
 public:
  using ForwardFn = std::function<void(const pb::Control&)>;
  StoreRelay(uv_loop_t* loop, ForwardFn forward);
  ~StoreRelay();
  StoreRelay(const StoreRelay&) = delete;
  StoreRelay& operator=(const StoreRelay&) = delete;

  struct Endpoint {
    uint64_t client = 0;  // never 0
    int child_fd = -1;    // the worker's end, close-on-exec: pass it to the spawn
  };
  // A new endpoint. After spawning the process that inherits child_fd,
  // call Spawned (the agent's copy of it is closed then, so the worker's
  // exit is seen as end of file); if the spawn failed, Close it.
  Result<Endpoint> Open();
  void Spawned(uint64_t client);
  // Closes the endpoint; replies for it are dropped from now on. No-op for
  // an unknown client.
  void Close(uint64_t client);
  // The reply to the endpoint that asked; dropped (and counted) if closed.
  void Deliver(const pb::StoreReply& reply);

  size_t endpoints() const { return endpoints_.size(); }
  uint64_t dropped() const { return dropped_; }
  // GETs of a generation's key answered here, without the master.
  uint64_t answered_here() const { return answered_here_; }

 private:
  struct Ep;
  static void OnRead(uv_stream_t* s, ssize_t n, const uv_buf_t* buf);
  void OnFrames(uint64_t client, const char* data, size_t n);
  // Whether `m` (a worker's request, its client set) is answered or held
  // here; false: forward it.
  bool Shared(const pb::Control& m);
  // The master's reply to the GET sent for a generation's key, if `reply`
  // is one: answers (or sends on) the GETs that waited for it.
  void Settle(const pb::StoreReply& reply);
  void Send(const pb::StoreReply& reply);

  uv_loop_t* loop_;
  ForwardFn forward_;
  std::map<uint64_t, std::unique_ptr<Ep>> endpoints_;
  uint64_t next_client_ = 1;
  uint64_t dropped_ = 0;
  uint64_t answered_here_ = 0;
  std::map<uint64_t, std::string> kept_;  // generation -> its key's value
  // Per generation asked for and not yet answered: the (client, id) of the
  // GET sent to the master, and the GETs that wait for its answer.
  struct Asked {
    std::pair<uint64_t, uint64_t> sent;
    std::vector<pb::Control> waiting;
  };
  std::map<uint64_t, Asked> asked_;
};

// The master's half: answers a StoreRequest that came over `conn` from
// `server`, sending the StoreReply back over `conn` when it is ready (now,
// or when the keys appear or the request times out) if `conn` is still
// open then. On the master's loop thread.
void ServeStoreRequest(StoreServer* server, const std::shared_ptr<Connection>& conn,
                       const pb::StoreRequest& request, int64_t now_ms);

}  // namespace ob::launch
