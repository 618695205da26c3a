// Test harness for the store seam: the whole relay path of a real run
// (master's StoreServer ↔ authenticated control channel ↔ agent's
// StoreRelay ↔ socketpair ↔ worker's StoreClient), in one process.
//
// RelayHarness runs a master and an agent on one uv loop, on a thread of
// its own, and hands out StoreClients, each on an endpoint of the agent's
// relay, for the test's threads to use as workers do. Destroying the
// harness stops the loop and closes everything.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <uv.h>

#include "ob/launch/wire/channel.h"
#include "ob/launch/wire/store_client.h"
#include "ob/launch/wire/store_relay.h"
#include "ob/launch/wire/store_server.h"

namespace ob::testing {

class RelayHarness {
 public:
  RelayHarness();
  ~RelayHarness();

  // A worker's store: a new relay endpoint. Thread-safe.
  std::shared_ptr<launch::StoreClient> NewClient();
  // Runs `fn` on the loop thread and waits for it (to look at the relay or
  // the server, which only that thread may touch).
  void OnLoop(std::function<void(launch::StoreServer&, launch::StoreRelay&)> fn);
  // The agent's end of the most recent endpoint's socket, before the
  // StoreClient took it: a raw fd for tests that write frames by hand.
  int RawEndpoint(uint64_t* client);

 private:
  static void OnAsync(uv_async_t* a);
  void Drain();

  uv_loop_t loop_;
  uv_async_t async_{};
  uv_timer_t sweep_{};
  launch::Server server_{&loop_};
  launch::StoreServer store_;
  std::unique_ptr<launch::StoreRelay> relay_;
  std::shared_ptr<launch::Connection> at_master_, at_agent_;
  std::mutex mu_;
  std::vector<std::function<void()>> tasks_;  // guarded by mu_
  bool stopping_ = false;                     // guarded by mu_
  std::thread thread_;
};

}  // namespace ob::testing
