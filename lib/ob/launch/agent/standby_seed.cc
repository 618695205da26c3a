#include "ob/launch/agent/standby_seed.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <utility>

#include "ob/io/file.h"

namespace ob::launch {
namespace {

constexpr char kMagic[4] = {'O', 'B', 'S', '1'};
constexpr size_t kRoomBytes = 8192;       // the seed's reserve for a standby's environment
constexpr size_t kMaxRequestBytes = 1 << 18;
constexpr int kMaxFds = 2 + static_cast<int>(cluster::kMaxPassedFds);
constexpr char kStandbyFlag[] = "--standby-worker";

bool IsThreadVar(const std::string& kv) {
  for (const char* v : {"OMP_NUM_THREADS=", "OPENBLAS_NUM_THREADS=", "MKL_NUM_THREADS="}) {
    if (kv.rfind(v, 0) == 0) return true;
  }
  return false;
}

void CloseAll(const std::vector<int>& fds) {
  for (int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
}

// Fields 3.. of /proc/PID/stat (after the command name), or empty.
std::vector<std::string> StatFields(const std::string& pid) {
  auto text = io::ReadFile("/proc/" + pid + "/stat");
  if (!text.ok()) return {};
  size_t close = text->rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream in(text->substr(close + 1));
  std::vector<std::string> f;
  std::string x;
  while (in >> x) f.push_back(x);
  return f;
}
// Field `n` (1-based, as proc(5) numbers them) of a StatFields list.
uint64_t StatField(const std::vector<std::string>& f, size_t n) {
  return n >= 3 && n - 3 < f.size() ? std::strtoull(f[n - 3].c_str(), nullptr, 10) : 0;
}

int Threads() {
  auto text = io::ReadFile("/proc/self/status");
  if (!text.ok()) return -1;
  size_t at = text->find("\nThreads:");
  return at == std::string::npos ? -1 : std::atoi(text->c_str() + at + 9);
}

size_t Bytes(const std::vector<std::string>& strings) {
  size_t n = 0;
  for (const auto& s : strings) n += s.size() + 1;
  return n;
}

// Writes `strings` (each NUL-terminated) over [start, end) of our memory
// and zeroes the rest: what /proc/self/cmdline or environ then shows.
void Overwrite(uint64_t start, uint64_t end, const std::vector<std::string>& strings) {
  char* p = reinterpret_cast<char*>(start);
  char* const stop = reinterpret_cast<char*>(end);
  for (const auto& s : strings) {
    std::memcpy(p, s.c_str(), s.size() + 1);
    p += s.size() + 1;
  }
  std::memset(p, 0, static_cast<size_t>(stop - p));
}

void Reply(int sock, int64_t pid, const std::string& why) {
  std::string m(reinterpret_cast<const char*>(&pid), sizeof pid);
  m += why.substr(0, 400);
  (void)::send(sock, m.data(), m.size(), MSG_NOSIGNAL);
}

}  // namespace

// --- the agent's end -------------------------------------------------------

Result<StandbySeed> StandbySeed::Start(const std::string& exe, std::vector<std::string> env) {
  std::vector<std::string> seed_env;
  for (auto& kv : env) {
    if (!IsThreadVar(kv) && kv.rfind(std::string(kSeedRoomVar) + "=", 0) != 0) seed_env.push_back(std::move(kv));
  }
  for (const char* v : {"OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1", "MKL_NUM_THREADS=1"}) seed_env.emplace_back(v);
  seed_env.push_back(std::string(kSeedRoomVar) + "=" + std::string(kRoomBytes, '.'));
  const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null < 0) return Status::Unavailable("/dev/null: " + io::Errno());
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    const std::string e = io::Errno();
    ::close(null);
    return Status::Unavailable("cannot create the seed's socket: " + e);
  }
  std::vector<int> pass(cluster::kMaxPassedFds, null);
  pass[0] = sv[1];
  Result<cluster::ChildProcess> child = cluster::SpawnWithPipes({exe, kSeedFlag}, &seed_env, pass);
  ::close(sv[1]);
  ::close(null);
  if (!child.ok()) {
    ::close(sv[0]);
    return child.status();
  }
  cluster::ChildProcess proc = std::move(child).value();
  proc.CloseStdin();
  return Adopt(std::move(proc), sv[0]);
}

