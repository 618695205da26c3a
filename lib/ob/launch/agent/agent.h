// The ob-launch agent (design/launch.md): one per host, started by the master through
// --rsh as `ob-launch --agent --master HOST:PORT --host NAME`.
//
// It reads the shared secret as the first line of its stdin (never from the
// command line or the environment), connects to the master and proves the
// secret (channel.h), then heartbeats every kHeartbeatMs. When told, it starts
// its workers (fork/exec, each the leader of a new process group, SIGKILLed
// by the kernel if the agent dies: PR_SET_PDEATHSIG); a worker's stdout is a
// pipe of delimited ob.pb.Metrics records that the agent forwards to the
// master with host and rank filled in; stderr is inherited. A worker's exit
// is reported at once (SIGCHLD).
//
// Restarts: StartWorkers of a newer generation first SIGKILLs the running
// workers (not reported: the master asked), then starts the new ones, each
// as soon as the old worker of its slot is gone (its GPU memory, its
// snapshot arena), or kRetireWaitMs after the kill, whichever is first.
// Killed workers are reaped as they die (SIGCHLD, and the 50 ms watchdog)
// and never waited for on the loop: an agent whose workers take seconds to
// die (CUDA) goes on heartbeating and relaying. Each
// worker slot (local rank) has a shared-memory snapshot arena (a memfd made
// once, passed to every worker of that slot as fd 3, $OB_SNAPSHOT_FD), so a
// new worker finds its predecessor's snapshots; and, with standby_exe, a
// standby process per slot that has already loaded LibTorch. Standbys are
// forked from a standby seed (standby_seed.h: one process that loads the
// worker program once; the agent is a child subreaper so that it reaps
// them), and started by exec when there is no seed or it fails. A worker
// whose slot has no standby while the seed loads waits for it (at most
// kColdStartMs); once it has loaded, every worker starts as a standby
// forked for it and handed its spec.
//
// The store: every worker (and standby) process gets one end of a
// socketpair of its own as fd 4, $OB_STORE_FD; the agent relays the store
// requests it sends there to the master over the control channel, and the
// replies back (store_relay.h). Nothing of the agent or its workers listens
// for the store. Workers also get $OB_GLOO_ADDR, this host's address on
// the connection to the master, unless the agent's environment sets it.
//
// Devices and threads (host.h): with CUDA (--device cuda, or auto on a
// host with GPUs) the worker in slot s gets CUDA_VISIBLE_DEVICES=s (the s-th
// entry of the agent's own list when it has one); every worker and standby
// gets OB_DEVICE (cpu or cuda: a standby warms that device up). Each worker
// gets OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS = max(1,
// cores the agent may run on (its affinity mask, or its cgroup's CPU quota
// where that is less) / workers of the generation on this host, or
// cpu_share when larger: under --rsh local every host is this machine),
// each unless the agent's environment sets it (then the worker inherits it);
// a BLAS variable the environment leaves unset follows its OMP_NUM_THREADS
// when that is set (host.h ThreadSettings).
//
// Deadlines before a worker's first step (every phase of a recovery has
// one): a worker shows life by a heartbeat (worker.h) within kColdStartMs
// of its spawn, or, handed to a standby, within the role deadline of the
// handing (a standby that has not said it finished loading LibTorch: no
// sooner than kColdStartMs after its own spawn), and then beats at least
// once a start deadline until its first step. Slow is not dead: both follow
// what this host has shown. The role deadline is kRoleAckMs, or
// kLoadsOfSilence times as long as this host's seed took to load LibTorch
// when that is longer (a loaded host loads slowly, and starts slowly); the
// start deadline is kStartSilentMs, or that, or kGapsOfStartSilence times
// the longest interval between two records of one of its workers before
// their first step, when longer. One that misses a deadline is stopped or
// stuck: it is SIGKILLed and its exit reported as such; the master restarts
// it, and a fresh process takes the role. Past its last step
// (PHASE_FINISHING: the last save, its exit) a worker has no deadline.
// (After the first step a hang is the master's to judge: hang_watch.h.)
//
// Peers: the agent probes the other hosts of its generation
// (StartWorkers.peers) once a second and names, in its heartbeats, those it
// could not reach twice in a row (peer_probe.h); the master decides whom a
// host↔host partition excludes.
//
// Rejoining: when the master closes the connection while our stdin is
// still open (it evicted us after a silence, as a 0.5 s link flap causes,
// and left our rsh running so that we may come back), the agent stops its
// workers (theirs is a generation the master gave up on) and connects
// again, every kRejoinRetryMs for up to kRejoinMs, as the same host; the
// master adds it back at the next generation. A refusal (kConfig), the
// window's end, end of file on stdin or a second loss stop it.
//
// Failover (design/master.md): with a standby master known, an agent that
// loses its master asks the standby and the master in turn
// (FailoverWindowMs, channel.h); it exits at once when both refuse the
// connection (NobodyListens: the run is over, or both are gone). Held by a
// standby that lets it go without acting as master, it asks the master
// again.
//
// No orphans: the agent SIGKILLs every worker's process group and exits when
// the master says Stop, when its stdin reaches end of file (the master or
// its rsh is gone), when the master has been silent (no message at all)
// longer than master_timeout_s, when the connection breaks and it cannot
// rejoin (above), or on SIGTERM/SIGINT/SIGHUP.
//
// Thread model: one uv loop on the calling thread runs everything
// (docs/threads.md). RunAgent is not re-entrant; it owns the process's
// SIGCHLD handling while it runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ob::launch {

