// The master's generations of workers (design: launch, "Recovery"): the first
// one once every agent is in, each next one after a failure, a partition or
// a hang, decided by DecideRecovery (decision.h) and carried out here.
#include "ob/launch/master/master_impl.h"

#include <algorithm>
#include <utility>

#include "ob/clock.h"
#include "ob/io/text.h"
#include "ob/launch/master/machine_checks.h"
#include "ob/launch/wire/devices.h"
#include "ob/launch/wire/store_keys.h"
#include "ob/model/data.h"
#include "ob/log.h"

namespace ob::launch {

using io::NameSome;

namespace detail {

void Master::StartWorkers() {
  std::vector<MachineOf> machines;
  for (const auto& a : agents_.all()) {
    machines.push_back(
        {a->host.name, a->boot_id, a->gpus, a->host.slots, a->device, a->build, a->gpu_memory, a->gpu_names});
  }
  if (Status one = CheckOneBuild(machines, opt_.build); !one.ok()) return BeginStop(one.message(), one);
  if (Status one = CheckOneDevice(machines); !one.ok()) return BeginStop(one.message(), one);
  // Every stage the plan may put on a host fits its GPUs: else each
  // generation would run out of memory at its first step.
  if (Status one = CheckGpuMemory(machines, LargestStageBytes(plan_), plan_.gpu_memory_bytes()); !one.ok()) {
    return BeginStop(one.message(), one);
  }
  // Hosts that are one machine (a name listed twice under two spellings,
  // containers of one node): workers sharing a GPU would fail in NCCL or
  // run out of its memory, so that is refused; the rest is said. Every
  // --rsh local host is this machine, by design.
  if (opt_.rsh != "local") {
    Result<std::vector<std::string>> said = CheckMachines(machines);
    if (!said.ok()) return BeginStop(said.status().message(), said.status());
    for (const std::string& w : *said) {
      OB_LOG(Warn) << w;
      events_.Write("one-machine", w);
    }
  }
  // The files the job reads, as this machine reads them, or, for --data
  // it cannot read, as the checkpoint resumed from recorded it (inputs.h):
  // every worker compares its own fingerprint, and its sum over every byte
  // where it read its copy whole. Store key -> (value, whose reading).
  std::vector<std::pair<std::string, std::pair<std::string, std::string>>> inputs = {
      {InputKey("--data"), ckpt_.ExpectedData()}, {InputSumKey("--data"), ckpt_.ExpectedDataSum()}};
  if (!opt_.eval_data.empty() && opt_.eval_data != "synthetic") {
    inputs.push_back({InputKey("--eval-data"), {model::DataFingerprint(opt_.eval_data), "the master"}});
    inputs.push_back({InputSumKey("--eval-data"), {opt_.eval_data_sum, "the master"}});
  }
  // And which file on this machine it read whole (a worker reading that
  // very file has nothing to compare).
  if (!opt_.data_sum.empty() && !opt_.data_identity.empty()) {
    if (Status st = store_.Set(InputFileKey("--data"), InputFileValue(BootId(), opt_.data_identity)); !st.ok()) {
      return BeginStop(st.message(), st);
    }
  }
  for (const auto& [key, expected] : inputs) {
    if (expected.first.empty()) continue;
    Status st = store_.Set(key, InputValue(expected.first, expected.second));
    if (!st.ok()) return BeginStop(st.message(), st);
  }
  // And the checkpoint directory, as its lock file says (inputs.h).
  if (!ckpt_.lock_line().empty()) {
    if (Status st = store_.Set(CheckpointDirKey(), ckpt_.lock_line()); !st.ok()) return BeginStop(st.message(), st);
  }
  state_ = State::kRunning;
  OB_LOG(Info) << "every agent authenticated in " << Now() - start_ms_ << " ms; starting "
               << layout_.ranks.size() << " worker(s)";
  Status st = LaunchGeneration();
  if (!st.ok()) BeginStop(st.message(), st);
}

// Publishes the next generation (plan_ and fetches_ as they are now) and
// has every live agent replace its workers with that generation's.
Status Master::LaunchGeneration() {
  ++generation_;
  Result<LaunchLayout> layout = LayOut(plan_, hosts_, hosts_name_);
  if (!layout.ok()) return layout.status().WithContext("generation " + std::to_string(generation_));
  layout_ = std::move(layout).value();
  // What each stage of this instantiation is predicted to hold, in its
  // template's recomputation mode (a smaller template may recompute more).
  events_.Write("memory", "generation=" + std::to_string(generation_) + " " +
                              plan::MemoryCheckText(loaded_.problem, loaded_.templates, loaded_.instantiation));
  const pb::WeightSource source = lineage_.Next(generation_);
  {
    pb::Generation g;
    g.set_generation(generation_);
    *g.mutable_plan() = plan_;
    *g.mutable_source() = source;
    for (const auto& f : fetches_) {
      auto* x = g.add_fetches();
      x->set_node(static_cast<uint32_t>(f.node));
      x->set_layer(static_cast<uint32_t>(f.layer));
      x->set_from_node(static_cast<uint32_t>(f.from_node));
    }
    OB_RETURN_IF_ERROR(store_.Set(GenerationKey(generation_), g.SerializeAsString())
                           .WithContext("cannot publish generation " + std::to_string(generation_)));
    if (generation_ > 2) store_.ErasePrefix(GenerationKeysPrefix(generation_ - 2));
  }
  if (source.kind() == pb::WeightSource::CHECKPOINT) {
    events_.Write("resume", "generation=" + std::to_string(generation_) + " from " + source.checkpoint());
    if (Result<pb::Manifest> m = ckpt::LoadManifest(source.checkpoint()); m.ok()) {
      for (const pb::UncheckedCopy& u : m->unchecked()) {
        const bool known = std::any_of(inherited_unchecked_.begin(), inherited_unchecked_.end(),
                                       [&](const pb::UncheckedCopy& x) { return SameCopy(x, u); });
        if (!known) inherited_unchecked_.push_back(u);
      }
    }
  }
  ranks_.assign(layout_.ranks.size(), RankState{});
  hang_.Reset(layout_.ranks.size(), /*recovery=*/generation_ > 1);
  hang_suspect_ = false;
  metrics_.NewGeneration();
  ranks_reported_ = 0;
  ranks_done_ = 0;
  ckpt_.NewGeneration();
  const int world = static_cast<int>(layout_.ranks.size());
  for (size_t i = 0; i < agents_.all().size(); ++i) agents_.all()[i]->ranks = layout_.host_ranks[i];
  const std::vector<pb::PeerHost> peers = agents_.Peers();
  for (auto& x : agents_.all()) {
    AgentState& a = *x;
    a.unreachable.clear();
    if (a.state != AgentState::State::kConnected || !a.conn) continue;
    pb::Control m;
    auto* sw = m.mutable_start_workers();
    sw->set_generation(generation_);
    for (const auto& p : peers) {
      if (p.host() != a.host.name) *sw->add_peers() = p;
    }
    for (int r : a.ranks) {
      const RankPlacement& p = layout_.ranks[static_cast<size_t>(r)];
      WorkerContext ctx{r, world, p.local_rank, p.pipeline, p.stage, a.host.name,
                        opt_.plan_path, generation_};
      pb::WorkerSpec spec = opt_.worker_command(ctx);
      spec.set_rank(static_cast<uint32_t>(r));
      spec.set_local_rank(static_cast<uint32_t>(p.local_rank));
      *sw->add_workers() = std::move(spec);
    }
    a.conn->Send(m);
  }
  rec_.Started();
  std::string pipes;
  for (const auto& p : loaded_.instantiation.pipelines) pipes += (pipes.empty() ? "" : "+") + std::to_string(p.template_nodes);
  events_.Write("start-workers", "generation=" + std::to_string(generation_) +
                                     " world=" + std::to_string(world) + " pipelines=" + pipes +
                                     " source=" + DescribeSource(source));
  return Status::Ok();
}

// Hosts that report peers they cannot reach (peer_probe.h): the side that
// cannot reach the majority is excluded (decision.h), for good (its agent
// would rejoin into the same partition).
void Master::CheckPartition() {
  const CutReports reported = agents_.Cuts();
  if (reported.partial.empty() && reported.whole.empty()) partition_said_.clear();
  const std::optional<std::set<std::pair<int, int>>> settled = cut_settle_.Update(reported, Now());
  if (!settled) return;
  const std::set<std::pair<int, int>>& cuts = *settled;
  const PartitionVerdict v = PartitionExclusions(agents_.Live(), cuts);
  std::string pairs;
  for (const auto& [x, y] : cuts) {
    pairs += (pairs.empty() ? "" : ", ") + agents_.at(x).host.name + "-" + agents_.at(y).host.name;
  }
  if (v.exclude.empty()) {
    if (partition_said_ != pairs + v.why) events_.Write("partition", "cut " + pairs + ": " + v.why + "; nobody excluded");
    partition_said_ = pairs + v.why;
    return;
  }
  events_.Write("partition", "cut " + pairs + ": " + v.why);
  for (int n : v.exclude) {
    AgentState& a = agents_.at(n);
    HostLost(a, "host " + a.host.name + " cannot reach the others' majority (unreachable pairs: " + pairs +
                    "); excluding it",
             0, Lost::kExcluded);
  }
}

// Judged only while every agent is heard from (a starved or cut-off agent
// holds its workers' records back: that is the agent pool's to judge), and
// confirmed at the next tick, after an I/O poll (a master that did not run
// for a while must read what waits in its sockets first).
void Master::CheckHang() {
  for (const auto& a : agents_.all()) {
    if (a->connected() && a->conn && !a->ranks.empty() &&
        Now() - a->conn->last_receive_ms() > 2 * kHeartbeatMs) {
      hang_suspect_ = false;
      return;
    }
  }
  std::optional<HangWatch::Verdict> v = hang_.Check(Now(), /*peek=*/!hang_suspect_);
  if (!v || !hang_suspect_) {
    hang_suspect_ = v.has_value();
    return;
  }
  hang_suspect_ = false;
  std::string what;
  for (const HangWatch::Named& n : v->ranks) {
    const std::string& host = layout_.hosts[static_cast<size_t>(layout_.ranks[n.rank].host)].name;
    const std::string line = "worker rank " + std::to_string(n.rank) + " on host " + host + " hung: " + n.why;
    events_.Write("worker-hang", "rank=" + std::to_string(n.rank) + " host=" + host +
                                     " step=" + std::to_string(n.step) +
                                     " stalled_ms=" + std::to_string(n.stalled_ms) +
                                     " deadline_ms=" + std::to_string(n.deadline_ms) +
                                     " still_ms=" + std::to_string(v->still_ms));
    metrics_.Hung(host, n, generation_, line);
    what += (what.empty() ? "" : "; ") + line;
  }
  Failure(what + "; tearing generation " + std::to_string(generation_) + " down", "", v->stalled_ms);
}

void Master::Failure(const std::string& what, const std::string& lost_host, int64_t latency_ms) {
  if (state_ == State::kStopping || state_ == State::kDone) return;
  OB_LOG(Error) << what;
  events_.Write("detect", what);
  rec_.Detected(latency_ms);
  failures_.push_back(what);
  if (!lost_host.empty()) failed_hosts_.insert(lost_host);
  if (decide_deadline_ms_ < 0) decide_deadline_ms_ = Now() + kDecideMs;
}

// Gathers the facts for DecideRecovery (decision.h) and carries its
// decision out.
RecoveryFacts Master::Facts() {
  RecoveryFacts f;
  f.plan = &loaded_;
  f.current = loaded_.instantiation;
  f.holding = holding_;
  f.snapshots = lineage_.has_steps() && !lineage_.restoring();
  f.live = agents_.Live();
  f.master_timeout_s = opt_.master_timeout_s;
  // (blocks the loop while it verifies: every worker restarts anyway)
  if (ckpt_.enabled()) f.newest_checkpoint = [this] { return ckpt_.Newest(); };
  return f;
}

void Master::Decide() {
  decide_deadline_ms_ = -1;
  if (state_ != State::kRunning || Fenced()) return;
  if (QuorumInDoubt()) {
    decide_deadline_ms_ = Now() + kHeartbeatMs;  // after the next ticks' judgement (QuorumInDoubt)
    return;
  }
  RecoveryFacts f = Facts();
  f.lost.assign(lost_since_holding_.begin(), lost_since_holding_.end());
  f.lost_names = NameSome({failed_hosts_.begin(), failed_hosts_.end()}, kHostsNamed);
  f.what = failures_.empty() ? "hosts came back" : failures_.front();
  if (failures_.size() > 1) f.what += " (and " + std::to_string(failures_.size() - 1) + " more)";
  failures_.clear();
  failed_hosts_.clear();
  f.fruitless = ++fruitless_;
  // Hosts lost right after our own stall (the agents' timeout ran out while
  // we could not answer) are not the hosts' fault.
  if (stalled_ms_ > 0 && Now() - stall_seen_ms_ < kStallBlameMs) f.stalled_ms = stalled_ms_;
  stalled_ms_ = 0;
  const Decision d = DecideRecovery(f);
  if (d.kind != Decision::Kind::kStop) {
    OB_LOG(Warn) << f.what << ": " << d.text;
  }
  Carry(d);
}

void Master::Carry(const Decision& d) {
  if (d.kind == Decision::Kind::kStop) {
    events_.Write("decide", d.text);
    OB_LOG(Error) << d.text;
    return BeginStop(d.text, d.stop);
  }
  if (d.kind == Decision::Kind::kCheckpoint) lineage_.RestoreNext(d.checkpoint);
  loaded_.instantiation = d.next;
  fetches_ = d.fetches;
  idle_ = d.idle;
  plan::SetInstantiation(loaded_.problem, loaded_.templates, loaded_.instantiation, &plan_);
  rec_.Decided();
  events_.Write("decide", "generation=" + std::to_string(generation_ + 1) + " " + d.text);
  Status st = LaunchGeneration();
  if (!st.ok()) BeginStop(st.message(), Status::TempFail(st.message()));
}

// Every worker back to the latest complete checkpoint, on the same
// instantiation (a diverged loss). "" when under way, else why not: then,
// with no checkpoint at all, the run stops (exit 65: the model diverged).
std::string Master::Rollback(const std::string& reason) {
  if (state_ != State::kRunning) return "the run is not running";
  RecoveryFacts f = Facts();
  f.rollback = reason;
  const Decision d = DecideRecovery(f);
  if (d.kind == Decision::Kind::kStop) {
    Carry(d);
    return d.text;
  }
  OB_LOG(Warn) << d.text;
  Carry(d);
  return "";
}

}  // namespace detail

}  // namespace ob::launch
