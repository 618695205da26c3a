#include "ob/cluster/rsh.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace ob::cluster {
namespace {

std::vector<std::string> SplitSpace(const std::string& s) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
    size_t start = i;
    while (i < s.size() && s[i] != ' ' && s[i] != '\t') ++i;
    if (i > start) words.push_back(s.substr(start, i - start));
  }
  return words;
}

bool IsSsh(const std::string& word) {
  size_t slash = word.rfind('/');
  return word.substr(slash == std::string::npos ? 0 : slash + 1) == "ssh";
}

// Quotes a word for a POSIX shell unless it is plainly safe.
std::string ShellWord(const std::string& w) {
  bool safe = !w.empty();
  for (char c : w) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              std::strchr("._-/=:,+@%", c) != nullptr;
    if (!ok) safe = false;
  }
  if (safe) return w;
  std::string out = "'";
  for (char c : w) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

}  // namespace

std::vector<std::string> RshArgv(const std::string& rsh, const Host& host,
                                 const std::vector<std::string>& command) {
  assert(!command.empty());
  std::vector<std::string> prefix = SplitSpace(rsh);
  if (prefix.empty() || (prefix.size() == 1 && prefix[0] == "local")) return command;
  if (prefix.size() == 1 && prefix[0] == "slurm") {
    // A step of one task on the host, inside the job's allocation,
    // overlapping the batch step and the other agents' (their CPUs are the
    // job's), unbound: the agent's workers share the node's cores.
    std::vector<std::string> argv = {"srun", "--overlap", "-N1", "-n1", "-w", host.name,
                                     "--kill-on-bad-exit=0", "--cpu-bind=none", "--quiet",
                                     "--job-name=ob-agent"};
    argv.insert(argv.end(), command.begin(), command.end());
    return argv;
  }
  bool ssh = IsSsh(prefix[0]);
  bool has_placeholder = false;
  std::vector<std::string> argv;
  for (size_t i = 0; i < prefix.size(); ++i) {
    std::string w = prefix[i];
    for (size_t at = w.find("{host}"); at != std::string::npos; at = w.find("{host}", at)) {
      w.replace(at, 6, host.name);
      at += host.name.size();
      has_placeholder = true;
    }
    argv.push_back(std::move(w));
    if (i == 0 && ssh) {
      argv.push_back("-o");
      argv.push_back("BatchMode=yes");
      argv.push_back("-o");
      argv.push_back("ConnectTimeout=10");
    }
  }
  if (!has_placeholder) argv.push_back(host.name);
  for (const auto& c : command) argv.push_back(ssh ? ShellWord(c) : c);
  return argv;
}

ChildProcess::ChildProcess(ChildProcess&& o) noexcept { *this = std::move(o); }

ChildProcess& ChildProcess::operator=(ChildProcess&& o) noexcept {
  if (this != &o) {
    Kill();
    Wait();
    CloseFds();
    pid_ = o.pid_;
    reaped_ = o.reaped_;
    status_ = o.status_;
    wait_status_ = o.wait_status_;
    stdin_fd_ = o.stdin_fd_;
    stdout_fd_ = o.stdout_fd_;
    o.pid_ = -1;
    o.reaped_ = false;
    o.stdin_fd_ = o.stdout_fd_ = -1;
  }
  return *this;
}

ChildProcess::~ChildProcess() {
  Kill();
  Wait();
  CloseFds();
}

void ChildProcess::CloseFds() {
  CloseStdin();
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
  stdout_fd_ = -1;
}

void ChildProcess::CloseStdin() {
  if (stdin_fd_ >= 0) ::close(stdin_fd_);
  stdin_fd_ = -1;
}

void ChildProcess::Terminate() {
  if (!running()) return;
  if (::kill(-pid_, SIGTERM) != 0) ::kill(pid_, SIGTERM);
}

void ChildProcess::Kill() {
  if (!running()) return;
  // The child leads its own group; kill(-pid) reaches what it started too.
  if (::kill(-pid_, SIGKILL) != 0) ::kill(pid_, SIGKILL);
}

static int DecodeStatus(int ws) {
  if (WIFEXITED(ws)) return WEXITSTATUS(ws);
  if (WIFSIGNALED(ws)) return 128 + WTERMSIG(ws);
  return -1;
}

int ChildProcess::Wait() {
  if (pid_ <= 0) return -1;
  if (reaped_) return status_;
  int ws = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &ws, 0);
  } while (r < 0 && errno == EINTR);
  reaped_ = true;
  wait_status_ = r == pid_ ? ws : -1;
  status_ = r == pid_ ? DecodeStatus(ws) : -1;
  return status_;
}