inline constexpr int kColdStartMs = 30000;    // spawn to a worker's first heartbeat
inline constexpr int kRoleAckMs = 3000;       // a standby handed its role to its first heartbeat
inline constexpr int kStartSilentMs = 3000;   // between heartbeats before the first step
inline constexpr int kLoadsOfSilence = 2;     // this host's seed loads: the role and start deadlines at least
inline constexpr int kGapsOfStartSilence = 4; // this host's longest start interval: the start deadline at least
inline constexpr int kRejoinMs = 30000;       // an evicted agent asks to rejoin this long
inline constexpr int kRejoinRetryMs = 500;

struct AgentOptions {
  std::string master;            // HOST:PORT of the master's control server
  std::string host;              // the name the master started us for
  double master_timeout_s = 3.0; // silence after which the master counts as lost
  int probe_port = 9;            // the peer probes' port (peer_probe.h); 0: no probes
  int connect_timeout_ms = 10000;
  int secret_fd = 0;             // secret: its first line; its end of file means "stop"
  // The worker program, `standby_exe --standby-worker` a standby (main.cc:
  // ob-launch-worker beside ob-launch): one per worker slot, started ahead
  // of need so a (re)started worker skips loading its libraries (unless
  // !spare_standbys, below); it reads its WorkerSpec on stdin and becomes
  // that worker. "" = none: workers are started from scratch.
  std::string standby_exe;
  // Fork the standbys from a standby seed (standby_seed.h); false: each
  // starts by exec (ob-launch --standby exec).
  bool standby_seed = true;
  // Keep that standby per slot ahead of need (--standby on, exec); false
  // (--standby off): none waits, and a worker that runs standby_exe starts
  // as a standby forked from the seed for it and handed its spec at once,
  // so a host loads LibTorch once, not once a worker, and holds no process
  // (nor CUDA context) beyond its workers and the seed. Any other command
  // starts by exec.
  bool spare_standbys = true;
  // --device (devices.h): "auto", "cpu" or "cuda", and the GPUs this host
  // has (main.cc: $OB_GPUS_PER_HOST when set, for tests, else what LibTorch
  // sees). On CUDA every worker and standby gets CUDA_VISIBLE_DEVICES for
  // its slot, and a generation with more workers here than GPUs is refused
  // (a Refusal to the master, which stops the run with exit 78).
  std::string device = "cpu";
  int gpus = 0;
  // The UUIDs of those GPUs, slot i's at i (main.cc: $OB_TEST_GPU_IDS,
  // comma-separated, when set, for tests); told to the master, which
  // refuses two hosts whose workers would share a GPU.
  std::vector<std::string> gpu_ids;
  // Their total memory and names, as gpu_ids (main.cc: $OB_TEST_GPU_MEMORY,
  // bytes, comma-separated, for tests); told to the master, which refuses a
  // plan whose stages need more.
  std::vector<uint64_t> gpu_memory;
  std::vector<std::string> gpu_names;
  // Workers that share this machine's cores, when more than this agent's
  // own (--rsh local: every host's agent runs here; the master passes the
  // world size); 0: this agent's workers only.
  int cpu_share = 0;
  // Which build this is (Hello.build; main.cc: cli::VersionLine and the
  // LibTorch version).
  std::string build;
};

// Exit status: 0 when stopped by the master (or its stdin closed after a
// Stop), 64 bad options, 69 the master cannot be reached, 75 the master was
// lost (silence, broken connection, stdin closed), 78 no secret or the
// master rejected it, 128+N on signal N.
int RunAgent(const AgentOptions& options);

}  // namespace ob::launch
