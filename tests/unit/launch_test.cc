// The ob-launch control plane: framing, authentication, the loopback
// channel, and the master's set-up decisions (design/launch.md).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <tuple>

#include "ob/clock.h"
#include "ob/launch/wire/channel.h"
#include "ob/launch/master/event_log.h"
#include "ob/log.h"
#include "ob/launch/master/master_setup.h"
#include "ob/launch/master/metrics_sink.h"
#include "ob/launch/master/operator_socket.h"
#include "ob/launch/agent/peer_probe.h"
#include "ob/launch/master/recovery_clock.h"

using namespace ob::launch;

namespace {

ob::pb::Control HeartbeatMsg(uint64_t seq) {
  ob::pb::Control m;
  m.mutable_heartbeat()->set_sequence(seq);
  return m;
}

// A loop that runs until `done` or a 5 s bound.
struct Loop {
  uv_loop_t loop;
  Loop() { uv_loop_init(&loop); }
  ~Loop() {
    uv_walk(&loop, [](uv_handle_t* h, void*) { if (!uv_is_closing(h)) uv_close(h, nullptr); }, nullptr);
    for (int i = 0; i < 5; ++i) uv_run(&loop, UV_RUN_NOWAIT);
    uv_loop_close(&loop);
  }
  template <typename Pred>
  bool RunUntil(Pred done, int max_ms = 5000) {
    uint64_t end = uv_now(&loop) + static_cast<uint64_t>(max_ms);
    while (!done()) {
      if (uv_now(&loop) > end) return false;
      uv_run(&loop, UV_RUN_NOWAIT);
      usleep(1000);
      uv_update_time(&loop);
    }
    return true;
  }
  // Connects to 127.0.0.1:port as `host` with `secret` and runs the loop
  // until Connect calls back (at most `max_ms`): its outcome, Ok when a
  // connection was handed over (and then dropped).
  ob::Status ConnectOnce(int port, const std::string& secret, const std::string& host,
                         int timeout_ms = 2000, int max_ms = 5000) {
    ob::Status result = ob::Status::Internal("Connect never called back");
    bool done = false;
    ob::pb::Hello hello;
    hello.set_host(host);
    Connect(&loop, "127.0.0.1", port, timeout_ms, secret, hello,
            [&](ob::Result<std::shared_ptr<Connection>> r) {
              done = true;
              result = r.ok() ? ob::Status::Ok() : r.status();
            });
    RunUntil([&] { return done; }, max_ms);
    return result;
  }
};

std::string TempPath(const std::string& name) {
  return std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/ob-launch-test-" +
         std::to_string(getpid()) + "-" + name;
}

}  // namespace

TEST_CASE("frames round trip, delivered a byte at a time") {
  std::string stream;
  ob::pb::Control start;
  auto* w = start.mutable_start_workers()->add_workers();
  w->set_rank(3);
  w->add_argv("sleep");
  w->add_argv("1");
  (*w->mutable_env())["OB_RANK"] = "3";
  AppendFrame(HeartbeatMsg(7), &stream);
  AppendFrame(start, &stream);
  AppendFrame(HeartbeatMsg(8), &stream);
  FrameDecoder d;
  std::vector<ob::pb::Control> out;
  for (char c : stream) REQUIRE(d.Feed(&c, 1, &out).ok());
  REQUIRE(out.size() == 3);
  CHECK(out[0].heartbeat().sequence() == 7);
  CHECK(out[1].start_workers().workers(0).argv(0) == "sleep");
  CHECK(out[1].start_workers().workers(0).env().at("OB_RANK") == "3");
  CHECK(out[2].heartbeat().sequence() == 8);
  CHECK(d.buffered() == 0);
}

TEST_CASE("an oversize, garbage or empty frame fails the stream") {
  FrameDecoder big;
  std::vector<ob::pb::Control> out;
  const char huge[4] = {'\x7f', '\xff', '\xff', '\xff'};
  ob::Status st = big.Feed(huge, 4, &out);
  CHECK(st.code() == ob::Code::kDataErr);
  CHECK(st.message().find("exceeds") != std::string::npos);
  CHECK_FALSE(big.Feed("", 0, &out).ok());  // stays failed

  FrameDecoder junk;
  const char bad[] = {0, 0, 0, 5, '\xff', '\xff', '\xff', '\xff', '\xff'};
  st = junk.Feed(bad, sizeof bad, &out);
  CHECK(st.code() == ob::Code::kDataErr);
  CHECK(st.message().find("malformed") != std::string::npos);

  FrameDecoder empty;
  const char zero[] = {0, 0, 0, 0};
  CHECK_FALSE(empty.Feed(zero, 4, &out).ok());
  CHECK(out.empty());
}

TEST_CASE("proofs: the right secret passes, a wrong one or another host fails") {
  std::string nonce = RandomNonce();
  REQUIRE(nonce.size() == kNonceBytes);
  CHECK(nonce != RandomNonce());
  std::string p = AuthProof("s3cret", "ob-launch agent", nonce, "h1");
  CHECK(p.size() == 32);
  CHECK(CheckProof("s3cret", "ob-launch agent", nonce, "h1", p));
  CHECK_FALSE(CheckProof("wrong", "ob-launch agent", nonce, "h1", p));
  CHECK_FALSE(CheckProof("s3cret", "ob-launch agent", nonce, "h2", p));
  CHECK_FALSE(CheckProof("s3cret", "ob-launch master", nonce, "h1", p));
  CHECK_FALSE(CheckProof("s3cret", "ob-launch agent", nonce, "h1", p.substr(0, 31)));
}

