// The standby seed's two ends (launch/agent/standby_seed.h) without a worker
// program: the seed is a process forked from this test, in ServeSeed, and
// the agent's end is StandbySeed::Fork, as the agent calls it. What the
// process test launch_seed cannot make: requests that are not ones, a seed
// with a thread, an environment too large, a parent that is no subreaper.
// The standbys write their command lines and environments into blocks of
// this test's memory, not over the test's own /proc/self/cmdline.
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "ob/io/file.h"
#include "ob/launch/agent/standby_seed.h"

using ob::launch::SeedRequest;
using ob::launch::StandbySeed;

namespace {

// Everything readable from `fd` until end of file, within `ms`.
std::string ReadAll(int fd, int ms) {
  std::string s;
  (void)ob::io::ReadFor(fd, ms, 1 << 20, &s);
  return s;
}

struct ForkedSeed {
  StandbySeed seed;
  int raw = -1;  // a second descriptor of our end of its socket
  ~ForkedSeed() {
    if (raw >= 0) ::close(raw);
  }
};

// The seed's argument and environment blocks, as a seed started by the
// agent has them (its own flag and 256 bytes of environment), or `args`.
char g_args[64];
char g_env[256];
ob::launch::StringBlocks Blocks(const std::string& args = std::string("ob-launch-worker\0--seed-standby-workers", 39)) {
  std::memset(g_args, 0, sizeof g_args);
  std::memset(g_env, 'e', sizeof g_env);
  std::memcpy(g_args, args.data(), args.size());
  auto at = [](char* p) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)); };
  return {at(g_args), at(g_args) + args.size() + 1, at(g_env), at(g_env) + sizeof g_env};
}

// A seed forked from this process (with a second thread when `thread`);
// each standby it forks runs `standby` and exits with what it returns.
// Returns once the seed has said it is ready.
void ForkSeed(ForkedSeed* f, bool thread, const std::function<int(const SeedRequest&)>& standby,
              ob::launch::StringBlocks blocks = Blocks()) {
  int sv[2], out[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::setpgid(0, 0);
    ::close(sv[0]);
    ::close(out[0]);
    ::dup2(out[1], STDOUT_FILENO);
    if (thread) std::thread([] { ::sleep(30); }).detach();
    SeedRequest r;
    ob::Result<bool> forked = ob::launch::ServeSeed(sv[1], &r, &blocks);
    if (forked.ok() && *forked) ::_exit(standby(r));
    ::_exit(forked.ok() ? 0 : 2);
  }
  ::setpgid(pid, pid);
  ::close(sv[1]);
  ::close(out[1]);
  f->raw = ::dup(sv[0]);
  f->seed = StandbySeed::Adopt(ob::cluster::ChildProcess::Adopt(pid, -1, out[0]), sv[0]);
  char c = 0;
  pollfd p{f->seed.ready_fd(), POLLIN, 0};
  REQUIRE(::poll(&p, 1, 5000) == 1);
  REQUIRE(::read(f->seed.ready_fd(), &c, 1) == 1);
  REQUIRE(c == 'R');
}

// The seed's answer to a raw message: "" for a pid, else why not.
std::string Answer(int sock, const std::string& message) {
  REQUIRE(::send(sock, message.data(), message.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(message.size()));
  pollfd p{sock, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 5000) == 1);
  char reply[512];
  ssize_t n = ::recv(sock, reply, sizeof reply, 0);
  REQUIRE(n >= static_cast<ssize_t>(sizeof(int64_t)));
  int64_t pid;
  std::memcpy(&pid, reply, sizeof pid);
  return pid > 0 ? "" : std::string(reply + sizeof pid, static_cast<size_t>(n) - sizeof pid);
}

std::string Header(uint32_t count, uint32_t present) {
  std::string m = "OBS1";
  m.append(reinterpret_cast<const char*>(&count), sizeof count);
  m.append(reinterpret_cast<const char*>(&present), sizeof present);
  return m;
}

int NoStandby(const SeedRequest&) { return 3; }

// Sets this process's child-subreaper flag for a scope.
struct Subreaper {
  Subreaper() { REQUIRE(::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0); }
  ~Subreaper() { ::prctl(PR_SET_CHILD_SUBREAPER, 0); }
};

}  // namespace