int ChildProcess::WaitFor(double timeout_s) {
  if (pid_ <= 0) return -1;
  if (reaped_) return status_;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    int ws = 0;
    pid_t r = ::waitpid(pid_, &ws, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      wait_status_ = ws;
      status_ = DecodeStatus(ws);
      return status_;
    }
    if (r < 0 && errno != EINTR) {
      reaped_ = true;  // not our child any more (e.g. reaped elsewhere)
      return status_ = -1;
    }
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string ChildProcess::DescribeExit() const {
  if (!reaped_ || wait_status_ < 0) return "still running or unknown";
  if (WIFEXITED(wait_status_)) return "exit status " + std::to_string(WEXITSTATUS(wait_status_));
  if (WIFSIGNALED(wait_status_)) return "killed by signal " + std::to_string(WTERMSIG(wait_status_));
  return "stopped";
}

ChildProcess ChildProcess::Adopt(pid_t pid, int stdin_fd, int stdout_fd) {
  ChildProcess child;
  child.pid_ = pid;
  child.stdin_fd_ = stdin_fd;
  child.stdout_fd_ = stdout_fd;
  return child;
}

Result<ChildProcess> SpawnWithPipes(const std::vector<std::string>& argv,
                                    const std::vector<std::string>* env,
                                    const std::vector<int>& pass_fds) {
  assert(!argv.empty());
  assert(pass_fds.size() <= kMaxPassedFds);
  int passed[kMaxPassedFds];  // copied now: no allocation in the child
  const int npassed = static_cast<int>(pass_fds.size());
  for (int i = 0; i < npassed; ++i) passed[i] = pass_fds[static_cast<size_t>(i)];
  int in_pipe[2], out_pipe[2], err_pipe[2];
  if (::pipe2(in_pipe, O_CLOEXEC) != 0) {
    return Status::Unavailable(std::string("cannot create pipe: ") + std::strerror(errno));
  }
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    int e = errno;
    ::close(in_pipe[0]);
    ::close(in_pipe[1]);
    return Status::Unavailable(std::string("cannot create pipe: ") + std::strerror(e));
  }
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    int e = errno;
    for (int fd : {in_pipe[0], in_pipe[1], out_pipe[0], out_pipe[1]}) ::close(fd);
    return Status::Unavailable(std::string("cannot create pipe: ") + std::strerror(e));
  }
  // Build argv before fork: no allocation in the child.
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::vector<char*> cenv;
  if (env != nullptr) {
    for (const auto& e : *env) cenv.push_back(const_cast<char*>(e.c_str()));
    cenv.push_back(nullptr);
  }
  pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    for (int fd : {in_pipe[0], in_pipe[1], out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) {
      ::close(fd);
    }
    return Status::Unavailable(std::string("cannot fork: ") + std::strerror(e));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // parent already gone
    // Restore default dispositions a parent may have changed (e.g. SIGPIPE ignored).
    ::signal(SIGPIPE, SIG_DFL);
    ::dup2(in_pipe[0], 0);   // dup2 clears close-on-exec on the copies
    ::dup2(out_pipe[1], 1);
    // Everything that must survive is first moved above the numbers the
    // passed descriptors take, so no dup2 below overwrites a source still
    // needed; the copies are close-on-exec, the dup2'd targets are not.
    const int above = kPassedFd + npassed;
    int err_fd = err_pipe[1];
    if (err_fd >= kPassedFd && err_fd < above) err_fd = ::fcntl(err_fd, F_DUPFD_CLOEXEC, above);
    for (int i = 0; i < npassed; ++i) {
      if (passed[i] >= 0) passed[i] = ::fcntl(passed[i], F_DUPFD_CLOEXEC, above);
    }
    for (int i = 0; i < npassed; ++i) {
      if (passed[i] >= 0) ::dup2(passed[i], kPassedFd + i);
    }
    if (env != nullptr) {
      ::execvpe(cargv[0], cargv.data(), cenv.data());
    } else {
      ::execvp(cargv[0], cargv.data());
    }
    int e = errno;
    ssize_t ignored = ::write(err_fd, &e, sizeof e);
    (void)ignored;
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so Kill() works even before the child ran
  ::close(in_pipe[0]);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);

  ChildProcess child;
  child.pid_ = pid;
  child.stdin_fd_ = in_pipe[1];
  child.stdout_fd_ = out_pipe[0];

  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(err_pipe[0], &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  ::close(err_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof child_errno)) {
    child.Wait();
    return Status::Unavailable("cannot run '" + argv[0] + "': " + std::strerror(child_errno));
  }
  return child;
}

}  // namespace ob::cluster
