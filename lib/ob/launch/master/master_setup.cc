#include "ob/launch/master/master_setup.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>

#include "ob/launch/wire/channel.h"
#include "ob/plan/plan_io.h"

namespace ob::launch {

namespace {

// Whoever reaches the master's port may try secrets, one connection each:
// a short one is guessed (a byte of secret: 256 tries).
Status LongEnough(const std::string& secret, const std::string& name) {
  if (secret.size() >= kMinSecretBytes) return Status::Ok();
  return Status::Config(name + ": the secret is " + std::to_string(secret.size()) + " bytes, fewer than " +
                        std::to_string(kMinSecretBytes) + ": anyone who reaches the master's port could guess "
                        "it; make one with: head -c 32 /dev/urandom | base64");
}

}  // namespace

Result<std::string> ReadSecret(const std::string& secret_file) {
  std::string text;
  if (!secret_file.empty()) {
    // "-": standard input, a pipe from a secrets manager (no file on disk)
    // or a file redirected in, which must be private as any secret file.
    const bool piped = secret_file == "-";
    int fd = piped ? ::fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 0) : ::open(secret_file.c_str(), O_RDONLY | O_CLOEXEC);
    const std::string name = piped ? "--secret-file - (standard input)" : secret_file;
    if (fd < 0) {
      return Status::Config(name + ": cannot read the secret: " + std::strerror(errno));
    }
    struct stat st{};
    if (::fstat(fd, &st) != 0 || !(S_ISREG(st.st_mode) || (piped && S_ISFIFO(st.st_mode)))) {
      ::close(fd);
      return Status::Config(name + (piped ? " is neither a pipe nor a regular file" : ": the secret file is not a regular file"));
    }
    if (S_ISREG(st.st_mode) && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
      ::close(fd);
      char mode[8];
      snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
      return Status::Config(name + ": permissions " + mode + " let others read the secret; chmod 600 it");
    }
    char buf[4096];
    ssize_t n;
    // Up to the first line's end: a pipe's writer need not close it.
    while (text.find('\n') == std::string::npos && text.size() < (1u << 16) &&
           (n = ::read(fd, buf, sizeof buf)) > 0) {
      text.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    text = text.substr(0, text.find('\n'));
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.empty()) return Status::Config(name + ": the secret is empty");
    OB_RETURN_IF_ERROR(LongEnough(text, name));
    return text;
  }
  const char* env = std::getenv("OB_SECRET");
  if (env == nullptr || *env == '\0') {
    return Status::Config("no shared secret: give --secret-file FILE (mode 600) or set OB_SECRET");
  }
  text = env;
  if (text.find('\n') != std::string::npos) {
    return Status::Config("OB_SECRET holds a newline; the secret is one line");
  }
  OB_RETURN_IF_ERROR(LongEnough(text, "OB_SECRET"));
  return text;
}

Result<std::vector<cluster::Host>> LoadLaunchHosts(const std::string& hosts_file) {
  if (!hosts_file.empty()) return cluster::LoadHosts(hosts_file);
  for (const char* var : {"SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') {
      Result<std::vector<cluster::Host>> hosts = cluster::HostsFromSlurm(v);
      if (!hosts.ok()) return hosts.status().WithContext(var);
      // Workers a node may run: its GPUs, else the tasks per node Slurm
      // was asked for, else unbounded (the agents' GPU check still holds).
      int slots = 1 << 20;
      for (const char* per_node : {"SLURM_GPUS_ON_NODE", "SLURM_NTASKS_PER_NODE"}) {
        const char* n = std::getenv(per_node);
        if (n != nullptr && std::atoi(n) > 0) {
          slots = std::atoi(n);
          break;
        }
      }
      for (auto& h : *hosts) h.slots = slots;
      return hosts;
    }
  }
  return Status::Usage("no hosts: give a hosts file or run inside a Slurm allocation");
}

