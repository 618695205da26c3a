// The standby seed: one process per agent that has loaded the worker
// program (LibTorch and its ~300 shared libraries) and nothing else, from
// which the agent's standby workers are forked rather than started anew.
// Loading costs a worker process 0.65 s of CPU on a 2-core test VM (the
// dynamic linker's relocations and LibTorch's operator registration); a
// fork from the seed costs milliseconds, so a recovery's replacement
// standbys no longer take CPU from the workers that train.
//
// The seed is `ob-launch-worker --seed-standby-workers`, started by the
// agent with a SOCK_SEQPACKET socket at descriptor 3. It writes one byte to
// its stdout when loaded, then serves requests until the socket closes.
// A request is the standby's whole environment and its descriptors
// (SCM_RIGHTS): its stdin, its stdout and the worker's passed descriptors
// (cluster::SpawnWithPipes's kPassedFd + i). The seed forks twice: the
// middle process puts the standby in a process group of its own and exits,
// so the standby is reparented to the agent, which is a child subreaper
// (PR_SET_CHILD_SUBREAPER) and reaps it like any child it spawned. The
// reply is the standby's pid.
//
// Forking is safe only from a process with one thread: the seed checks
// that before every fork (its environment sets the OpenMP and BLAS pools
// to one thread, so loading starts none) and refuses otherwise. The forked
// standby then takes its environment, sizes the pools from it (the
// libraries read their variables when they load, in the seed), and shows
// its own command line ("--standby-worker") and environment in /proc, as a
// standby started by exec does. Every failure of the seed is the agent's
// cue to start standbys by exec, as it does without one.
#pragma once

#include <sys/types.h>

#include <cstdint>

#include <string>
#include <vector>

#include "ob/cluster/rsh.h"
#include "ob/status.h"

namespace ob::launch {

inline constexpr char kSeedFlag[] = "--seed-standby-workers";
// The environment variable that reserves room in the seed's environment
// block for a standby's own (its value is padding).
inline constexpr char kSeedRoomVar[] = "OB_SEED_ROOM";

// The agent's end: the seed process and its socket.
class StandbySeed {
 public:
  // Starts `exe --seed-standby-workers` with environment `env` (the
  // pools' thread variables set to 1, room reserved), its socket at
  // descriptor kPassedFd and /dev/null holding the numbers after it, so
  // that nothing the seed loads opens one a standby's descriptor takes.
  static Result<StandbySeed> Start(const std::string& exe, std::vector<std::string> env);

  // A seed its caller started (a test's forked process in ServeSeed):
  // `proc` with its stdout, `sock` our end of its socket; both now ours.
  static StandbySeed Adopt(cluster::ChildProcess proc, int sock);

  StandbySeed() = default;
  StandbySeed(StandbySeed&& o) noexcept;
  StandbySeed& operator=(StandbySeed&& o) noexcept;
  ~StandbySeed();

  pid_t pid() const { return proc_.pid(); }
  const cluster::ChildProcess& proc() const { return proc_; }
  // Readable with one byte once the seed has loaded; end of file when it
  // died.
  int ready_fd() const { return proc_.stdout_fd(); }
  // A standby forked from the seed with environment `env` and
  // `pass_fds[i]` (>= 0) as its descriptor kPassedFd + i, as
  // cluster::SpawnWithPipes gives them; waits up to `timeout_ms` for the
  // seed's answer. The caller keeps its own descriptors.
  Result<cluster::ChildProcess> Fork(const std::vector<std::string>& env, const std::vector<int>& pass_fds,
                                     int timeout_ms);
  // SIGKILL to the seed and reaped; a later Fork fails.
  void Stop();
  // "exit status 1", "killed by signal 9" once it has exited (waiting up
  // to `wait_s` for that: its stdout closes a moment before it can be
  // reaped), else "".
  std::string Exited(double wait_s);

 private:
  cluster::ChildProcess proc_;
  int sock_ = -1;
};

// The seed's end. Where the kernel keeps a process's argument and
// environment strings (fields 48-51 of /proc/PID/stat): /proc/PID/cmdline
// and environ read them there. Fixed for the life of the process.
struct StringBlocks {
  uint64_t arg_start = 0, arg_end = 0, env_start = 0, env_end = 0;
  bool ok() const { return arg_end > arg_start && env_end > env_start; }
};

// What a forked standby gets from its request.
struct SeedRequest {
  std::vector<std::string> env;
  int stdin_fd = -1, stdout_fd = -1;
  std::vector<int> pass_fds;  // -1: that number stays unused
  int seed_sock = -1;         // the seed's socket, closed in the standby
  pid_t agent = -1;           // the seed's parent, the standby's to be
  StringBlocks blocks;        // the seed's, so the standby's after the fork
};

// Serves requests on `sock` (the seed's descriptor 3) after writing the
// ready byte to stdout. Returns true in a forked standby, with *request
// filled; false in the seed when the agent closed the socket (the seed
// exits 0); an error when the socket fails. The standbys' command lines
// and environments go where `blocks` says; nullptr: where /proc shows
// this process's (a test gives memory of its own).
Result<bool> ServeSeed(int sock, SeedRequest* request, const StringBlocks* blocks = nullptr);

// In the forked standby: waits until the agent has adopted it (and dies
// with it from then on), installs its descriptors and environment, and
// rewrites its /proc command line and environment to its own. Returns an
// error only when it cannot be the standby (the agent is gone).
Status BecomeStandby(const SeedRequest& request);

}  // namespace ob::launch
