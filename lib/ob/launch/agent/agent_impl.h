// The agent's insides (agent.h says what it does), shared by its files:
// agent.cc (its life: connecting, rejoining, messages, shutting down),
// agent_workers.cc (starting each generation's workers), agent_watch.cc
// (their output, exits and deadlines), agent_standby.cc (standbys and the
// standby seed).
#pragma once

#include <uv.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ob/cluster/rsh.h"
#include "ob/control.pb.h"
#include "ob/launch/agent/agent.h"
#include "ob/launch/agent/peer_probe.h"
#include "ob/launch/agent/standby_seed.h"
#include "ob/launch/wire/channel.h"
#include "ob/launch/wire/devices.h"
#include "ob/launch/wire/stall_grace.h"
#include "ob/launch/wire/store_relay.h"
#include "ob/status.h"

namespace ob::launch::detail {

constexpr int kWatchdogMs = 50;          // how often the agent checks the master and workers
// Step records kept per rank for a master that takes over: the steps a
// master may have left unread while it was silent (--master-timeout) or
// lost, at a few hundred bytes each.
constexpr size_t kResentRecords = 1024;
// A replaced worker that has not died this long after its SIGKILL (a CUDA
// process tearing its context down, a process in uninterruptible sleep)
// no longer holds its slot's successor back.
constexpr int kRetireWaitMs = 10000;
// The longest the loop waits for the standby seed's answer to a fork
// (milliseconds of work, but on a loaded machine); past it the seed counts
// as failed.
constexpr int kSeedAnswerMs = 2000;
// Where a worker finds what its agent passes it (cluster::SpawnWithPipes).
constexpr int kSnapshotFd = cluster::kPassedFd;  // $OB_SNAPSHOT_FD
constexpr int kStoreFd = cluster::kPassedFd + 1;  // $OB_STORE_FD

struct Worker {
  uint32_t rank = 0;
  uint32_t slot = 0;          // local rank: its snapshot arena, its GPU
  uint64_t generation = 0;
  int64_t killed_ms = -1;     // replaced: when it was sent SIGKILL (loop clock)
  cluster::ChildProcess proc;
  uv_pipe_t* out = nullptr;   // its stdout; closed by the loop
  uint64_t store_client = 0;  // its end of the store relay
  std::string buf;            // undecoded metrics bytes
  bool junk = false;          // its stdout stopped being a record stream
  bool exited = false;
  // Its deadlines before the first step (agent.h), on the loop's clock.
  int64_t deadline_ms = 0;    // for the next sign of life
  int64_t heard_ms = -1;      // its last record before its first step
  bool stepped = false;       // a step record came: no more deadlines
  bool suspect = false;       // past the deadline at the last check
  int phase = 0;              // pb::WorkerPhase of its last record
  std::string stuck;          // why it was killed for missing one
};

// A standby worker (agent.h), and its end of the store relay.
struct Standby {
  cluster::ChildProcess proc;
  uint64_t store_client = 0;
  int64_t spawned_ms = 0;     // on the loop's clock
  bool forked = false;        // from the seed, not by exec
};

class Agent {
 public:
  explicit Agent(const AgentOptions& o) : opt_(o) {
    uv_loop_init(&loop_);
    loop_.data = this;
    relay_ = std::make_unique<StoreRelay>(&loop_, [this](const pb::Control& m) { Send(m); });
  }
  ~Agent() {
    conn_.reset();
    relay_.reset();  // its handles are closed while the loop can still free them
    uv_walk(&loop_, [](uv_handle_t* h, void*) { if (!uv_is_closing(h)) uv_close(h, nullptr); },
            nullptr);
    for (int i = 0; i < 3; ++i) uv_run(&loop_, UV_RUN_NOWAIT);
    uv_loop_close(&loop_);
  }

  int Run();

