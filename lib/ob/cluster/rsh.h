// Remote start: how a command is run on a host (design/launch.md), and a child
// process with pipes to it.
//
// RshArgv builds the argv without a shell: "local" runs the command here;
// anything else is a prefix command split on whitespace, followed by the host
// name (or with every "{host}" in it replaced by the name), then the command.
// For ssh the command words are single-quoted where needed, because sshd
// joins them and hands them to the remote user's shell.
//
// ChildProcess owns a forked child: its pid (leader of a new process group),
// the write end of its stdin and the read end of its stdout (stderr is
// inherited). The child gets SIGKILL when the thread that spawned it exits
// (PR_SET_PDEATHSIG), so spawn from a thread that outlives the child. The
// destructor kills the process group and reaps the child, so nothing is
// orphaned on any path. Not thread-safe: one owner at a time; movable.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "ob/cluster/hosts.h"
#include "ob/status.h"

namespace ob::cluster {

// argv for running `command` on `host` through `rsh` ("local", "ssh",
// "slurm", "ip netns exec", "srun -w {host} --", ...). "slurm" is a step of
// one task on the host inside the current allocation: `srun --overlap -N1
// -n1 -w HOST --kill-on-bad-exit=0 --cpu-bind=none --quiet
// --job-name=ob-agent COMMAND`. Plain "ssh ..." gets
// "-o BatchMode=yes -o ConnectTimeout=10" after the ssh word so a password
// prompt never hangs a run and an unreachable host fails in seconds (the
// master names every host whose agent exits before connecting).
// REQUIRES: command is not empty.
std::vector<std::string> RshArgv(const std::string& rsh, const Host& host,
                                 const std::vector<std::string>& command);

class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();  // Kill() then Wait()

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !reaped_; }
  int stdin_fd() const { return stdin_fd_; }    // write end; -1 once closed
  int stdout_fd() const { return stdout_fd_; }  // read end; -1 once closed

  // Closes our end of the child's stdin (the child sees end of file).
  void CloseStdin();
  // SIGKILL to the child's process group; no-op once reaped.
  void Kill();
  // SIGTERM to the child's process group (srun then ends its step
  // cleanly); no-op once reaped.
  void Terminate();
  // Waits for the child and returns its exit status, or 128 + signal number;
  // returns the remembered status when already reaped.
  int Wait();
  // Like Wait() but gives up after `timeout_s`, returning -1 if still running.
  int WaitFor(double timeout_s);
  // After a successful Wait/WaitFor: "exit status 255", "killed by signal 9".
  std::string DescribeExit() const;

  // Takes on a child not spawned by SpawnWithPipes (launch/agent/standby_seed.h:
  // a grandchild reparented to us as subreaper), with the write end of its
  // stdin and the read end of its stdout, which it now owns.
  // REQUIRES: `pid` is our child and leads its own process group.
  static ChildProcess Adopt(pid_t pid, int stdin_fd, int stdout_fd);

 private:
  friend Result<ChildProcess> SpawnWithPipes(const std::vector<std::string>& argv,
                                             const std::vector<std::string>* env,
                                             const std::vector<int>& pass_fds);
  void CloseFds();

  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = -1;       // decoded as Wait() returns it
  int wait_status_ = -1;  // raw, from waitpid; -1 when unknown
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
};

// fork + execvp(argv[0]) with stdin/stdout connected to pipes. kUnavailable
// "cannot run 'X': No such file or directory" when exec fails (reported back
// through a close-on-exec pipe, so the failure is known before this returns).
// With `env` (KEY=VALUE strings), that is the child's whole environment;
// without it the child inherits ours. `pass_fds[i]` >= 0 becomes the
// child's descriptor kPassedFd + i (3, 4, ...; -1 leaves that number
// unused); the child gets no other descriptor of ours beyond 0-2 as long as
// ours are close-on-exec.
// REQUIRES: argv is not empty; at most kMaxPassedFds descriptors.
inline constexpr int kPassedFd = 3;
inline constexpr size_t kMaxPassedFds = 4;
Result<ChildProcess> SpawnWithPipes(const std::vector<std::string>& argv,
                                    const std::vector<std::string>* env = nullptr,
                                    const std::vector<int>& pass_fds = {});

}  // namespace ob::cluster
