// Network profile (design/profile.md): pair scheduling, and a real measurement between
// agents running as threads on loopback addresses, driven over socketpairs
// exactly as MeasureNetwork drives agent processes over their stdin/stdout.
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <set>
#include <thread>

#include "ob/profile/network.h"

using ob::cluster::Host;
using ob::profile::AgentChannel;
using ob::profile::NetOptions;
using ob::profile::PairRounds;

namespace {

// n agents as threads, each behind one socketpair; joins them on destruction.
class ThreadAgents {
 public:
  explicit ThreadAgents(int n) {
    for (int i = 0; i < n; ++i) {
      int sv[2];
      REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
      ours_.push_back(sv[0]);
      theirs_.push_back(sv[1]);
      threads_.emplace_back([fd = sv[1]] { ob::profile::RunNetAgent(fd, fd); });
    }
  }
  ~ThreadAgents() {
    for (int fd : ours_) ::shutdown(fd, SHUT_WR);  // end of input: agents stop
    for (auto& t : threads_) t.join();
    for (int fd : ours_) ::close(fd);
    for (int fd : theirs_) ::close(fd);
  }
  std::vector<AgentChannel> channels() const {
    std::vector<AgentChannel> c;
    for (int fd : ours_) c.push_back({fd, fd});
    return c;
  }

 private:
  std::vector<int> ours_, theirs_;
  std::vector<std::thread> threads_;
};

std::vector<Host> LoopbackHosts(int n) {
  std::vector<Host> hosts;
  for (int i = 0; i < n; ++i) {
    Host h;
    h.name = "h" + std::to_string(i);
    h.addr = "127.0.0." + std::to_string(i + 1);
    hosts.push_back(h);
  }
  return hosts;
}

}  // namespace

TEST_CASE("network: rounds cover every ordered pair once, disjoint", "[network]") {
  for (int n = 0; n <= 17; ++n) {
    INFO("n = " << n);
    auto rounds = PairRounds(n);
    size_t want_rounds = n < 2 ? 0 : (n % 2 == 0 ? n - 1 : n);
    CHECK(rounds.size() == want_rounds);
    std::set<std::pair<int, int>> ordered;
    for (const auto& round : rounds) {
      std::set<int> busy;
      for (auto [a, b] : round) {
        CHECK(a != b);
        CHECK(a >= 0);
        CHECK(b < n);
        CHECK(busy.insert(a).second);  // no host twice in a round
        CHECK(busy.insert(b).second);
        CHECK(ordered.insert({a, b}).second);  // a->b measured once
        CHECK(ordered.insert({b, a}).second);  // b->a measured once
      }
      CHECK(round.size() == static_cast<size_t>(n / 2));  // all busy but the bye
    }
    CHECK(ordered.size() == static_cast<size_t>(n * (n - 1)));
  }
}

TEST_CASE("network: measures 3 loopback hosts through thread agents", "[network]") {
  ThreadAgents agents(3);
  auto hosts = LoopbackHosts(3);
  NetOptions opts;
  opts.sizes = {4 << 10, 1 << 20};
  opts.repeats = 3;
  opts.pings = 5;
  opts.timeout_s = 20;
  std::vector<std::string> lines;
  opts.progress = [&](const std::string& s) { lines.push_back(s); };
  auto before = std::chrono::system_clock::now();
  auto r = ob::profile::MeasureNetworkWith(hosts, agents.channels(), opts);
  REQUIRE(r.ok());
  const auto& m = *r;
  REQUIRE(m.hosts_size() == 3);
  CHECK(m.hosts(2) == "h2");
  REQUIRE(m.addresses_size() == 3);
  CHECK(m.addresses(0) == "127.0.0.1");
  CHECK(m.addresses(2) == "127.0.0.3");
  CHECK(m.rounds() == 3);
  CHECK(m.measured_unix_ms() >= std::chrono::duration_cast<std::chrono::milliseconds>(
                                    before.time_since_epoch()).count());
  REQUIRE(m.links_size() == 6);
  std::set<std::pair<uint32_t, uint32_t>> seen;
  for (const auto& l : m.links()) {
    CHECK(l.src() != l.dst());
    CHECK(seen.insert({l.src(), l.dst()}).second);
    CHECK(l.latency_seconds() > 0);
    CHECK(l.latency_seconds() < 0.1);
    REQUIRE(l.samples_size() == 2);
    CHECK(l.samples(0).bytes() == (4u << 10));
    CHECK(l.samples(1).bytes() == (1u << 20));
    CHECK(l.samples(1).seconds() > 0);
    CHECK(l.bandwidth_bytes_per_s() == Approx((1 << 20) / l.samples(1).seconds()));
    CHECK(l.bandwidth_bytes_per_s() > 1e6);  // loopback: far above 1 MB/s
  }
  CHECK(seen.size() == 6);
  CHECK(!lines.empty());
}