 private:
  void OnConnected(Result<std::shared_ptr<Connection>> r);
  // The master closed our connection while it still holds our stdin: it
  // evicted us (agent.h, "Rejoining").
  void Detach(const std::string& reason);
  // The master is lost (silent, gone, its connection or our stdin closed):
  // with a standby master known, the workers stop and the agent goes to
  // it (design/master.md); else it shuts down.
  // `evicted`: the master closed our connection while its rsh still holds
  // our stdin (it may take us back: we ask as long as kRejoinMs).
  void LostMaster(int code, const std::string& reason, bool evicted = false);
  void Reconnect();
  void OnMessage(pb::Control& m);
  void StartWorkers(const pb::StartWorkers& sw);
  void StartWorker(const pb::WorkerSpec& spec);
  // Replaced workers: SIGKILLed now, reaped by ReapWorkers as they die
  // (never waited for on the loop), not reported (the master asked).
  void Retire();
  // Starts the pending workers whose slot no replaced worker still holds.
  void StartPending();
  void ReapWorkers();
  // As a child subreaper the agent inherits every orphan below it: a
  // standby whose fork answer came too late, a daemon a worker command
  // left. Reaps those that died and are none of its known children; stops
  // at a known one (waitid shows one zombie at a time), which its owner
  // reaps.
  void ReapStrangers();
  void CheckDeadlines();
  void OnWorkerOutput(Worker* w, const char* data, size_t n);
  void KillWorkers();
  void CloseOutputs();
  int ArenaFd(uint32_t local_rank);
  // Whether this host's workers run on CUDA (AgentOptions::device, gpus).
  bool cuda() const {
    auto d = ParseDevice(opt_.device);
    return d.ok() && ResolveDevice(*d, opt_.gpus) == DeviceKind::kCuda;
  }
  // OMP_NUM_THREADS and the like for `workers` workers (agent.h), added to
  // each spec unless our environment sets them.
  void SetThreads(std::vector<pb::WorkerSpec>* specs);
  // The thread variables (host.h) a worker here gets when `sharing`
  // workers share the host's cores, leaving out those the user set.
  std::map<std::string, std::string> ThreadEnv(int sharing) const;
  std::vector<std::string> WorkerEnv(const pb::WorkerSpec* spec, uint32_t slot);
  // Forks `argv` with the slot's snapshot arena and a new store endpoint
  // (a standby, without `spec`, from the seed when it is ready); sets
  // *store_client to the endpoint's id, and *forked (if given) to whether
  // the seed forked it.
  Result<cluster::ChildProcess> Spawn(const std::vector<std::string>& argv,
                                      const pb::WorkerSpec* spec, uint32_t slot,
                                      uint64_t* store_client, bool* forked = nullptr);
  void SpawnStandby(uint32_t slot);
  // Whether `spec`'s worker starts as a standby (a waiting one, or one
  // forked from the seed for it): always with spare standbys; without
  // (AgentOptions::spare_standbys), when it runs the worker program.
  bool StartsAsStandby(const pb::WorkerSpec& spec) const;
  // The standby seed (standby_seed.h): started with the first standby;
  // OnSeedOutput sees it loaded (or dead); SeedFailed gives it up for
  // good, and standbys start by exec from then on. SeedSettled starts
  // what waited for it (never from inside StartPending: it calls it).
  void StartSeed();
  void OnSeedOutput();
  void SeedFailed(const std::string& why);
  void StopSeed();  // its poll closed, it killed and reaped
  void SeedSettled();
  void Shutdown(int code, const std::string& why);
  void Send(const pb::Control& m) {
    if (conn_) conn_->Send(m);
  }

