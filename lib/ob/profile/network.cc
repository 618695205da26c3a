#include "ob/profile/network.h"
#include "ob/profile/profile.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "ob/clock.h"
#include "ob/cluster/rsh.h"
#include "ob/io/file.h"
#include "ob/profile/net_io.h"

namespace ob::profile {

using namespace net_io;  // NOLINT: this component's own helpers

std::vector<std::vector<std::pair<int, int>>> PairRounds(int n) {
  std::vector<std::vector<std::pair<int, int>>> rounds;
  if (n < 2) return rounds;
  int m = n % 2 ? n + 1 : n;  // with a bye (index n) for odd n
  std::vector<int> pos(m);
  for (int i = 0; i < m; ++i) pos[i] = i;
  for (int r = 0; r < m - 1; ++r) {
    std::vector<std::pair<int, int>> round;
    for (int i = 0; i < m / 2; ++i) {
      int a = pos[i], b = pos[m - 1 - i];
      if (a >= n || b >= n) continue;
      round.emplace_back(std::min(a, b), std::max(a, b));
    }
    rounds.push_back(std::move(round));
    // Circle method: keep pos[0], rotate the rest by one.
    std::rotate(pos.begin() + 1, pos.end() - 1, pos.end());
  }
  return rounds;
}

namespace {

std::string HumanRate(double bytes_per_s) {
  char buf[32];
  if (bytes_per_s >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB/s", bytes_per_s / 1e9);
  else std::snprintf(buf, sizeof buf, "%.1f MB/s", bytes_per_s / 1e6);
  return buf;
}

struct Coordinator {
  const std::vector<cluster::Host>& hosts;
  const NetOptions& opts;
  std::vector<AgentChannel> channels;
  std::vector<LineReader> readers;
  // Adds context for an agent that went away (its exit status); may be empty.
  std::function<std::string(size_t)> why_gone;

  Status Fail(size_t i, const std::string& what) const {
    return Status::Unavailable("host '" + hosts[i].name + "': " + what);
  }

  Status Send(size_t i, const std::string& line) {
    if (!WriteLine(channels[i].to_agent, line)) {
      int e = errno;
      std::string extra = why_gone ? why_gone(i) : "";
      if (e == EPIPE) return Fail(i, "agent exited" + extra);
      return Fail(i, std::string("cannot write to the agent: ") + std::strerror(e));
    }
    return Status::Ok();
  }

  // The reply words after "ok".
  Result<std::vector<std::string>> Reply(size_t i, Clock::time_point deadline,
                                         const std::string& doing) {
    std::string line;
    switch (readers[i].Read(&line, deadline)) {
      case LineReader::kLine: break;
      case LineReader::kEof: {
        std::string extra = why_gone ? why_gone(i) : "";
        return Fail(i, "agent exited" + extra + " while " + doing);
      }
      case LineReader::kTimeout: {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%g s", opts.timeout_s);
        return Fail(i, "no answer from the agent within " + std::string(buf) + " while " + doing);
      }
      case LineReader::kError: return Fail(i, "bad reply from the agent while " + doing);
    }
    std::vector<std::string> w = Words(line);
    if (!w.empty() && w[0] == "ok") return std::vector<std::string>(w.begin() + 1, w.end());
    if (!w.empty() && w[0] == "error") return Fail(i, doing + ": " + line.substr(6));
    return Fail(i, "unexpected reply '" + line.substr(0, 80) + "' while " + doing);
  }

  Clock::time_point Deadline() const {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(opts.timeout_s));
  }

  void Progress(const std::string& s) const {
    if (opts.progress) opts.progress(s);
  }

  Result<pb::NetworkMatrix> Run() {
    const size_t n = hosts.size();
    for (size_t i = 0; i < n; ++i) readers.emplace_back(channels[i].from_agent);
    pb::NetworkMatrix m;
    std::vector<std::string> addr(n), port(n);
    // All agents listen first; each answers on its own. A data connection
    // proves itself with this run's token: an outsider's would skew links.
    OB_ASSIGN_OR_RETURN(const std::string token, io::RandomHex(16));
    for (size_t i = 0; i < n; ++i) {
      const auto& h = hosts[i];
      OB_RETURN_IF_ERROR(Send(i, "listen " + (h.addr.empty() ? h.name : h.addr) + " " +
                                     std::to_string(h.port) + " " + token));
    }
    auto deadline = Deadline();
    for (size_t i = 0; i < n; ++i) {
      OB_ASSIGN_OR_RETURN(auto w, Reply(i, deadline, "starting its listener"));
      if (w.size() != 2) return Fail(i, "bad listen reply");
      addr[i] = w[0];
      port[i] = w[1];
      m.add_hosts(hosts[i].name);
      m.add_addresses(addr[i]);
      Progress("net: " + hosts[i].name + " listening on " + addr[i] + " port " + port[i]);
    }

    std::string size_words;
    for (uint64_t s : opts.sizes) size_words += " " + std::to_string(s);
    uint64_t largest = *std::max_element(opts.sizes.begin(), opts.sizes.end());
    std::vector<pb::Link> links(n * n);
    auto rounds = PairRounds(static_cast<int>(n));
    for (size_t r = 0; r < rounds.size(); ++r) {
      std::string names;
      for (auto [a, b] : rounds[r]) names += " " + hosts[a].name + "<->" + hosts[b].name;
      Progress("net: round " + std::to_string(r + 1) + "/" + std::to_string(rounds.size()) + ":" +
               names);
      for (int dir = 0; dir < 2; ++dir) {
        // Start every pair of the round, then collect: they run simultaneously.
        for (auto [a, b] : rounds[r]) {
          int src = dir ? b : a, dst = dir ? a : b;
          char timeout[32];
          std::snprintf(timeout, sizeof timeout, "%g", opts.timeout_s);
          OB_RETURN_IF_ERROR(Send(src, "measure " + addr[dst] + " " + port[dst] + " " + token + " " +
                                           std::to_string(opts.pings) + " " +
                                           std::to_string(opts.repeats) + " " + timeout +
                                           size_words));
        }
        deadline = Deadline();
        for (auto [a, b] : rounds[r]) {
          int src = dir ? b : a, dst = dir ? a : b;
          OB_ASSIGN_OR_RETURN(
              auto w, Reply(src, deadline, "measuring the link to '" + hosts[dst].name + "'"));
          if (w.size() != 1 + opts.sizes.size()) return Fail(src, "bad measure reply");
          pb::Link& link = links[src * n + dst];
          link.set_src(src);
          link.set_dst(dst);
          link.set_latency_seconds(std::atof(w[0].c_str()) / 2);
          for (size_t k = 0; k < opts.sizes.size(); ++k) {
            double t = std::atof(w[1 + k].c_str());
            if (!(t > 0)) return Fail(src, "bad time '" + w[1 + k] + "'");
            auto* s = link.add_samples();
            s->set_bytes(opts.sizes[k]);
            s->set_seconds(t);
            if (opts.sizes[k] == largest) link.set_bandwidth_bytes_per_s(largest / t);
          }
          char lat[32];
          std::snprintf(lat, sizeof lat, "%.1f us", link.latency_seconds() * 1e6);
          Progress("net: " + hosts[src].name + " -> " + hosts[dst].name + ": " +
                   HumanRate(link.bandwidth_bytes_per_s()) + ", latency " + lat);
        }
      }
    }
    for (size_t s = 0; s < n; ++s) {
      for (size_t d = 0; d < n; ++d) {
        if (s != d) *m.add_links() = links[s * n + d];
      }
    }
    m.set_rounds(static_cast<uint32_t>(rounds.size()));
    m.set_measured_unix_ms(UnixMs());
    return m;
  }
};

Status CheckOptions(const std::vector<cluster::Host>& hosts, const NetOptions& opts) {
  if (hosts.size() < 2) return Status::Config("network profile needs at least 2 hosts");
  if (opts.sizes.empty()) return Status::Config("network profile: no message sizes");
  for (uint64_t s : opts.sizes) {
    if (s == 0) return Status::Config("network profile: message size 0");
  }
  if (opts.repeats < 1) return Status::Config("network profile: repeats must be >= 1");
  if (opts.pings < 1) return Status::Config("network profile: pings must be >= 1");
  if (!(opts.timeout_s > 0)) return Status::Config("network profile: timeout must be > 0");
  return Status::Ok();
}

}  // namespace

Result<pb::NetworkMatrix> MeasureNetworkWith(const std::vector<cluster::Host>& hosts,
                                             const std::vector<AgentChannel>& agents,
                                             const NetOptions& opts) {
  OB_RETURN_IF_ERROR(CheckOptions(hosts, opts));
  if (agents.size() != hosts.size()) return Status::Internal("one agent channel per host expected");
  Coordinator c{hosts, opts, agents, {}, {}};
  return c.Run();
}

Result<pb::NetworkMatrix> MeasureNetwork(const std::vector<cluster::Host>& hosts,
                                         const NetOptions& opts) {
  OB_RETURN_IF_ERROR(CheckOptions(hosts, opts));
  std::string exe = opts.agent_exe;
  if (exe.empty()) {
    char buf[4096];
    ssize_t len = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (len <= 0) return Status::Internal(Errno("cannot find this executable (/proc/self/exe)"));
    exe.assign(buf, static_cast<size_t>(len));
  }
  std::vector<cluster::ChildProcess> children;  // killed and reaped on every return
  std::vector<AgentChannel> channels;
  for (const auto& h : hosts) {
    auto argv = cluster::RshArgv(opts.rsh, h, {exe, "--net-agent"});
    Result<cluster::ChildProcess> child = cluster::SpawnWithPipes(argv);
    if (!child.ok()) {
      return Status::Unavailable("host '" + h.name + "': cannot start agent: " +
                                 child.status().message());
    }
    children.push_back(std::move(child).value());
    channels.push_back({children.back().stdin_fd(), children.back().stdout_fd()});
  }
  if (opts.progress) opts.progress("net: started " + std::to_string(hosts.size()) + " agents");
  Coordinator c{hosts, opts, channels, {}, {}};
  c.why_gone = [&children](size_t i) -> std::string {
    if (children[i].WaitFor(0.5) < 0) return "";
    return " (" + children[i].DescribeExit() + ")";
  };
  Result<pb::NetworkMatrix> result = c.Run();
  // Agents exit when their stdin closes; give them a moment, then kill.
  for (auto& ch : children) ch.CloseStdin();
  auto until = Clock::now() + std::chrono::seconds(2);
  for (auto& ch : children) {
    double left = std::max(0.0, Seconds(until - Clock::now()));
    if (ch.WaitFor(left) < 0) ch.Kill();
  }
  return result;
}

}  // namespace ob::profile