Result<LaunchLayout> LayOut(const pb::Plan& plan, const std::vector<cluster::Host>& hosts,
                            const std::string& hosts_name) {
  Result<plan::LoadedPlan> loaded = plan::FromProto(plan);
  if (!loaded.ok()) return loaded.status();
  std::map<std::string, int> by_name;
  for (size_t i = 0; i < hosts.size(); ++i) by_name[hosts[i].name] = static_cast<int>(i);

  LaunchLayout out;
  std::vector<int> node_to_host(loaded->hosts.size(), -1);
  std::map<std::string, bool> used;
  for (size_t node = 0; node < loaded->hosts.size(); ++node) {
    const std::string& name = loaded->hosts[node];
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      return Status::Config("plan host '" + name + "' is not in " + hosts_name +
                            " (make the plan with ob-plan --hosts " + hosts_name + ")");
    }
    if (used[name]) return Status::DataErr("plan names host '" + name + "' twice");
    used[name] = true;
    node_to_host[node] = static_cast<int>(out.hosts.size());
    out.hosts.push_back(hosts[it->second]);
  }
  for (const auto& h : hosts) {
    if (!used[h.name]) out.spares.push_back(h.name);
  }
  out.host_ranks.resize(out.hosts.size());

  const auto& pipelines = loaded->instantiation.pipelines;
  for (size_t p = 0; p < pipelines.size(); ++p) {
    const plan::Template* t = loaded->templates.ForNodes(pipelines[p].template_nodes);
    if (t == nullptr) {
      return Status::DataErr("pipeline " + std::to_string(p) + ": no template for " +
                             std::to_string(pipelines[p].template_nodes) + " nodes");
    }
    for (size_t s = 0; s < t->stages.size(); ++s) {
      size_t slot = static_cast<size_t>(t->NodeOf(static_cast<int>(s)));
      if (slot >= pipelines[p].nodes.size()) {
        return Status::DataErr("pipeline " + std::to_string(p) + ": stage " + std::to_string(s) +
                               " has no node");
      }
      int node = pipelines[p].nodes[slot];
      if (node < 0 || node >= static_cast<int>(node_to_host.size())) {
        return Status::DataErr("pipeline " + std::to_string(p) + ": node " +
                               std::to_string(node) + " is not in the plan's hosts");
      }
      // The stage's tensor-parallel ranks, consecutive on its node, as
      // runtime/topology.h numbers them.
      for (int tr = 0; tr < std::max(1, t->stages[s].tp); ++tr) {
        RankPlacement r;
        r.rank = static_cast<int>(out.ranks.size());
        r.host = node_to_host[node];
        r.pipeline = static_cast<int>(p);
        r.stage = static_cast<int>(s);
        r.local_rank = static_cast<int>(out.host_ranks[r.host].size());
        out.host_ranks[r.host].push_back(r.rank);
        out.ranks.push_back(r);
      }
    }
  }
  if (out.ranks.empty()) return Status::DataErr("the plan has no pipelines");
  for (size_t h = 0; h < out.hosts.size(); ++h) {
    const size_t workers = out.host_ranks[h].size();
    if (workers > static_cast<size_t>(out.hosts[h].slots)) {
      return Status::Config("the plan puts " + std::to_string(workers) + " workers on host " + out.hosts[h].name +
                            ", which has slots=" + std::to_string(out.hosts[h].slots) + " in " + hosts_name);
    }
  }
  return out;
}

Status ParseBind(const std::string& text, std::string* addr, int* port) {
  if (text.empty()) return Status::Usage("--bind: empty address");
  bool bracketed = text.front() == '[';
  size_t colons = std::count(text.begin(), text.end(), ':');
  // "ADDR" alone: an IPv4 literal or a bare IPv6 literal (two colons or more).
  if ((!bracketed && colons == 0) || (!bracketed && colons > 1)) {
    *addr = text;
    *port = 0;
    return Status::Ok();
  }
  if (bracketed && text.back() == ']') {
    *addr = text.substr(1, text.size() - 2);
    *port = 0;
    return Status::Ok();
  }
  return SplitHostPort(text, "--bind", addr, port);
}

Result<std::string> AutoBindAddress(const std::vector<cluster::Host>& hosts, const std::string& rsh) {
  const std::string loopback = "127.0.0.1";
  if (rsh == "local") return loopback;
  const bool named = rsh == "ssh" || rsh == "slurm";  // hosts are names on the network
  for (const cluster::Host& h : hosts) {
    const std::string target = h.addr.empty() ? h.name : h.addr;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_DGRAM;
    addrinfo* res = nullptr;
    if (getaddrinfo(target.c_str(), "9", &hints, &res) != 0 || res == nullptr) {
      if (!named) return loopback;
      return Status::Usage("--bind auto: host " + h.name +
                           " does not resolve here, so which address of this machine its agent can reach "
                           "is unknown; give --bind ADDR");
    }
    // A connected UDP socket sends nothing; the kernel picks the source
    // address of the route to the target.
    std::string local;
    const int fd = ::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      char text[INET6_ADDRSTRLEN] = {0};
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
        const void* a = ss.ss_family == AF_INET6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr)
                                                  : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&ss)->sin_addr);
        if (::inet_ntop(ss.ss_family, a, text, sizeof text) != nullptr) local = text;
      }
    }
    if (fd >= 0) ::close(fd);
    freeaddrinfo(res);
    if (local.empty()) {
      if (!named) return loopback;
      return Status::Usage("--bind auto: no route from this machine to host " + h.name + " (" + target +
                           "); give --bind ADDR");
    }
    const bool is_loopback = local.rfind("127.", 0) == 0 || local == "::1";
    if (!is_loopback) return local;  // the first remote host's route
  }
  return loopback;
}

std::string AdvertisedHost(const std::string& bind_addr) {
  if (bind_addr == "0.0.0.0" || bind_addr == "::") {
    char host[256] = {0};
    if (gethostname(host, sizeof host - 1) == 0 && host[0] != '\0') return host;
    return bind_addr == "::" ? "[::1]" : "127.0.0.1";
  }
  if (bind_addr.find(':') != std::string::npos) return "[" + bind_addr + "]";
  return bind_addr;
}

}  // namespace ob::launch