  AgentOptions opt_;
  std::string secret_;
  uv_loop_t loop_;
  uv_timer_t heartbeat_{}, watchdog_{}, drain_{};
  uv_signal_t sigchld_{}, sigterm_{}, sigint_{}, sighup_{};
  uv_pipe_t stdin_{};
  bool stdin_open_ = false;
  std::shared_ptr<Connection> conn_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::unique_ptr<Worker>> dying_;   // retired, not reaped yet
  std::vector<pb::WorkerSpec> pending_;          // this generation's, waiting for their slot
  // Per local worker slot: the memfd its workers keep their snapshots in
  // (runtime/snapshot_arena.h). It outlives every worker, so a restarted
  // one finds its predecessor's state; it dies with the agent.
  std::map<uint32_t, int> arenas_;
  std::map<uint32_t, Standby> standby_;  // per slot, waiting for a role
  enum class Seed { kNone, kLoading, kReady, kFailed };
  Seed seed_state_ = Seed::kNone;
  std::unique_ptr<StandbySeed> seed_;
  uv_poll_t seed_poll_{};         // on the seed's stdout, while it lives
  bool subreaper_ = false;        // PR_SET_CHILD_SUBREAPER, for the seed's standbys
  int64_t seed_started_ms_ = 0;   // on the loop's clock
  // What this host has shown (agent.h, "Deadlines"): how long its seed took
  // to load LibTorch, and the longest interval between two records of a
  // worker before its first step.
  int64_t seed_load_ms_ = 0;
  int64_t start_gap_ms_ = 0;
  int64_t RoleAckMs() const { return std::max<int64_t>(kRoleAckMs, kLoadsOfSilence * seed_load_ms_); }
  int64_t StartSilentMs() const {
    return std::max<int64_t>({kStartSilentMs, kLoadsOfSilence * seed_load_ms_, kGapsOfStartSilence * start_gap_ms_});
  }
  std::vector<uint32_t> seed_wanted_;  // slots whose standby waits for the seed
  // How many workers shared the cores at the last start (a standby starts
  // with the threads it would get: LibTorch's and BLAS's pools are sized
  // when they first run, and a pool sized for the whole machine makes the
  // first step after a recovery several times slower).
  int last_sharing_ = 0;
  bool said_test_nccl_hosts_ = false;  // OB_TEST_NCCL_HOSTS=1's warning, once
  // Workers' and standbys' store requests, to the master and back.
  std::unique_ptr<StoreRelay> relay_;
  uint64_t generation_ = 0;
  uint64_t sequence_ = 0;
  bool master_suspect_ = false;  // the master was silent too long at the last watchdog tick
  StallGrace stalls_;            // our own, at the watchdog's ticks (stall_grace.h)
  int exit_code_ = -1;
  std::string master_host_;
  int master_port_ = 0;
  int64_t rejoin_until_ms_ = -1;  // detached: asking to rejoin until then (loop clock)
  // The standby master, as the master last said (StandbyMaster), and the
  // master's term.
  std::string standby_host_, standby_address_;
  uint64_t term_ = 0;
  bool failing_over_ = false;     // asking the standby and the master in turn: last_records_ go to who takes us
  bool at_standby_ = false;       // the address asked now is the standby's
  std::string alternate_;         // the other one to ask, ADDR:PORT ("" : not alternating)
  std::string lost_reason_;       // how the master was lost, for the line if nobody takes us
  bool failed_over_ = false;      // our master is (or will be) the old one's standby: stdin says nothing
  // In the round of asking now, the standby's and the master's last answer
  // was a refused connection (NobodyListens): both gone, nobody takes us.
  bool standby_refused_ = false, master_refused_ = false;
  // Held by the standby, which has not acted as master yet (no
  // StartWorkers, no StandbyMaster of its own): the master we left,
  // ADDR:PORT, and the standby's host. Should the standby let us go (the
  // master answers it again, or no takeover), we ask the master again.
  std::string left_master_, held_by_;
  // Each rank's last kResentRecords step records: the master may have died
  // (or stopped) before passing them on, and the one that takes over
  // publishes what it lacks.
  std::map<uint32_t, std::deque<pb::Control>> recent_records_;
  std::unique_ptr<PeerProbe> probe_;  // this generation's peers (peer_probe.h), once we have some
  uv_timer_t retry_{};
};

}  // namespace ob::launch::detail
