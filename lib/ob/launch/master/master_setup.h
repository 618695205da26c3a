// What the ob-launch master decides before it starts anything: the secret,
// the hosts, which worker rank runs where, and where it listens.
// Torch-free; pure except for reading files and the environment.
#pragma once

#include <string>
#include <vector>

#include "ob/cluster/hosts.h"
#include "ob/plan.pb.h"
#include "ob/status.h"

namespace ob::launch {

// The shared secret: the first line of `secret_file` when given, else
// $OB_SECRET. kConfig when the file is missing or unreadable, is readable or
// writable by group or others ("chmod 600"), or the secret is shorter than
// kMinSecretBytes (empty included).
// REQUIRES: none; the caller clears OB_SECRET from the environment after.
inline constexpr size_t kMinSecretBytes = 16;
Result<std::string> ReadSecret(const std::string& secret_file);

// The hosts file when given, else Slurm's node list ($SLURM_JOB_NODELIST,
// then $SLURM_NODELIST). hosts.h's refusals (kConfig, kNoInput); kUsage when
// there is neither a file nor a Slurm allocation.
Result<std::vector<cluster::Host>> LoadLaunchHosts(const std::string& hosts_file);

struct RankPlacement {
  int rank = 0;
  int host = 0;         // index into LaunchLayout::hosts
  int local_rank = 0;   // among the ranks of its host, in rank order
  int pipeline = 0;
  int stage = 0;
};

struct LaunchLayout {
  std::vector<cluster::Host> hosts;       // hosts that run an agent, in plan node order
  std::vector<RankPlacement> ranks;       // indexed by rank
  std::vector<std::string> spares;        // in the hosts list but not in the plan
  std::vector<std::vector<int>> host_ranks;  // per host, its ranks ascending
};

// One worker per pipeline stage; ranks are pipelines in the plan's order,
// stages in pipeline order (as lib/ob/runtime/topology.h numbers them);
// stage s of a pipeline runs on its node (Template::NodeOf), its t
// tensor-parallel ranks consecutive there. kConfig when a
// plan host is not in `hosts` (naming it and `hosts_name`), or the plan is
// inconsistent (plan_io's FromProto errors, as kDataErr).
Result<LaunchLayout> LayOut(const pb::Plan& plan, const std::vector<cluster::Host>& hosts,
                            const std::string& hosts_name);

// --bind ADDR[:PORT] ("127.0.0.1", "10.0.0.1:29500", "[::1]:0"); the port
// defaults to 0 (the OS chooses). kUsage on a malformed value.
Status ParseBind(const std::string& text, std::string* addr, int* port);

// --bind auto (the default): the address of this machine on the route to
// the first host that is not this machine, so that agents started with
// `rsh` reach the master there; 127.0.0.1 when every host is this machine
// (a host whose route leaves through loopback) or rsh is "local". A host
// that does not resolve here: kUsage naming it and suggesting --bind for
// ssh and slurm, loopback for a prefix command (ip netns exec: the hosts
// are not names on the network). Uses hosts' addr= when set.
Result<std::string> AutoBindAddress(const std::vector<cluster::Host>& hosts, const std::string& rsh);

// The address agents should dial for a server bound to `bind_addr`: the
// address itself, or this machine's hostname for a wildcard bind; IPv6
// literals in brackets.
std::string AdvertisedHost(const std::string& bind_addr);

}  // namespace ob::launch