StandbySeed StandbySeed::Adopt(cluster::ChildProcess proc, int sock) {
  StandbySeed s;
  s.proc_ = std::move(proc);
  s.sock_ = sock;
  return s;
}

StandbySeed::StandbySeed(StandbySeed&& o) noexcept { *this = std::move(o); }

StandbySeed& StandbySeed::operator=(StandbySeed&& o) noexcept {
  if (this != &o) {
    Stop();
    proc_ = std::move(o.proc_);
    sock_ = std::exchange(o.sock_, -1);
  }
  return *this;
}

StandbySeed::~StandbySeed() { Stop(); }

void StandbySeed::Stop() {
  if (sock_ >= 0) ::close(sock_);
  sock_ = -1;
  proc_.Kill();
  proc_.Wait();
}

std::string StandbySeed::Exited(double wait_s) {
  if (proc_.pid() <= 0) return "";
  proc_.WaitFor(wait_s);
  return proc_.running() ? "" : proc_.DescribeExit();
}

Result<cluster::ChildProcess> StandbySeed::Fork(const std::vector<std::string>& env,
                                                const std::vector<int>& pass_fds, int timeout_ms) {
  if (sock_ < 0) return Status::Unavailable("the seed is stopped");
  if (pass_fds.size() > cluster::kMaxPassedFds) return Status::Internal("too many descriptors for a standby");
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return Status::Unavailable(std::string("cannot create pipe: ") + io::Errno());
  if (::pipe2(out, O_CLOEXEC) != 0) {
    const std::string e = io::Errno();
    CloseAll({in[0], in[1]});
    return Status::Unavailable("cannot create pipe: " + e);
  }
  // The request: magic, the passed descriptors' count and which are there,
  // then the environment's strings, each NUL-terminated.
  uint32_t head[2] = {static_cast<uint32_t>(pass_fds.size()), 0};
  std::vector<int> fds = {in[0], out[1]};
  for (size_t i = 0; i < pass_fds.size(); ++i) {
    if (pass_fds[i] < 0) continue;
    head[1] |= 1u << i;
    fds.push_back(pass_fds[i]);
  }
  std::string body(kMagic, sizeof kMagic);
  body.append(reinterpret_cast<const char*>(head), sizeof head);
  for (const auto& kv : env) body.append(kv.c_str(), kv.size() + 1);
  iovec iov{body.data(), body.size()};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctl;
  m.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  ssize_t sent;
  do {
    sent = ::sendmsg(sock_, &m, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  const std::string send_error = sent < 0 ? io::Errno() : "";
  CloseAll({in[0], out[1]});  // the seed has its copies (or none)
  auto fail = [&](const std::string& why) -> Result<cluster::ChildProcess> {
    CloseAll({in[1], out[0]});
    return Status::Unavailable("standby seed (pid " + std::to_string(proc_.pid()) + "): " + why);
  };
  if (sent < 0) return fail("cannot send it a request: " + send_error);
  pollfd p{sock_, POLLIN, 0};
  int ready;
  do {
    ready = ::poll(&p, 1, timeout_ms);
  } while (ready < 0 && errno == EINTR);
  if (ready <= 0) return fail("no answer in " + std::to_string(timeout_ms) + " ms");
  char reply[512];
  ssize_t n = ::recv(sock_, reply, sizeof reply, 0);
  if (n < static_cast<ssize_t>(sizeof(int64_t))) return fail(n == 0 ? "it closed its socket" : "a short answer");
  int64_t pid;
  std::memcpy(&pid, reply, sizeof pid);
  if (pid <= 0) return fail(std::string(reply + sizeof pid, static_cast<size_t>(n) - sizeof pid));
  return cluster::ChildProcess::Adopt(static_cast<pid_t>(pid), in[1], out[0]);
}

// --- the seed's end --------------------------------------------------------

namespace {

StringBlocks OwnBlocks() {
  const std::vector<std::string> f = StatFields("self");
  return {StatField(f, 48), StatField(f, 49), StatField(f, 50), StatField(f, 51)};
}

// Why a request cannot be forked now, or "".
std::string Unforkable(const SeedRequest& r) {
  const int threads = Threads();
  if (threads != 1) return "the seed runs " + std::to_string(threads) + " threads: forking it is unsafe";
  const StringBlocks& b = r.blocks;
  if (!b.ok()) return "/proc/self/stat shows no argument or environment block";
  const size_t argv0 = std::strlen(reinterpret_cast<const char*>(b.arg_start)) + 1;
  if (argv0 + sizeof kStandbyFlag > b.arg_end - b.arg_start) return "no room for the standby's command line";
  if (Bytes(r.env) > b.env_end - b.env_start) {
    return "the standby's environment (" + std::to_string(Bytes(r.env)) + " bytes) outgrows the seed's (" +
           std::to_string(b.env_end - b.env_start) + ")";
  }
  return "";
}

// The request in m's data and descriptors, or why it is not one.
std::string Parse(const char* data, size_t n, std::vector<int> fds, SeedRequest* r) {
  uint32_t head[2];
  if (n < sizeof kMagic + sizeof head || std::memcmp(data, kMagic, sizeof kMagic) != 0) return "not a request";
  std::memcpy(head, data + sizeof kMagic, sizeof head);
  if (head[0] > cluster::kMaxPassedFds || (head[1] >> head[0]) != 0) return "a bad descriptor list";
  size_t want = 2;
  for (uint32_t i = 0; i < head[0]; ++i) want += (head[1] >> i) & 1;
  if (fds.size() != want) return "descriptors missing";
  r->stdin_fd = fds[0];
  r->stdout_fd = fds[1];
  r->pass_fds.assign(head[0], -1);
  size_t next = 2;
  for (uint32_t i = 0; i < head[0]; ++i) {
    if ((head[1] >> i) & 1) r->pass_fds[i] = fds[next++];
  }
  r->env.clear();
  const char* p = data + sizeof kMagic + sizeof head;
  const char* end = data + n;
  while (p < end) {
    const void* nul = std::memchr(p, '\0', static_cast<size_t>(end - p));
    if (nul == nullptr) return "an unterminated environment string";
    r->env.emplace_back(p);
    p = static_cast<const char*>(nul) + 1;
  }
  return "";
}

}  // namespace

Result<bool> ServeSeed(int sock, SeedRequest* request, const StringBlocks* given) {
  const pid_t agent = ::getppid();
  const StringBlocks blocks = given != nullptr ? *given : OwnBlocks();
  if (::write(STDOUT_FILENO, "R", 1) != 1) return Status::IoErr("<stdout>: " + io::Errno());
  std::vector<char> buf(kMaxRequestBytes);
  for (;;) {
    iovec iov{buf.data(), buf.size()};
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * kMaxFds)];
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    ssize_t n = ::recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::IoErr("the agent's socket: " + io::Errno());
    std::vector<int> fds;
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < k; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        fds.push_back(fd);
      }
    }
    if (n == 0 && fds.empty()) return false;  // the agent is done with us
    SeedRequest r;
    r.blocks = blocks;
    std::string why = (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 ? "a request too large"
                                                                   : Parse(buf.data(), static_cast<size_t>(n), fds, &r);
    if (why.empty()) why = Unforkable(r);
    if (!why.empty()) {
      CloseAll(fds);
      Reply(sock, 0, why);
      continue;
    }
    r.seed_sock = sock;
    r.agent = agent;
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) {
      CloseAll(fds);
      Reply(sock, 0, "cannot create pipe: " + io::Errno());
      continue;
    }
    const pid_t middle = ::fork();
    if (middle == 0) {
      const pid_t standby = ::fork();
      if (standby == 0) {
        ::close(p[0]);
        ::close(p[1]);
        *request = std::move(r);
        return true;
      }
      if (standby > 0) ::setpgid(standby, standby);  // before the agent can signal its group
      ssize_t ignored = ::write(p[1], &standby, sizeof standby);
      (void)ignored;
      ::_exit(0);
    }
    const std::string fork_error = middle < 0 ? io::Errno() : "";
    ::close(p[1]);
    CloseAll(fds);
    pid_t standby = -1;
    if (middle > 0) {
      int status;
      while (::waitpid(middle, &status, 0) < 0 && errno == EINTR) {
      }
      if (::read(p[0], &standby, sizeof standby) != static_cast<ssize_t>(sizeof standby)) standby = -1;
    }
    ::close(p[0]);
    if (standby <= 0) {
      Reply(sock, 0, "cannot fork: " + (fork_error.empty() ? std::string("the middle process failed") : fork_error));
      continue;
    }
    // Its parent exited before waitpid returned: it is the agent's now,
    // or (no subreaper) init's, which is no use to the agent.
    const uint64_t parent = StatField(StatFields(std::to_string(standby)), 4);
    if (parent != static_cast<uint64_t>(agent)) {
      ::kill(standby, SIGKILL);
      Reply(sock, 0, "the standby went to pid " + std::to_string(parent) + ", not to the agent (pid " +
                         std::to_string(agent) + "): the agent is not a child subreaper");
      continue;
    }
    Reply(sock, standby, "");
  }
}