TEST_CASE("loopback channel: the right secret is admitted and messages flow both ways") {
  Loop l;
  Server server(&l.loop);
  Server::Options o;
  o.secret = "s3cret";
  REQUIRE(o.bind == "127.0.0.1");  // loopback unless told otherwise
  std::shared_ptr<Connection> at_server;
  std::string hello_host;
  std::vector<uint64_t> got_by_server, got_by_client;
  REQUIRE(server.Listen(o, [](const ob::pb::Hello&) { return std::string(); },
                        [&](std::shared_ptr<Connection> c, const ob::pb::Hello& h) {
                          at_server = c;
                          hello_host = h.host();
                          c->SetHandlers([&](Connection&, ob::pb::Control& m) {
                            got_by_server.push_back(m.heartbeat().sequence());
                          }, nullptr);
                        }).ok());
  REQUIRE(server.port() > 0);
  std::shared_ptr<Connection> client;
  bool done = false;
  ob::pb::Hello hello;
  hello.set_host("h1");
  Connect(&l.loop, "127.0.0.1", server.port(), 2000, "s3cret", hello,
          [&](ob::Result<std::shared_ptr<Connection>> r) {
            done = true;
            REQUIRE(r.ok());
            client = *r;
            client->SetHandlers([&](Connection&, ob::pb::Control& m) {
              got_by_client.push_back(m.heartbeat().sequence());
            }, nullptr);
          });
  REQUIRE(l.RunUntil([&] { return done && at_server != nullptr; }));
  CHECK(hello_host == "h1");
  client->Send(HeartbeatMsg(1));
  client->Send(HeartbeatMsg(2));
  at_server->Send(HeartbeatMsg(9));
  REQUIRE(l.RunUntil([&] { return got_by_server.size() == 2 && got_by_client.size() == 1; }));
  CHECK(got_by_server == std::vector<uint64_t>{1, 2});
  CHECK(got_by_client == std::vector<uint64_t>{9});
  CHECK(server.rejected() == 0);

  std::string why;
  at_server->SetHandlers(nullptr, [&](Connection&, const std::string& r) { why = r; });
  client->Close("test over");
  REQUIRE(l.RunUntil([&] { return !why.empty(); }));
  CHECK(why == "closed by peer");
}

TEST_CASE("loopback channel: a wrong secret is rejected on both sides") {
  Loop l;
  Server server(&l.loop);
  Server::Options o;
  o.secret = "s3cret";
  bool admitted = false;
  REQUIRE(server.Listen(o, nullptr, [&](std::shared_ptr<Connection>, const ob::pb::Hello&) {
    admitted = true;
  }).ok());
  const ob::Status result = l.ConnectOnce(server.port(), "not-the-secret", "h1");
  CHECK_FALSE(admitted);
  // The master's proof fails first: the agent refuses to go on.
  CHECK(result.code() == ob::Code::kConfig);
  CHECK(result.message().find("secret") != std::string::npos);
  REQUIRE(l.RunUntil([&] { return server.rejected() == 1; }));
}

TEST_CASE("loopback channel: an admit refusal reaches the agent with its reason") {
  Loop l;
  Server server(&l.loop);
  Server::Options o;
  o.secret = "s3cret";
  REQUIRE(server.Listen(o, [](const ob::pb::Hello& h) { return "unknown host '" + h.host() + "'"; },
                        [](std::shared_ptr<Connection>, const ob::pb::Hello&) {}).ok());
  const ob::Status result = l.ConnectOnce(server.port(), "s3cret", "stranger");
  CHECK(result.code() == ob::Code::kConfig);
  CHECK(result.message().find("unknown host 'stranger'") != std::string::npos);
  CHECK(server.rejected() == 1);
}

TEST_CASE("peer text is made printable and bounded before it is logged") {
  using ob::log::Printable;
  CHECK(Printable("h1") == "h1");
  CHECK(Printable("evil\x1b[2J\r\nerror: forged line") == "evil?[2J??error: forged line");
  CHECK(Printable("caf\xc3\xa9") == "caf??");
  CHECK(Printable(std::string("a\0b", 3)) == "a?b");
  CHECK(Printable(std::string(300, 'x')) == std::string(128, 'x') + "...");
  CHECK(Printable(std::string(10, 'x'), 4) == "xxxx...");
}