TEST_CASE("network: an agent error names the host", "[network]") {
  ThreadAgents agents(2);
  auto hosts = LoopbackHosts(2);
  hosts[1].addr = "192.0.2.1";  // TEST-NET: not an address of this machine
  NetOptions opts;
  opts.timeout_s = 10;
  auto r = ob::profile::MeasureNetworkWith(hosts, agents.channels(), opts);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == ob::Code::kUnavailable);
  CHECK(r.status().message().rfind("host 'h1': starting its listener: cannot listen on 192.0.2.1",
                                   0) == 0);
}

TEST_CASE("network: a silent agent times out, naming the host", "[network]") {
  ThreadAgents agents(1);
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);  // nobody answers
  auto channels = agents.channels();
  channels.push_back({sv[0], sv[0]});
  NetOptions opts;
  opts.timeout_s = 0.3;
  auto t0 = std::chrono::steady_clock::now();
  auto r = ob::profile::MeasureNetworkWith(LoopbackHosts(2), channels, opts);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(sv[0]);
  ::close(sv[1]);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == ob::Code::kUnavailable);
  CHECK(r.status().message() ==
        "host 'h1': no answer from the agent within 0.3 s while starting its listener");
  CHECK(took < 2);
}

TEST_CASE("network: agents that cannot start name the host, and are reaped", "[network]") {
  NetOptions opts;
  opts.rsh = "local";
  opts.agent_exe = "/nonexistent/ob-profile";
  auto r = ob::profile::MeasureNetwork(LoopbackHosts(2), opts);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == ob::Code::kUnavailable);
  CHECK(r.status().message() ==
        "host 'h0': cannot start agent: cannot run '/nonexistent/ob-profile': No such file or "
        "directory");

  // An agent that starts but exits at once (false ignores its arguments).
  opts.agent_exe = "false";
  r = ob::profile::MeasureNetwork(LoopbackHosts(2), opts);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == ob::Code::kUnavailable);
  // Whichever agent is noticed first (both exit at once) is named.
  INFO(r.status().message());
  CHECK((r.status().message().rfind("host 'h0': agent exited (exit status 1)", 0) == 0 ||
         r.status().message().rfind("host 'h1': agent exited (exit status 1)", 0) == 0));
}

TEST_CASE("network: option and host-count refusals", "[network]") {
  NetOptions opts;
  auto one = ob::profile::MeasureNetwork(LoopbackHosts(1), opts);
  REQUIRE_FALSE(one.ok());
  CHECK(one.status().code() == ob::Code::kConfig);
  opts.sizes = {};
  auto none = ob::profile::MeasureNetwork(LoopbackHosts(2), opts);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == ob::Code::kConfig);
}

TEST_CASE("network: a data connection without the run's token gets no answer", "[network]") {
  // An agent driven by hand over its stdin: listen with a token, then an
  // outsider pings the port. Before the token, the agent echoed any ping
  // and sank any bulk transfer, skewing the link it measured.
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  std::thread agent([fd = sv[1]] { ob::profile::RunNetAgent(fd, fd); });
  auto ask = [&](const std::string& line) {
    const std::string out = line + "\n";
    REQUIRE(::write(sv[0], out.data(), out.size()) == static_cast<ssize_t>(out.size()));
    std::string reply;
    char c;
    while (::read(sv[0], &c, 1) == 1 && c != '\n') reply += c;
    return reply;
  };
  const std::string token(32, 'a');
  const std::string listening = ask("listen 127.0.0.1 0 " + token);
  REQUIRE(listening.rfind("ok 127.0.0.1 ", 0) == 0);
  const std::string port = listening.substr(13);
  auto ping = [&](const std::string& first) {  // the echo of a 64-byte ping, after `first`
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    REQUIRE(::getaddrinfo("127.0.0.1", port.c_str(), &hints, &res) == 0);
    const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(::connect(fd, res->ai_addr, res->ai_addrlen) == 0);
    ::freeaddrinfo(res);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string out = first + 'P';
    for (int i = 0; i < 8; ++i) out += static_cast<char>(i == 0 ? 64 : 0);
    out += std::string(64, 'x');
    (void)::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
    std::string echo;
    char buf[128];
    ssize_t n;
    while (echo.size() < 64 && (n = ::read(fd, buf, sizeof buf)) > 0) echo.append(buf, static_cast<size_t>(n));
    ::close(fd);
    return echo.size();
  };
  CHECK(ping("") == 0);                      // no token: closed unanswered
  CHECK(ping(std::string(32, 'b')) == 0);    // another run's token
  CHECK(ping(token) == 64);                  // the run's: served
  // The agent's own measurement sends the token.
  const std::string measured = ask("measure 127.0.0.1 " + port + " " + token + " 3 2 5 4096");
  CHECK(measured.rfind("ok ", 0) == 0);
  CHECK(ask("measure 127.0.0.1 " + port + " " + std::string(32, 'b') + " 3 2 5 4096").rfind("error ", 0) == 0);
  ::shutdown(sv[0], SHUT_WR);
  agent.join();
  ::close(sv[0]);
  ::close(sv[1]);
}