Status BecomeStandby(const SeedRequest& r) {
  ::setpgid(0, 0);
  for (int i = 0; i < 2000 && ::getppid() != r.agent; ++i) ::usleep(1000);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != r.agent) return Status::Unavailable("not adopted by the agent (pid " + std::to_string(r.agent) + ")");
  ::close(r.seed_sock);
  // Descriptors: stdin, stdout, then the passed ones at kPassedFd + i, each
  // first moved above the numbers they take (as SpawnWithPipes does).
  const int npass = static_cast<int>(r.pass_fds.size());
  const int above = cluster::kPassedFd + static_cast<int>(cluster::kMaxPassedFds);
  std::vector<int> moved;
  auto lift = [&](int fd) {
    if (fd < 0) return -1;
    int to = ::fcntl(fd, F_DUPFD_CLOEXEC, above);
    ::close(fd);
    moved.push_back(to);
    return to;
  };
  const int in = lift(r.stdin_fd), out = lift(r.stdout_fd);
  std::vector<int> pass;
  for (int fd : r.pass_fds) pass.push_back(lift(fd));
  if (in < 0 || out < 0 || ::dup2(in, STDIN_FILENO) < 0 || ::dup2(out, STDOUT_FILENO) < 0) {
    return Status::Unavailable("cannot install the standby's stdin and stdout: " + io::Errno());
  }
  for (int i = 0; i < static_cast<int>(cluster::kMaxPassedFds); ++i) {  // over the seed's socket and /dev/nulls
    if (i < npass && pass[static_cast<size_t>(i)] >= 0) {
      ::dup2(pass[static_cast<size_t>(i)], cluster::kPassedFd + i);
    } else {
      ::close(cluster::kPassedFd + i);
    }
  }
  CloseAll(moved);
  // The environment, then what /proc shows: our own command line and
  // environment where the seed's were (Unforkable checked the room).
  ::clearenv();
  for (const auto& kv : r.env) ::putenv(::strdup(kv.c_str()));
  const StringBlocks& b = r.blocks;  // the seed's, ours since the fork
  if (b.ok()) {
    const std::string argv0 = reinterpret_cast<const char*>(b.arg_start);
    Overwrite(b.arg_start, b.arg_end, {argv0, kStandbyFlag});
    Overwrite(b.env_start, b.env_end, r.env);
  }
  return Status::Ok();
}

}  // namespace ob::launch