TEST_CASE("loopback channel: a hostile host name never reaches a log line raw") {
  const std::string log_path = TempPath("hostile.log");
  REQUIRE(ob::log::SetFile(log_path));
  Loop l;
  Server server(&l.loop);
  Server::Options o;
  o.secret = "s3cret";
  REQUIRE(server.Listen(o, [](const ob::pb::Hello& h) { return "unknown host '" + h.host() + "'"; },
                        [](std::shared_ptr<Connection>, const ob::pb::Hello&) {}).ok());
  const ob::Status result =
      l.ConnectOnce(server.port(), "s3cret", "evil\x1b]0;pwned\x07\nmaster: error: forged" + std::string(5000, 'A'));
  REQUIRE(l.RunUntil([&] { return server.rejected() == 1; }));
  REQUIRE(ob::log::SetFile(""));
  std::ifstream in(log_path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ::unlink(log_path.c_str());
  REQUIRE(text.find("rejected agent connection") != std::string::npos);
  size_t lines = 0;
  for (char c : text) {
    if (c == '\n') ++lines;
    else CHECK((c >= 0x20 && c < 0x7f));
  }
  CHECK(lines == 1);           // the forged "line" stayed inside the real one
  CHECK(text.size() < 600);    // 5000 bytes of name cut short
  // What the agent is told (and logs) is as clean.
  CHECK(result.code() == ob::Code::kConfig);
  CHECK(result.message().size() < 600);
  CHECK(result.message().find('\x1b') == std::string::npos);
}

TEST_CASE("loopback channel: garbage from a peer closes its connection") {
  Loop l;
  Server server(&l.loop);
  Server::Options o;
  o.secret = "s3cret";
  REQUIRE(server.Listen(o, nullptr, [](std::shared_ptr<Connection>, const ob::pb::Hello&) {}).ok());
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(server.port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  const char junk[] = "\xff\xff\xff\xffGET / HTTP/1.0\r\n\r\n";
  REQUIRE(::write(fd, junk, sizeof junk - 1) == static_cast<ssize_t>(sizeof junk - 1));
  bool closed = false;
  REQUIRE(l.RunUntil([&] {
    char buf[64];
    ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) closed = true;
    return closed;
  }));
  ::close(fd);
}

namespace {

int ConnectRaw(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool ClosedByPeer(int fd) {
  char buf[256];
  ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
  while (n > 0) n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);  // a Reject, if any
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

}  // namespace

TEST_CASE("loopback channel: a stranger cannot make the master buffer more than a small frame") {
  Loop l;
  Server server(&l.loop);
  Server::Options o;
  o.secret = "s3cret";
  REQUIRE(server.Listen(o, nullptr, [](std::shared_ptr<Connection>, const ob::pb::Hello&) {}).ok());
  // A frame under the 4 MiB channel limit but over the handshake's: cut off
  // on its header, long before the handshake timeout.
  int fd = ConnectRaw(server.port());
  REQUIRE(fd >= 0);
  const uint32_t n = kMaxHandshakeFrameBytes + 1;
  const char head[4] = {static_cast<char>(n >> 24), static_cast<char>(n >> 16),
                        static_cast<char>(n >> 8), static_cast<char>(n)};
  REQUIRE(::write(fd, head, 4) == 4);
  REQUIRE(l.RunUntil([&] { return ClosedByPeer(fd); }, 1000));
  ::close(fd);

  // A flood of connections that never say Hello: beyond the limit, each
  // new one is closed on arrival; once they are gone an agent gets in.
  std::vector<int> flood;
  for (size_t i = 0; i < kMaxPendingHandshakes; ++i) {
    int f = ConnectRaw(server.port());
    REQUIRE(f >= 0);
    flood.push_back(f);
    uv_run(&l.loop, UV_RUN_NOWAIT);  // accept as they come (the backlog is 128)
  }
  REQUIRE(l.RunUntil([&] { return false; }, 200) == false);  // let the server accept them
  int extra = ConnectRaw(server.port());
  REQUIRE(extra >= 0);
  CHECK(l.RunUntil([&] { return ClosedByPeer(extra); }, 1000));
  ::close(extra);
  int still_open = 0;
  for (int f : flood) still_open += ClosedByPeer(f) ? 0 : 1;
  CHECK(still_open == static_cast<int>(kMaxPendingHandshakes));
  for (int f : flood) ::close(f);
  REQUIRE(l.RunUntil([&] { return false; }, 200) == false);
  CHECK(l.ConnectOnce(server.port(), "s3cret", "h1").ok());
}

TEST_CASE("a client gives up when nothing answers in time, and tells a refusal from it") {
  Loop l;
  // A listening socket that never accepts nor answers: the handshake times out.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd, 4) == 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const ob::Status slow = l.ConnectOnce(ntohs(a.sin_port), "s3cret", "", 300, 3000);
  CHECK(slow.code() == ob::Code::kUnavailable);
  CHECK_FALSE(NobodyListens(slow));  // stopped or slow is not gone
  ::close(fd);
  // Closed now: the connection is refused, nothing listens there.
  const ob::Status refused = l.ConnectOnce(ntohs(a.sin_port), "s3cret", "", 300, 3000);
  CHECK(refused.code() == ob::Code::kUnavailable);
  CHECK(NobodyListens(refused));
  CHECK_FALSE(NobodyListens(ob::Status::Unavailable("connection to 127.0.0.1:1 ended during the handshake")));
  CHECK_FALSE(NobodyListens(ob::Status::Config("cannot connect to x: connection refused")));
}

TEST_CASE("the secret: a private file or $OB_SECRET, never an open, empty or short one") {
  std::string path = TempPath("secret");
  { std::ofstream(path) << "s3cret-of-16-bytes\n"; }
  ::chmod(path.c_str(), 0644);
  auto open = ReadSecret(path);
  CHECK(open.status().code() == ob::Code::kConfig);
  CHECK(open.status().message().find("chmod 600") != std::string::npos);
  ::chmod(path.c_str(), 0600);
  auto ok = ReadSecret(path);
  REQUIRE(ok.ok());
  CHECK(*ok == "s3cret-of-16-bytes");
  { std::ofstream(path) << "\n"; }
  CHECK(ReadSecret(path).status().code() == ob::Code::kConfig);
  // A secret of a few bytes is guessed by whoever reaches the master's
  // port, a connection a try (it was taken, down to one byte).
  { std::ofstream(path) << "x\n"; }
  auto one = ReadSecret(path);
  CHECK(one.status().code() == ob::Code::kConfig);
  CHECK(one.status().message() == path + ": the secret is 1 bytes, fewer than 16: anyone who reaches the master's "
                                         "port could guess it; make one with: head -c 32 /dev/urandom | base64");
  { std::ofstream(path) << "0123456789abcde\n"; }
  CHECK(ReadSecret(path).status().code() == ob::Code::kConfig);
  { std::ofstream(path) << "0123456789abcdef\n"; }
  CHECK(ReadSecret(path).ok());
  ::unlink(path.c_str());
  CHECK(ReadSecret(path).status().code() == ob::Code::kConfig);

  ::unsetenv("OB_SECRET");
  CHECK(ReadSecret("").status().code() == ob::Code::kConfig);
  ::setenv("OB_SECRET", "from-env", 1);
  CHECK(ReadSecret("").status().message().rfind("OB_SECRET: the secret is 8 bytes", 0) == 0);
  ::setenv("OB_SECRET", "from-the-environment", 1);
  auto env = ReadSecret("");
  REQUIRE(env.ok());
  CHECK(*env == "from-the-environment");
  ::unsetenv("OB_SECRET");
}

TEST_CASE("the secret from standard input: a pipe, or a private file redirected in") {
  const int saved = ::dup(STDIN_FILENO);
  REQUIRE(saved >= 0);
  auto with_stdin = [&](int fd) {
    REQUIRE(::dup2(fd, STDIN_FILENO) == STDIN_FILENO);
    ::close(fd);
  };
  // A pipe whose writer has not closed it: the first line is the secret.
  int p[2];
  REQUIRE(::pipe(p) == 0);
  REQUIRE(::write(p[1], "piped-secret-0123\nmore\n", 23) == 23);
  with_stdin(p[0]);
  auto piped = ReadSecret("-");
  ::close(p[1]);
  // A file others may read is refused through stdin as by name.
  std::string path = TempPath("secret-in");
  { std::ofstream(path) << "s3cret-of-16-bytes\n"; }
  ::chmod(path.c_str(), 0644);
  with_stdin(::open(path.c_str(), O_RDONLY));
  auto open = ReadSecret("-");
  ::unlink(path.c_str());
  ::dup2(saved, STDIN_FILENO);
  ::close(saved);
  REQUIRE(piped.ok());
  CHECK(*piped == "piped-secret-0123");
  CHECK(open.status().code() == ob::Code::kConfig);
  CHECK(open.status().message() == "--secret-file - (standard input): permissions 0644 let others read the secret; chmod 600 it");
}

TEST_CASE("bind addresses and HOST:PORT parsing") {
  std::string addr;
  int port = -1;
  REQUIRE(ParseBind("127.0.0.1", &addr, &port).ok());
  CHECK((addr == "127.0.0.1" && port == 0));
  REQUIRE(ParseBind("10.0.0.1:29500", &addr, &port).ok());
  CHECK((addr == "10.0.0.1" && port == 29500));
  REQUIRE(ParseBind("[::1]:7", &addr, &port).ok());
  CHECK((addr == "::1" && port == 7));
  REQUIRE(ParseBind("::1", &addr, &port).ok());
  CHECK(addr == "::1");
  CHECK(ParseBind("1.2.3.4:99999", &addr, &port).code() == ob::Code::kUsage);
  CHECK(SplitHostPort("h1", "--master", &addr, &port).code() == ob::Code::kUsage);
  CHECK(AdvertisedHost("::1") == "[::1]");
  CHECK(AdvertisedHost("127.0.0.1") == "127.0.0.1");
}

TEST_CASE("bind auto: loopback for local hosts, a name that does not resolve is named") {
  using ob::cluster::Host;
  auto bind = [](std::vector<Host> hosts, const std::string& rsh) {
    return ob::launch::AutoBindAddress(hosts, rsh);
  };
  Host local{"localhost", 1, 0, "", 1}, alias{"h1", 1, 0, "127.0.0.7", 2}, nowhere{"nowhere.invalid", 1, 0, "", 3};
  CHECK(*bind({nowhere}, "local") == "127.0.0.1");  // --rsh local: this machine, whatever the names
  CHECK(*bind({local, alias}, "ssh") == "127.0.0.1");  // every route through loopback: all local
  auto st = bind({local, nowhere}, "ssh");
  REQUIRE(st.status().code() == ob::Code::kUsage);
  CHECK(st.status().message() ==
        "--bind auto: host nowhere.invalid does not resolve here, so which address of this machine its "
        "agent can reach is unknown; give --bind ADDR");
  CHECK(bind({nowhere}, "slurm").status().code() == ob::Code::kUsage);
  CHECK(*bind({nowhere}, "ip netns exec") == "127.0.0.1");  // namespace names: not on the network
}

TEST_CASE("control socket requests") {
  auto s = ParseOperatorRequest("status");
  REQUIRE(s.ok());
  CHECK(s->command() == ob::pb::OPERATOR_STATUS);
  auto stop = ParseOperatorRequest("stop maintenance window");
  REQUIRE(stop.ok());
  CHECK(stop->reason() == "maintenance window");
  CHECK(ParseOperatorRequest("exclude").status().code() == ob::Code::kUsage);
  CHECK(ParseOperatorRequest("reboot").status().code() == ob::Code::kUsage);
  auto slow = ParseOperatorRequest("exclude h3 slow=1.49 straggler: rank 2 straggles");
  REQUIRE(slow.ok());
  CHECK(slow->command() == ob::pb::OPERATOR_EXCLUDE_HOST);
  CHECK(slow->host() == "h3");
  CHECK(slow->slowdown() == 1.49);
  CHECK(slow->reason() == "straggler: rank 2 straggles");
  auto bare = ParseOperatorRequest("drain h3 slow=2 ");
  REQUIRE(bare.ok());
  CHECK(bare->slowdown() == 2);
  CHECK(bare->reason() == "an operator asked to drain it");
  // "run=ID": for that run only.
  auto mine = ParseOperatorRequest("run=0123456789abcdef rollback loss_nan: loss is NaN");
  REQUIRE(mine.ok());
  CHECK(mine->command() == ob::pb::OPERATOR_ROLLBACK);
  CHECK(mine->run() == "0123456789abcdef");
  CHECK(mine->reason() == "loss_nan: loss is NaN");
  auto excl = ParseOperatorRequest("run=ab exclude h3 slow=2 straggler");
  REQUIRE(excl.ok());
  CHECK(excl->host() == "h3");
  CHECK(excl->slowdown() == 2);
  CHECK(excl->run() == "ab");
  CHECK(ParseOperatorRequest("run= stop").status().code() == ob::Code::kUsage);
  CHECK(ParseOperatorRequest("run=ab").status().code() == ob::Code::kUsage);
  CHECK(ParseOperatorRequest("stop")->run().empty());
  auto plain = ParseOperatorRequest("exclude h3 bad disk");
  REQUIRE(plain.ok());
  CHECK(plain->slowdown() == 0);
  CHECK(plain->reason() == "bad disk");
  for (const char* bad : {"exclude h3 slow=", "exclude h3 slow=0.5 x", "exclude h3 slow=fast",
                          "exclude h3 slow=nan"})
    CHECK(ParseOperatorRequest(bad).status().code() == ob::Code::kUsage);
  ob::pb::OperatorResponse r;
  r.set_ok(true);
  r.set_state("running");
  std::string json = OperatorResponseJson(r);
  CHECK(json.find('\n') == std::string::npos);
  CHECK(json.find("\"state\":\"running\"") != std::string::npos);
}

// A TCP listener on `addr` (host order) with `backlog`, and its port.
std::pair<int, int> Listen(uint32_t addr, int backlog) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(addr);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd, backlog) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  return {fd, ntohs(a.sin_port)};
}

