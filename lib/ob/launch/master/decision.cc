#include "ob/launch/master/decision.h"

#include <algorithm>
#include <set>

namespace ob::launch {
namespace {

std::string Sizes(const plan::Instantiation& inst) {
  std::string s;
  for (const auto& p : inst.pipelines) s += (s.empty() ? "" : "+") + std::to_string(p.template_nodes);
  return s;
}

std::set<int> NodesOf(const plan::Instantiation& inst) {
  std::set<int> s;
  for (const auto& p : inst.pipelines) s.insert(p.nodes.begin(), p.nodes.end());
  return s;
}

std::vector<int> LiveOutside(const std::vector<int>& live, const plan::Instantiation& inst) {
  const std::set<int> used = NodesOf(inst);
  std::vector<int> out;
  for (int n : live) {
    if (!used.count(n)) out.push_back(n);
  }
  return out;
}

Decision Stop(Status outcome, std::string text) {
  Decision d;
  d.kind = Decision::Kind::kStop;
  d.stop = std::move(outcome);
  d.text = std::move(text);
  return d;
}

// `live` restarted from checkpoint `c` on a fresh instantiation; `why` says
// why the snapshots do not do.
Decision FromCheckpoint(const RecoveryFacts& f, const CheckpointRef& c, const std::string& why) {
  Result<plan::Instantiation> fresh = InstantiateOn(*f.plan, f.live);
  if (!fresh.ok()) {
    return Stop(Status::TempFail(why + "; " + fresh.status().message()),
                why + "; restart from a checkpoint (" + fresh.status().message() + ")");
  }
  Decision d;
  d.kind = Decision::Kind::kCheckpoint;
  d.next = std::move(fresh).value();
  d.idle = LiveOutside(f.live, d.next);
  d.checkpoint = c;
  d.text = why + "; restarting from checkpoint " + c.path + " as pipelines of " + Sizes(d.next) + " nodes";
  return d;
}

}  // namespace

Decision DecideRecovery(const RecoveryFacts& f) {
  const std::string lost_text = f.lost_names.empty() ? "" : "lost hosts " + f.lost_names + "; ";
  if (f.rollback.empty() && f.fruitless > kMaxFruitless) {
    const std::string msg = std::to_string(kMaxFruitless) +
                            " recoveries in a row completed no step; last: " + f.what;
    return Stop(Status::TempFail(msg), msg);
  }
  if (f.stalled_ms > 0 && !f.lost_names.empty()) {
    char timeout[32];
    snprintf(timeout, sizeof timeout, "%.1f", f.master_timeout_s);
    const std::string msg = "the master did not run for " + std::to_string(f.stalled_ms) +
                            " ms (stopped, or starved of CPU), longer than --master-timeout " +
                            timeout + " s, so the agents on " + f.lost_names +
                            " gave up on it and stopped their workers; restart the job (--resume auto)";
    return Stop(Status::TempFail(msg), msg);
  }
  if (!f.rollback.empty()) {
    Result<CheckpointRef> c = f.newest_checkpoint ? f.newest_checkpoint()
                                                  : Result<CheckpointRef>(Status::NoInput("no --ckpt-dir"));
    if (!c.ok()) {
      const std::string msg = "rollback asked (" + f.rollback +
                              ") but there is no checkpoint to roll back to (" + c.status().message() +
                              "); stopping";
      return Stop(Status::DataErr(msg), msg);
    }
    Decision d;
    d.kind = Decision::Kind::kCheckpoint;
    d.next = f.current;
    d.idle = LiveOutside(f.live, d.next);
    d.checkpoint = *c;
    d.text = "rollback to " + c->path + ": " + f.rollback;
    return d;
  }

  // The nodes the layers are on: `holding` less what was lost since; every
  // other live node comes in as an added one.
  const plan::Instantiation& base = f.snapshots ? f.holding : f.current;
  const std::set<int> lost(f.lost.begin(), f.lost.end());
  std::vector<int> added;
  {
    std::set<int> survivors = NodesOf(base);
    for (int n : lost) survivors.erase(n);
    for (int n : f.live) {
      if (!survivors.count(n)) added.push_back(n);
    }
  }
  std::vector<int> gone(lost.begin(), lost.end());
  if (gone.empty() && added.empty()) {
    Decision d;
    d.kind = Decision::Kind::kInPlace;
    d.next = base;
    d.text = "restarting every worker in place on the same instantiation";
    return d;
  }
  const plan::Recovery r =
      plan::Reinstantiate(f.plan->problem, f.plan->templates, base, gone, added);
  const std::string changes =
      lost_text + (added.empty() || !f.lost_names.empty() ? "" : std::to_string(added.size()) + " node(s) added; ");
  if (r.ok) {
    Decision d;
    d.kind = Decision::Kind::kReinstantiate;
    d.next = r.next;
    d.idle = r.idle;
    if (f.snapshots) d.fetches = r.fetches;  // else every worker reads the lineage's start
    d.text = changes + "re-instantiated as pipelines of " + Sizes(d.next) + " nodes, " +
             std::to_string(d.fetches.size()) + " layer copies (" +
             std::to_string((f.snapshots ? r.bytes_copied : 0) >> 20) + " MiB)" +
             (d.idle.empty() ? "" : ", " + std::to_string(d.idle.size()) + " node(s) idle");
    return d;
  }
  const std::string why = changes.empty() ? "re-instantiation failed: " + r.reason : changes + r.reason;
  if (!f.snapshots) {
    // The lineage's start has every layer: any layout of the live nodes.
    Result<plan::Instantiation> fresh = InstantiateOn(*f.plan, f.live);
    if (!fresh.ok()) return Stop(Status::TempFail(why + "; " + fresh.status().message()), why);
    Decision d;
    d.kind = Decision::Kind::kReinstantiate;
    d.next = std::move(fresh).value();
    d.idle = LiveOutside(f.live, d.next);
    d.text = changes + "instantiated afresh as pipelines of " + Sizes(d.next) +
             " nodes (no step since the lineage's start)";
    return d;
  }
  if (!f.newest_checkpoint) {
    return Stop(Status::TempFail(why + "; restart from a checkpoint"), why + "; restart from a checkpoint");
  }
  Result<CheckpointRef> c = f.newest_checkpoint();
  if (!c.ok()) {
    const std::string msg = why + "; restart from a checkpoint (" + c.status().message() + ")";
    return Stop(Status::TempFail(msg), msg);
  }
  return FromCheckpoint(f, *c, why);
}

PartitionVerdict PartitionExclusions(const std::vector<int>& live, const std::set<std::pair<int, int>>& cut) {
  PartitionVerdict v;
  std::set<int> left(live.begin(), live.end());
  auto is_cut = [&](int a, int b) { return cut.count({std::min(a, b), std::max(a, b)}) > 0; };
  for (;;) {
    int worst = -1, worst_reach = 0, cuts = 0;
    for (int n : left) {
      int reach = 0;
      for (int m : left) {
        if (m == n) continue;
        if (is_cut(n, m)) {
          ++cuts;
        } else {
          ++reach;
        }
      }
      if (worst < 0 || reach < worst_reach || (reach == worst_reach && n > worst)) worst = n, worst_reach = reach;
    }
    if (cuts == 0) return v;
    const int pairs = static_cast<int>(left.size() * (left.size() - 1));  // each counted twice, as cuts
    if (cuts == pairs) {
      v.why = "every one of " + std::to_string(left.size()) +
              " hosts reports every other unreachable: the probes cannot tell (dropped by a firewall?)";
      v.exclude.clear();
      return v;
    }
    v.why += (v.why.empty() ? "" : "; ") + std::string("node ") + std::to_string(worst) + " reaches " +
             std::to_string(worst_reach) + " of the other " + std::to_string(left.size() - 1);
    v.exclude.push_back(worst);
    left.erase(worst);
  }
}

std::optional<std::set<std::pair<int, int>>> CutSettle::Update(const CutReports& reports, int64_t now_ms) {
  std::set<std::pair<int, int>> all = reports.partial;
  all.insert(reports.whole.begin(), reports.whole.end());
  if (all != seen_) {
    seen_ = all;
    since_ms_ = now_ms;
  }
  if (all.empty()) return std::nullopt;
  if (reports.whole.empty() || now_ms - since_ms_ >= kCutSettleMs) return all;
  if (!reports.partial.empty()) return reports.partial;
  return std::nullopt;
}

Result<plan::Instantiation> InstantiateOn(const plan::LoadedPlan& plan, const std::vector<int>& live) {
  plan::Problem p = plan.problem;
  p.cluster.nodes = static_cast<int>(live.size());
  Status last = Status::Config("no host left");
  for (int f = p.faults; f >= 0 && !live.empty(); --f) {
    p.faults = f;
    Result<plan::Instantiation> inst = plan::Instantiate(p, plan.templates);
    if (!inst.ok()) {
      last = inst.status();
      continue;
    }
    for (auto& pipe : inst->pipelines) {
      for (int& n : pipe.nodes) n = live[static_cast<size_t>(n)];
    }
    return inst;
  }
  return Status::Config("cannot instantiate the plan on " + std::to_string(live.size()) +
                        " hosts: " + last.message());
}

pb::WeightSource WeightLineage::Next(uint64_t generation) {
  if (restoring()) {  // a new lineage from a checkpoint
    start_.Clear();
    start_.set_kind(pb::WeightSource::CHECKPOINT);
    start_.set_checkpoint(restore_.path);
    start_.set_step(restore_.step);
    start_.set_lineage(generation);
    has_steps_ = false;
    restore_ = CheckpointRef();
    return start_;
  }
  if (start_.kind() == pb::WeightSource::KIND_UNSPECIFIED) {  // the first generation
    start_.set_kind(pb::WeightSource::INITIAL);
    start_.set_step(-1);
    start_.set_lineage(generation);
    return start_;
  }
  if (!has_steps_) return start_;  // no step since its start: the start again
  pb::WeightSource s;
  s.set_kind(pb::WeightSource::SNAPSHOTS);
  s.set_step(start_.step());
  s.set_lineage(start_.lineage());
  return s;
}

}  // namespace ob::launch
