// The flags of ob-launch and of ob-launch-worker, one set for both: the
// master takes them from people and passes the workers' on to them on
// their command lines (WorkerCommand, main.cc), which ob-launch-worker
// parses with the same Setup.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ob/cli/cli.h"
#include "ob/launch/agent/agent.h"
#include "ob/launch/master/master.h"
#include "ob/launch/worker/worker.h"

namespace ob::launch_tool {

// The flags bind straight into the options of the role that uses them; the
// master passes the workers' own to them on their command lines.
struct Options {
  ob::launch::MasterOptions master;
  ob::launch::WorkerOptions worker;  // steps, data, lr, warm-up, seed, checkpoints
  ob::launch::AgentOptions agent;
  std::vector<std::string> inject;
  std::string agent_exe;  // ob-launch's path on the hosts (default: this one's)
  std::vector<std::string> log_flags;  // -v or -q, passed on to agents and workers
  std::string standby = "on";  // --standby: each agent keeps a standby worker per slot
  std::string probe_port = "9";  // --probe-port (peer_probe.h ParseProbePort)
  // Hidden: the roles ob-launch starts itself (--agent) and those of
  // ob-launch-worker (--worker, --probe).
  bool as_agent = false, as_worker = false, probe = false;
  Options() {
    worker.steps = 100;
    worker.rank = -1;
  }
};

extern Options g;

void Setup(CLI::App& app);
// The sections of ob-launch's --config files (ob-launch(1) CONFIGURATION
// FILE): optimizer (--lr, --warmup-steps, ...), eval (--eval-*) and ckpt
// (--ckpt-*); every other option is a key of its own name.
ob::cli::ConfigSpec ConfigFileSpec();
// The files a run reads, and --metrics, which it writes.
std::vector<ob::cli::NamedFile> Reads();

// `path` made absolute (realpath where it exists); "", "-" and absolute
// paths as given.
std::string Absolute(const std::string& path);
// A --data or --eval-data spec with its files made absolute (a blend's each).
std::string AbsoluteData(const std::string& spec);
// A double as text that reads back to the same value.
std::string Exact(double v);
// This process's executable (/proc/self/exe).
std::string SelfExe();
// Which build agents and the master are (Hello.build).
std::string BuildId();

// The worker program: ob-launch-worker, in the directory of `launch_exe`
// (ob-launch's path on a host: --agent-exe, or the master's own). It is
// the one that loads LibTorch; ob-launch, the master and the agents, does
// not, so an agent starts in milliseconds and holds a few MiB.
inline constexpr const char* kWorkerExeName = "ob-launch-worker";
std::string WorkerExe(const std::string& launch_exe);

}  // namespace ob::launch_tool