TEST_CASE("the standby seed answers what is not a request with why, and keeps serving") {
  ForkedSeed f;
  ForkSeed(&f, false, NoStandby);
  CHECK(Answer(f.raw, "hello") == "not a request");
  CHECK(Answer(f.raw, Header(5, 0)) == "a bad descriptor list");     // more than kMaxPassedFds
  CHECK(Answer(f.raw, Header(2, 4)) == "a bad descriptor list");     // bit 2 of a list of 2
  CHECK(Answer(f.raw, Header(1, 1)) == "descriptors missing");       // none came with it
  CHECK(Answer(f.raw, Header(0, 0) + "A=b") == "descriptors missing");  // stdin and stdout neither
  // An environment string without its NUL, with stdin and stdout.
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  std::string m = Header(0, 0) + std::string("A=b\0C=d", 7);
  iovec iov{m.data(), m.size()};
  alignas(cmsghdr) char ctl[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr h{};
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  h.msg_control = ctl;
  h.msg_controllen = sizeof ctl;
  cmsghdr* c = CMSG_FIRSTHDR(&h);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(2 * sizeof(int));
  std::memcpy(CMSG_DATA(c), p, sizeof p);
  REQUIRE(::sendmsg(f.raw, &h, MSG_NOSIGNAL) == static_cast<ssize_t>(m.size()));
  pollfd w{f.raw, POLLIN, 0};
  REQUIRE(::poll(&w, 1, 5000) == 1);
  char reply[512];
  ssize_t n = ::recv(f.raw, reply, sizeof reply, 0);
  REQUIRE(n > 8);
  CHECK(std::string(reply + 8, static_cast<size_t>(n) - 8) == "an unterminated environment string");
  ::close(p[0]);
  ::close(p[1]);
  // Still serving: an environment larger than the seed's own is refused
  // by the agent's end too, as an error naming both sizes.
  auto child = f.seed.Fork({"BIG=" + std::string(300, 'x')}, {}, 5000);
  REQUIRE_FALSE(child.ok());
  CHECK_THAT(child.status().message(), Catch::Contains("the standby's environment (305 bytes) outgrows the seed's (256)"));
  CHECK(f.seed.Exited(0).empty());
}

namespace {

// Why a seed (with a second thread when `thread`) refuses a small request.
std::string Refusal(bool thread, ob::launch::StringBlocks blocks = Blocks()) {
  ForkedSeed f;
  ForkSeed(&f, thread, NoStandby, blocks);
  auto child = f.seed.Fork({"A=b"}, {}, 5000);
  REQUIRE_FALSE(child.ok());
  return child.status().message();
}

}  // namespace

TEST_CASE("a standby seed refuses to fork with a second thread, without room, or with no subreaper above") {
  CHECK_THAT(Refusal(true), Catch::Contains("the seed runs 2 threads: forking it is unsafe"));
  CHECK_THAT(Refusal(false, Blocks(std::string("ob\0-x", 5))), Catch::Contains("no room for the standby's command line"));
  // This test is no subreaper: the standby went to another process, and
  // the seed killed it.
  CHECK_THAT(Refusal(false), Catch::Contains("the agent is not a child subreaper"));
}

TEST_CASE("a standby forked from the seed has its environment, descriptors and command line") {
  Subreaper subreaper;
  ForkedSeed f;
  ForkSeed(&f, false, [](const SeedRequest& r) {
    ob::Status st = ob::launch::BecomeStandby(r);
    if (!st.ok()) return 4;
    // Its blocks, as /proc/self/cmdline and environ would show them.
    std::string cmdline(g_args, sizeof g_args), env(g_env, sizeof g_env);
    for (char& c : cmdline) c = c == '\0' ? ' ' : c;
    for (char& c : env) c = c == '\0' ? ' ' : c;
    const char* x = std::getenv("OB_TEST_X");
    std::string said = std::string("x=") + (x ? x : "-") + "\ncmdline=" + cmdline + "\nenviron=" + env + "\n";
    (void)!::write(STDOUT_FILENO, said.data(), said.size());
    (void)!::write(ob::cluster::kPassedFd + 1, "via4", 4);  // descriptor 3 was not passed
    const bool three_closed = ::fcntl(ob::cluster::kPassedFd, F_GETFD) < 0;
    char c;
    while (::read(STDIN_FILENO, &c, 1) > 0) {
    }
    return three_closed ? 0 : 5;
  });
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  auto child = f.seed.Fork({"OB_TEST_X=hello", "PATH=/usr/bin"}, {-1, p[1]}, 5000);
  ::close(p[1]);
  REQUIRE(child.ok());
  const std::string said = ReadAll(child->stdout_fd(), 2000);
  CHECK_THAT(said, Catch::Contains("x=hello\n"));
  CHECK_THAT(said, Catch::Contains("cmdline=ob-launch-worker --standby-worker      "));
  CHECK_THAT(said, Catch::Contains("environ=OB_TEST_X=hello PATH=/usr/bin    "));
  CHECK(ReadAll(p[0], 2000) == "via4");
  ::close(p[0]);
  child->CloseStdin();
  CHECK(child->WaitFor(5) == 0);
  CHECK(f.seed.Exited(0).empty());  // it serves on
}