// A peer that never answers, on any network: a listener on every address
// whose accept queue (backlog 0) is full, so the kernel drops each further
// connection request unanswered (and repeats none within a second).
struct SilentListener {
  int listener = -1;
  int queued = -1;
  int port = 0;
  SilentListener() {
    std::tie(listener, port) = Listen(INADDR_ANY, 0);
    queued = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(queued, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  ~SilentListener() {
    ::close(queued);
    ::close(listener);
  }
};

TEST_CASE("peer probes: a refusal is an answer, silence and no route are not, a non-address is never accused") {
  // A listener we accept nothing on, a port nobody listens on, the
  // broadcast address (no route: refused at once), and a listener whose
  // full queue drops the attempt: silence on any network. (Reserved space,
  // 240.0.0.1, is no test of silence: a network whose gateway resets
  // unknown destinations answers for it some times and not others, seen
  // in a CI run: silent, then answered 300 ms later.)
  const auto [l, open_port] = Listen(INADDR_LOOPBACK, 4);
  std::vector<bool> r = ProbeOnce({{"self", "127.0.0.1"}}, open_port, 300);
  CHECK(r == std::vector<bool>{true});
  ::close(l);
  r = ProbeOnce({{"closed", "127.0.0.1"}, {"no route", "255.255.255.255"}, {"name", "not-an-ip"}}, open_port, 300);
  CHECK(r[0]);
  CHECK(!r[1]);
  CHECK(r[2]);
  SilentListener full;
  CHECK(ProbeOnce({{"silent", "127.0.0.1"}}, full.port, 300) == std::vector<bool>{false});
}

TEST_CASE("the --probe-port flag: a port or off, and the probes try that port") {
  CHECK(*ParseProbePort("9") == 9);
  CHECK(*ParseProbePort("65535") == 65535);
  CHECK(*ParseProbePort("off") == 0);
  for (const char* bad : {"", "0", "65536", "-1", "+9", " 9", "9x", "99999999999999999999", "on"}) {
    const ob::Result<int> r = ParseProbePort(bad);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == ob::Code::kUsage);
    CHECK(r.status().message() == "'" + std::string(bad) + "' is not a port (1-65535) or 'off'");
  }
  // The same peer through a silent port and through a closed one: only
  // the first is reported, after kConfirmRounds rounds.
  SilentListener full;
  const auto [l, closed] = Listen(INADDR_LOOPBACK, 1);
  ::close(l);
  PeerProbe silent(full.port), refused(closed);
  silent.SetPeers({{"self", "127.0.0.1"}});
  refused.SetPeers({{"self", "127.0.0.1"}});
  const int64_t end = ob::SteadyMs() + (kConfirmRounds + 2) * (kProbeMs + kProbeTimeoutMs);
  while (silent.Unreachable().empty() && ob::SteadyMs() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(silent.Unreachable() == std::vector<std::string>{"self"});
  CHECK(refused.Unreachable().empty());
}

TEST_CASE("peer probes judge every peer when descriptors run short, and never hold more than their window") {
  // Before: every attempt at once, and each socket(2) past the limit
  // counted as an answer ("our own trouble"): the silent peers past it
  // were never judged, and the process had no descriptor left meanwhile.
  SilentListener full;
  const auto loopback = [](size_t i) {
    return "127.0." + std::to_string(1 + i / 250) + "." + std::to_string(1 + i % 250);
  };
  std::vector<Peer> silent;
  for (size_t i = 0; i < 40; ++i) silent.push_back({"h" + std::to_string(i), loopback(i)});
  const auto open_now = [] {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
    return n;
  };
  rlimit was{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &was) == 0);
  rlimit low = was;
  low.rlim_cur = open_now() + 8;  // room for about 8 attempts at a time
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  CHECK(ProbeWindow() == low.rlim_cur / 4);
  const int64_t t0 = ob::SteadyMs();
  const std::vector<bool> r = ProbeOnce(silent, full.port, 150);
  const int64_t took = ob::SteadyMs() - t0;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &was) == 0);
  CHECK(r == std::vector<bool>(silent.size(), false));
  // Each attempt had its own 150 ms, however long it waited for a slot.
  CHECK(took >= 4 * 150);
  // Beyond the window, attempts wait: a full window of silent peers and
  // one more take two timeouts, not one.
  low.rlim_cur = 4 * 100;
  if (low.rlim_max < low.rlim_cur) {
    WARN("the hard open-file limit is " << low.rlim_max << ": the window is not tested");
    return;
  }
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  REQUIRE(ProbeWindow() == 100);
  std::vector<Peer> many;
  for (size_t i = 0; i <= 100; ++i) many.push_back({"m" + std::to_string(i), loopback(i)});
  const int64_t t1 = ob::SteadyMs();
  const std::vector<bool> m = ProbeOnce(many, full.port, 200);
  const int64_t took_many = ob::SteadyMs() - t1;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &was) == 0);
  CHECK(ProbeWindow() == std::min<size_t>(kProbeInFlight, was.rlim_cur / 4));
  CHECK(m == std::vector<bool>(many.size(), false));
  CHECK(took_many >= 2 * 200);
  CHECK(took_many < 3 * 200 + 500);
}

