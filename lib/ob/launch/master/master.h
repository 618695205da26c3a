// The ob-launch master (design/launch.md): starts one agent per plan host through
// --rsh, authenticates them on the control channel, tells each which
// workers to start, relays their metrics, and watches everything.
//
// Start: loads the plan and the hosts (master_setup.h; every plan host must
// be in the hosts list), reads the secret, binds the control server only on
// `bind` (default: this machine's address on the route to the first remote
// host, loopback when all are local), starts `SELF --agent --master ADDR:PORT --host
// NAME --master-timeout S` per host through RshArgv and writes the secret to
// its stdin (never argv or environment), and waits for every agent to
// authenticate (start_timeout_s; then kUnavailable naming the missing
// hosts). Peers with a wrong secret are rejected and logged with their
// address; they do not count as agents.
//
// The store: the master holds the job's rendezvous store in memory
// (store_server.h), publishes each generation there (control.proto's
// Generation, under store_keys.h's GenerationKey) before its workers
// start, and answers the StoreRequests agents relay from their workers
// over the control channel (store_relay.h); nothing else listens for it.
//
// Run: heartbeats both ways every 200 ms. A dead agent (connection lost,
// its rsh process exited, or silent > agent_timeout_s) or a worker that
// exits with a non-zero status is detected within a second. A hang with
// nobody dead (a rank whose training loop stopped making progress while
// its process and heartbeats go on, as under NCCL with a stuck peer) is
// detected after hang_timeout_s (hang_watch.h): the master names the rank
// and its host and restarts every worker as for a crash; the agents
// SIGKILL the old ones (no waiting for NCCL's watchdog). Failures within
// 100 ms of the first are decided together (design/recovery.md): lost hosts go to the
// plan's re-instantiation (plan/recovery.h); if some layer has no replica
// left the run ends with kTempFail naming the layers; otherwise the master
// publishes the next generation (the new instantiation and fetch list) and
// tells every live agent to replace its workers, which resume from their
// shared-memory snapshots after the last step all of them completed
// (worker.h). A worker that failed on a live host is restarted in place in
// the same way, with the same instantiation. A lost host whose agent comes
// back (started by hand or by a supervisor, with the secret) is added at the
// next generation. Each recovery is logged as phases with durations
// (`recovered` in events.log). When a layer has no replica left and a
// complete checkpoint exists, the master instantiates the templates afresh
// on the surviving hosts and restarts every worker from that checkpoint
// (steps since it are redone). Three recoveries in a row that complete no
// step end the run with kTempFail. When every worker exited 0 the run is
// complete. SIGTERM, SIGINT, SIGUSR1 (Slurm's --signal) or `stop` on the
// control socket: with checkpoints, every worker saves after the step after
// the next (the first no worker may have begun) and the master stops once
// that checkpoint is committed and returns 0; not committed within
// stop_grace_s, or failed, is kTempFail / kIoErr (the work since the last
// good checkpoint is not on disk). Without checkpoints, before the run's
// first step, or at a second signal, it stops at once and returns 0. A run that ends within two steps
// is left to end. Every detection and decision is a line in
// run_dir/events.log.
//
// No orphans: agents get Stop and end of file on stdin, and their process
// groups are SIGKILLed if they do not exit within kStopWaitMs; agents kill
// their workers on every path (agent.h).
//
// Where things live: the decision of what a failure means is a pure
// function (decision.h); the agents (agent_pool.h), checkpoints
// (ckpt_keeper.h), recovery phases (recovery_clock.h) and records
// (metrics_sink.h) are components of their own; the master (master.cc,
// master_operator.cc for the control socket) gathers facts and carries
// decisions out.
//
// Thread model: one uv loop on the calling thread runs the control server,
// the agents' connections, the store, timers, signals and the control socket; every
// callback and hook runs on it (docs/threads.md). Not re-entrant; RunMaster
// owns SIGCHLD, SIGTERM, SIGINT and ignores SIGPIPE while it runs.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ob/control.pb.h"
#include "ob/manifest.pb.h"
#include "ob/plan.pb.h"
#include "ob/status.h"

