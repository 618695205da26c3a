// Can this host reach its data-plane peers? (issue 10: a host↔host
// partition, both hosts still reaching the master, hung every collective
// for the group timeout.) An agent probes the hosts its StartWorkers names,
// once every kProbeMs, all at once: a TCP connection attempt to a port
// nobody listens on (kProbePort). A reply of any kind, the connection or
// its refusal (RST), means the peer's kernel answered: reachable. No reply
// within kProbeTimeoutMs, or a route that refuses (blackhole, unreachable,
// network down), means not. A peer missing kConfirmRounds rounds in a row
// is reported to the master in the agent's heartbeats, which decides whom
// to exclude (decision.h's PartitionExclusions). Nothing listens.
//
// Thread-safety: the probing runs on a thread of its own; SetPeers and
// Unreachable may be called from any one other thread.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ob::launch {

inline constexpr int kProbeMs = 1000;
inline constexpr int kProbeTimeoutMs = 800;
inline constexpr int kConfirmRounds = 2;
inline constexpr int kProbePort = 9;  // discard: closed on any ordinary host

struct Peer {
  std::string host;
  std::string address;  // IPv4 or IPv6
};

// One round: for each peer, whether it answered within `timeout_ms`.
std::vector<bool> ProbeOnce(const std::vector<Peer>& peers, int port, int timeout_ms);

class PeerProbe {
 public:
  PeerProbe();
  ~PeerProbe();
  PeerProbe(const PeerProbe&) = delete;
  PeerProbe& operator=(const PeerProbe&) = delete;

  void SetPeers(std::vector<Peer> peers);  // forgets earlier verdicts
  std::vector<std::string> Unreachable() const;

 private:
  void Loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<Peer> peers_;
  std::map<std::string, int> misses_;  // host → rounds missed in a row
  std::thread thread_;
};

}  // namespace ob::launch