TEST_CASE("the metrics sink stamps every record with the run and the master's clock, a worker's own run field included") {
  char path[] = "/tmp/ob-launch-test-metrics.XXXXXX";
  const int tmp = ::mkstemp(path);
  REQUIRE(tmp >= 0);
  ::close(tmp);
  ::unlink(path);
  {
    ob::launch::MetricsSink sink(nullptr);
    REQUIRE(sink.Open(path).ok());
    sink.set_run("0123456789abcdef");
    ob::pb::Metrics m;
    m.set_step(3);
    sink.Publish(m);
    m.set_run("forged");  // a worker cannot speak for another run
    sink.Publish(m);
    sink.Exited("h1", ob::pb::WorkerExited(), 1, 3);
    m.set_heartbeat(true);  // most of the file: no run of its own
    m.set_rank(5);          // (rank 0's, right after its step, --metrics would not keep)
    sink.Publish(m);
  }
  const int fd = ::open(path, O_RDONLY);
  REQUIRE(fd >= 0);
  ob::io::RecordReader in(fd, path);
  int n = 0;
  ob::pb::Metrics back;
  while (true) {
    ob::Result<bool> more = in.Next(&back);
    REQUIRE(more.ok());
    if (!*more) break;
    CHECK(back.run() == (back.heartbeat() ? "" : "0123456789abcdef"));
    CHECK(std::llabs(back.received_unix_ms() - ob::UnixMs()) < 60000);  // the master's clock
    ++n;
  }
  ::close(fd);
  ::unlink(path);
  CHECK(n == 4);
}

