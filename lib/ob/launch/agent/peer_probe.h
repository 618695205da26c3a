// Can this host reach its data-plane peers? (issue 10: a host↔host
// partition, both hosts still reaching the master, hung every collective
// for the group timeout.) An agent probes the hosts its StartWorkers names,
// once every kProbeMs, up to kProbeInFlight at a time: a TCP connection attempt to a port
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
#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ob/status.h"

namespace ob::launch {

inline constexpr int kProbeMs = 1000;
inline constexpr int kProbeTimeoutMs = 800;
inline constexpr int kConfirmRounds = 2;
inline constexpr int kProbePort = 9;  // discard: closed on any ordinary host

// ob-launch --probe-port: a port (1-65535), or "off" (0: no probes). A
// firewall that drops or rejects kProbePort toward some hosts only would
// make them look cut off; such a cluster names a port its firewalls let
// through, or turns the probes off. kUsage otherwise, with the text that
// CLI11 puts after the flag's name: "'X' is not a port (1-65535) or 'off'".
Result<int> ParseProbePort(const std::string& text);

struct Peer {
  std::string host;
  std::string address;  // IPv4 or IPv6
};

// At most this many attempts are in flight at once, and at most a quarter
// of the process's open-file limit (ProbeWindow); fewer still when the
// process runs out of descriptors (an attempt then waits for one to end).
// All at once, an agent of a 1,024-host job held 1,023 sockets each round,
// and at a soft limit of 1,024 its own work (a worker's pipes, an accepted
// connection) failed meanwhile. Peers that answer take a round-trip each,
// so a round of 1,023 takes a few ms; a round where every peer is silent
// takes ceil(peers / window) x the timeout: one timeout up to 1,024 peers
// at the limit ob-launch raises itself to (fd_limit.h).
inline constexpr size_t kProbeInFlight = 1024;
size_t ProbeWindow();

// One round: for each peer, whether it answered within `timeout_ms` of
// its connection attempt.
std::vector<bool> ProbeOnce(const std::vector<Peer>& peers, int port, int timeout_ms);

class PeerProbe {
 public:
  explicit PeerProbe(int port = kProbePort);  // REQUIRES: 1 <= port <= 65535
  ~PeerProbe();
  PeerProbe(const PeerProbe&) = delete;
  PeerProbe& operator=(const PeerProbe&) = delete;

  void SetPeers(std::vector<Peer> peers);  // forgets earlier verdicts
  std::vector<std::string> Unreachable() const;

 private:
  void Loop();

  const int port_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<Peer> peers_;
  std::map<std::string, int> misses_;  // host → rounds missed in a row
  std::thread thread_;
};

}  // namespace ob::launch