namespace ob::launch {

inline constexpr int kStopWaitMs = 3000;   // agents' time to exit after Stop

// What a worker needs to know to join; the caller turns it into a command.
struct WorkerContext {
  int rank = 0;
  int world_size = 0;
  int local_rank = 0;
  int pipeline = 0;
  int stage = 0;
  std::string host;           // the agent's host name
  std::string plan_path;      // as given to the master
  uint64_t generation = 1;    // its plan is the store's GenerationKey(generation)
};

// argv (and extra environment) of one worker; argv must not be empty.
// Runs on the loop thread, once per rank per start.
using WorkerCommand = std::function<pb::WorkerSpec(const WorkerContext&)>;

struct MasterOptions {
  // The plan (ob-formats(5)), read by the caller once (LoadPlanData: "-" or
  // a pipe cannot be read twice), and the path it was read from, for messages.
  pb::Plan plan;
  std::string plan_path;
  std::string hosts_path;            // "" = Slurm's node list
  std::string rsh = "ssh";           // "ssh", "local" or a prefix command
  std::string secret_file;           // "" = $OB_SECRET
  std::string bind = "auto";         // ADDR[:PORT], or "auto" (master_setup.h AutoBindAddress)
  std::string metrics;               // delimited Metrics out: FILE, "-" or "" (none)
  std::string run_dir;               // "" = ./ob-run-YYYYmmdd-HHMMSS
  bool log_to_run_dir = true;        // copy log lines to run_dir/master.log
  double master_timeout_s = 3.0;     // passed to agents (--master-timeout)
  double agent_timeout_s = 1.0;      // an agent silent this long is lost
  double start_timeout_s = 30.0;     // for every agent to authenticate
  // A training rank whose progress counter has not moved for this long is
  // hung (hang_watch.h; ten times as long, at least 30 s, before its first
  // step of a generation): the master names it and restarts the generation.
  double hang_timeout_s = 3.0;
  double stop_grace_s = 120.0;       // for the checkpoint a stop request writes
  std::string self_exe;              // the ob-launch binary agents run; "" = /proc/self/exe
  std::vector<std::string> agent_flags;  // extra flags for agents (e.g. "-v")
  // This build (agent.h AgentOptions::build): hosts whose agents say
  // another are refused (machine_checks.h CheckOneBuild). "": not checked.
  std::string build;
  WorkerCommand worker_command;      // REQUIRES: set
  // Checkpoints (ckpt/checkpoint.h): the directory workers save into (""
  // = none); the master commits each step once every rank's part is in,
  // restores from the latest complete one when failures take every replica
  // of a layer, and with `resume` ("auto": the latest in ckpt_dir, or a
  // step-… directory) starts from one.
  std::string ckpt_dir;
  int ckpt_keep = 0;                 // > 0: after each commit keep only the newest that many
  std::string resume;
  // Resume from a checkpoint another job saved (another seed or data):
  // refused unless this is set.
  bool resume_from_other = false;
  // The standby master (design/master.md): "auto" (the first host of the
  // hosts list that is not master_host, when there are three hosts or
  // more: a takeover needs a majority of them), a host name, or "off".
  std::string standby_master = "auto";
  // The host this master runs on, as the hosts list names it: lost with
  // the master at a takeover. "" : this machine's name if the list has it;
  // under Slurm the batch node; with --rsh local the first host.
  std::string master_host;
  // What the standby master runs: the master's command line (argv[1..])
  // and working directory, replayed on the standby's host.
  std::vector<std::string> argv;
  std::string cwd;
  // This process is the standby master of the master at ADDR:PORT, on
  // host `standby_host` (main.cc: --standby-master-of); `secret` is the
  // job's, read from stdin.
  std::string standby_of;
  std::string standby_host;
  std::string secret;
  uint64_t seed = 0;                 // recorded in manifests (the data position is (seed, step))
  std::string data;                  // --data as the workers get it (the job identity; inputs.h)
  std::string data_sum;              // its content sum as the master read it (CheckDataForPlan; "": not here)
  std::string data_identity;         // and which file that was (model::FileIdentity; "": not here)
  std::string eval_data;             // --eval-data as the workers get it (inputs.h)
  std::string eval_data_sum;         // its content sum as the master read it ("": not here)
  double eval_split = 0;             // --eval-split (for the job identity: the tokens trained on)
  int64_t steps = 0;                 // the run's last step is steps - 1 (0: not checked)
  pb::OptimizerSettings optimizer;   // the workers' (recorded in checkpoints)
};

// The run's exit status: 0 when training completed or was stopped on
// request. Errors: kConfig (secret, hosts, plan hosts), kUsage, kNoInput /
// kDataErr (plan), kUnavailable (an agent could not be started or did not
// authenticate in time, or bind failed), kTempFail (a host or worker failed
// during the run; the message names it and the detection latency).
Result<int> RunMaster(const MasterOptions& options);

}  // namespace ob::launch