// Every record of a delimited Metrics file.
std::vector<ob::pb::Metrics> ReadMetrics(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  ob::io::RecordReader in(fd, path);
  std::vector<ob::pb::Metrics> out;
  ob::pb::Metrics m;
  while (true) {
    ob::Result<bool> more = in.Next(&m);
    REQUIRE(more.ok());
    if (!*more) break;
    out.push_back(m);
  }
  ::close(fd);
  return out;
}

TEST_CASE("the --metrics file keeps a rank's plain heartbeats at most once a kFileBeatMs, and every other record") {
  // Before: two beats a second a worker, 7 GB a day at 1,024 workers.
  const std::string path = "/tmp/ob-launch-test-beats." + std::to_string(::getpid());
  ::unlink(path.c_str());
  {
    MetricsSink sink(nullptr);
    REQUIRE(sink.Open(path).ok());
    const auto beat = [&](uint32_t rank, uint64_t progress, uint64_t generation = 1,
                          ob::pb::WorkerPhase phase = ob::pb::PHASE_TRAINING) {
      ob::pb::Metrics m;
      m.set_rank(rank);
      m.set_generation(generation);
      m.set_heartbeat(true);
      m.set_progress(progress);
      m.set_phase(phase);
      sink.Publish(m);
    };
    beat(0, 1);  // kept: rank 0's first
    beat(0, 2);  // not: within kFileBeatMs, same phase
    beat(1, 1);  // kept: rank 1's first
    beat(0, 3, 2);  // kept: another generation's rank 0
    ob::pb::Metrics step;
    step.set_rank(0);
    step.set_generation(1);
    step.set_step(7);
    step.set_phase(ob::pb::PHASE_TRAINING);
    sink.Publish(step);  // kept: a step
    beat(0, 4);          // not: right after rank 0's step
    ob::pb::Metrics saved;
    saved.set_rank(0);
    saved.set_generation(1);
    saved.set_heartbeat(true);
    saved.set_phase(ob::pb::PHASE_TRAINING);
    saved.mutable_checkpoint()->set_step(7);
    sink.Publish(saved);  // kept: a checkpoint's report
    HangWatch::Named hung;
    hung.rank = 1;
    hung.step = 7;
    sink.Hung("h2", hung, 1, "rank 1 hung");  // kept: the master's verdict
    sink.Exited("h2", ob::pb::WorkerExited(), 1, 7);  // kept
    beat(1, 5, 1, ob::pb::PHASE_JOINING);  // kept: its phase changed
    std::this_thread::sleep_for(std::chrono::milliseconds(MetricsSink::kFileBeatMs + 50));
    beat(0, 6);  // kept: a second since rank 0's last record
    beat(0, 7);  // not
  }
  const std::vector<ob::pb::Metrics> got = ReadMetrics(path);
  ::unlink(path.c_str());
  std::vector<std::string> seen;
  for (const auto& m : got) {
    seen.push_back(std::to_string(m.generation()) + ":" + std::to_string(m.rank()) + ":" +
                   (m.has_exit() ? "exit" : m.has_hang() ? "hang" : m.has_checkpoint() ? "ckpt"
                    : m.heartbeat() ? "beat" + std::to_string(m.progress()) : "step"));
  }
  CHECK(seen == std::vector<std::string>{"1:0:beat1", "1:1:beat1", "2:0:beat3", "1:0:step", "1:0:ckpt",
                                         "1:1:hang", "1:0:exit", "1:1:beat5", "1:0:beat6"});
}

