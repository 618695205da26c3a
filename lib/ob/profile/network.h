// Network mode of ob-profile (design/profile.md): point-to-point bandwidth and latency
// between every ordered pair of hosts.
//
// The coordinator (MeasureNetwork) starts one agent per host with
// `RshArgv(rsh, host, {agent_exe, "--net-agent"})` and talks to it over the
// agent's stdin/stdout, one text line per command and one per reply, so no
// control network is needed and ssh works unchanged:
//
//   listen ADDR PORT TOKEN                   -> ok ADDR PORT | error MESSAGE
//   measure ADDR PORT TOKEN PINGS REPEATS TIMEOUT_S SIZE... -> ok RTT T(SIZE)... | error MESSAGE
//
// `listen` binds a TCP listener on the host's addr (else its name, resolved on
// that host; port 0 lets the OS choose) and reports the numeric address and
// port. TOKEN is the run's (32 random hex digits, which only the agents'
// stdin carries): a data connection sends it first, and the listener closes
// one that does not within 2 s, before it gets a thread or an answer, so
// that nobody else who reaches the port skews a link (or runs the host out
// of threads: at most 256 proven connections at once). `measure` makes this
// agent the sender to the listener at ADDR:PORT, after sending TOKEN:
// PINGS ping-pongs of 64 bytes (median round trip), then for each size one
// untimed warm-up and REPEATS timed transfers, each timed from the first byte
// sent until the receiver's 1-byte acknowledgement arrives (median). The agent
// exits when its stdin closes.
//
// Pairs are scheduled by the circle method: rounds of disjoint pairs (n-1
// rounds for even n, n for odd n, one host idle per round), the pairs of a
// round measured simultaneously, first i->j then j->i.
// Link.bandwidth_bytes_per_s = largest size / its median time (latency
// included: what a transfer of that size actually achieves);
// Link.latency_seconds = median ping-pong round trip / 2.
//
// Failure: fewer than two hosts or bad options -> kConfig; an agent that cannot
// be started, exits, reports an error or does not answer within
// timeout_s -> kUnavailable "host 'x': ...". Every child is killed and reaped
// before MeasureNetwork returns, on every path. Thread-safety: MeasureNetwork
// spawns children that die with the calling thread (PR_SET_PDEATHSIG); call
// it from a thread that outlives the call. RunNetAgent may run in several
// threads at once (tests do).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ob/cluster/hosts.h"
#include "ob/profile.pb.h"
#include "ob/status.h"

namespace ob::profile {

struct NetOptions {
  std::string rsh = "ssh";        // see cluster::RshArgv: "local", "ssh", "ip netns exec", ...
  std::string agent_exe;          // ob-profile on the hosts; empty = this executable
  std::vector<uint64_t> sizes = {64 << 10, 8 << 20};  // message sizes in bytes
  int repeats = 3;                // timed transfers per size (median)
  int pings = 20;                 // ping-pongs for latency (median)
  double timeout_s = 60;          // per agent answer
  std::function<void(const std::string&)> progress;  // one line per event; may be empty
};

// The pairs of each round, by host index; pair (a, b) is measured a->b then b->a.
// Every unordered pair appears exactly once; no host twice in a round.
std::vector<std::vector<std::pair<int, int>>> PairRounds(int n);

// Starts an agent on every host and measures every ordered pair.
Result<pb::NetworkMatrix> MeasureNetwork(const std::vector<cluster::Host>& hosts,
                                         const NetOptions& opts);

// An agent already running, reached through two descriptors (may be the same
// socket). The caller owns them; MeasureNetworkWith neither closes them nor
// signals end of input.
struct AgentChannel {
  int to_agent = -1;
  int from_agent = -1;
};

// The coordinator over agents that are already running (agents[i] serves
// hosts[i]); opts.rsh and opts.agent_exe are not used. The seam MeasureNetwork
// is built on, and how tests run agents as threads.
Result<pb::NetworkMatrix> MeasureNetworkWith(const std::vector<cluster::Host>& hosts,
                                             const std::vector<AgentChannel>& agents,
                                             const NetOptions& opts);

// The agent: serves commands from in_fd, replies on out_fd, until in_fd ends.
// Returns the exit status for `ob-profile --net-agent` (0 after end of input).
int RunNetAgent(int in_fd, int out_fd);

}  // namespace ob::profile