TEST_CASE("the progress line names the largest peak GPU memory of any rank, and none on a CPU") {
  ob::launch::MetricsSink sink(nullptr);
  sink.set_total_steps(100);
  auto step = [](uint32_t rank, uint64_t peak) {
    ob::pb::Metrics m;
    m.set_rank(rank);
    m.set_step(4);
    m.set_loss(rank == 1 ? 3.5 : std::nan(""));
    m.set_tokens_per_second(1000);
    m.set_step_seconds(0.5);
    m.set_peak_memory_bytes(peak);
    return m;
  };
  sink.Step(step(0, uint64_t{17} << 30));
  sink.Step(step(1, uint64_t{18} << 30));
  const std::string line = sink.Progress();
  CHECK_THAT(line, Catch::Contains("step 5/100  loss 3.5000"));
  CHECK_THAT(line, Catch::Contains("GPU memory 18.0 GiB (rank 1)"));
  ob::launch::MetricsSink cpu(nullptr);
  cpu.Step(step(0, 0));
  CHECK_THAT(cpu.Progress(), !Catch::Contains("GPU memory"));
}

// A run whose loss ends NaN trained weights nobody can use: it must not exit
// 0 (seen on a GPU, 2026-11-26: an optimizer bug made every loss from step 1
// NaN, and ob-launch reported "trained 100 steps: final loss nan" and 0).
TEST_CASE("a run that ends with a loss that is not finite is not a success") {
  auto step = [](uint32_t rank, uint64_t s, double loss) {
    ob::pb::Metrics m;
    m.set_rank(rank);
    m.set_step(s);
    m.set_loss(loss);
    m.set_tokens_per_second(1000);
    m.set_step_seconds(0.5);
    return m;
  };
  ob::launch::MetricsSink sink(nullptr);
  sink.set_total_steps(6);
  for (uint64_t s = 0; s < 6; ++s) {
    const double loss = s < 2 ? 4.0 - s : std::nan("");
    sink.Step(step(0, s, loss));
    sink.Step(step(1, s, loss));
  }
  CHECK_THAT(sink.Progress(), Catch::Contains("step 6/6  loss nan"));
  const ob::Status v = sink.LossVerdict();
  CHECK(v.code() == ob::Code::kDataErr);
  CHECK_THAT(v.message(), Catch::Contains("not finite (nan since step 2)"));
  CHECK_THAT(v.message(), Catch::Contains("the last finite loss was at step 1"));

  ob::launch::MetricsSink recovered(nullptr);  // a NaN on the way, finite at the end
  recovered.set_total_steps(3);
  recovered.Step(step(0, 0, 3.0));
  recovered.Step(step(0, 1, std::nan("")));
  recovered.Step(step(0, 2, 2.5));
  CHECK(recovered.LossVerdict().ok());

  ob::launch::MetricsSink evaluated(nullptr);  // --steps 0: nothing trained
  for (uint32_t rank = 0; rank < 2; ++rank) {
    ob::pb::Metrics m = step(rank, 4, std::nan(""));
    m.clear_tokens_per_second();
    m.clear_step_seconds();
    m.set_eval_loss(4.422);
    m.set_evaluation_only(true);
    evaluated.Step(m);
  }
  CHECK(evaluated.LossVerdict().ok());
  // Its progress line has no loss to show, not a NaN one (before
  // 2026-12-02: "step 5  loss nan  eval 4.4220").
  CHECK_THAT(evaluated.Progress(), Catch::StartsWith("step 5  loss -  eval 4.4220  tokens/s -"));
  CHECK(evaluated.Summary() == "evaluated the weights after step 4: eval loss 4.4220");
}

TEST_CASE("the closing line puts the measured step beside the plan's prediction") {
  ob::launch::MetricsSink sink(nullptr);
  sink.set_total_steps(30);
  for (uint64_t s = 0; s < 30; ++s) {  // 10 slow start-up steps, then 0.1 s
    ob::pb::Metrics m;
    m.set_rank(0);
    m.set_step(s);
    m.set_loss(3.0);
    m.set_tokens_per_second(1000);
    m.set_step_seconds(s < 10 ? 1.0 : 0.1);
    sink.Step(m);
  }
  CHECK_THAT(sink.Summary(), !Catch::Contains("predicted"));
  const std::string line = sink.Summary(0.08);
  CHECK_THAT(line, Catch::StartsWith("trained 30 steps: final loss 3.0000, "));
  CHECK_THAT(line, Catch::Contains("; a step 0.1000 s measured (median of the last 20) vs 0.0800 s predicted by ob-plan (1.25x)"));
  // A plan priced for an H100 and run on the CPU: its 95x said nothing.
  const std::string other = sink.Summary(0.0006, "h100 (NVIDIA H100 SXM5 80GB), not this run's cpu");
  CHECK_THAT(other, Catch::EndsWith("; a step 0.1000 s measured (median of the last 20); ob-plan's 0.0006 s was for "
                                    "h100 (NVIDIA H100 SXM5 80GB), not this run's cpu"));
  CHECK_THAT(other, !Catch::Contains("x)"));
}

TEST_CASE("a resumed run's closing line says how many of its steps this run trained") {
  ob::launch::MetricsSink sink(nullptr);
  sink.set_total_steps(35);
  for (uint64_t s = 25; s < 35; ++s) {  // resumed after step 24
    ob::pb::Metrics m;
    m.set_rank(0);
    m.set_step(s);
    m.set_loss(3.0);
    m.set_tokens_per_second(1000);
    m.set_step_seconds(0.1);
    sink.Step(m);
  }
  CHECK(sink.Summary() ==
        "trained 35 steps: final loss 3.0000, 1000 tokens/s over the 10 steps of this run (resumed after step 24)");
}


TEST_CASE("a --metrics that stops taking records says, at the end, from which step they are missing") {
  ob::launch::MetricsSink sink(nullptr);
  REQUIRE(sink.Open("/dev/full").ok());  // a device: written through, every write ENOSPC
  CHECK(sink.lost().empty());
  ob::pb::Metrics m;
  m.set_step(7);
  sink.Publish(m);
  CHECK_THAT(sink.lost(), Catch::StartsWith("--metrics lacks the records from step 7 on: "));
  m.set_step(8);
  sink.Publish(m);  // no more writes, and the first loss stays the one said
  CHECK_THAT(sink.lost(), Catch::StartsWith("--metrics lacks the records from step 7 on: "));
}

TEST_CASE("an events.log that stops taking lines says, at the end, how many it lacks and from when") {
  ob::launch::EventLog full;
  REQUIRE(full.Open("/dev/full").ok());  // every write ENOSPC, as on a full disk
  CHECK(full.lost().empty());
  full.Write("listen", "127.0.0.1:1");
  full.Write("done", "exit 0");
  CHECK_THAT(full.lost(), Catch::StartsWith("/dev/full lacks 2 of its 2 lines, the first at 20"));
  CHECK_THAT(full.lost(), Catch::EndsWith(": No space left on device"));

  const std::string path = TempPath("events.log");
  ob::launch::EventLog fine;
  REQUIRE(fine.Open(path).ok());
  fine.Write("listen", "127.0.0.1:1");
  CHECK(fine.lost().empty());
  ::unlink(path.c_str());
}

TEST_CASE("a recovery's teardown is measured on the master's clock, whatever the host's") {
  // A host two minutes ahead: its worker started 50 ms before its first
  // step's record, which arrives now. Its own clock made the teardown two
  // minutes long.
  for (const int64_t skew : {int64_t{120000}, int64_t{-120000}, int64_t{0}}) {
    INFO("skew " << skew);
    ob::launch::RecoveryClock rc;
    rc.Detected(0);
    rc.Decided();
    rc.Started();
    ob::pb::Metrics m;
    m.set_generation(2);
    m.set_step(10);
    m.set_unix_ms(ob::UnixMs() + skew);
    m.set_process_start_unix_ms(m.unix_ms() - 50);
    m.set_ready_unix_ms(m.unix_ms() - 20);
    const std::string line = rc.FirstStep(m, 2, 1);
    const size_t at = line.find(" teardown_ms=");
    REQUIRE(at != std::string::npos);
    const long teardown = std::stol(line.substr(at + 13));
    CHECK(teardown < 5000);
    CHECK(line.find(" regroup_ms=30 ") != std::string::npos);
  }
}
