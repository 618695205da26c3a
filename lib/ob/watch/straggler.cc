#include "ob/watch/straggler.h"

#include <algorithm>
#include <cstdio>

#include "ob/watch/events.h"

namespace ob::watch {
namespace {

bool HasLayers(const RankState& r) { return r.first_layer != 0 || r.last_layer != 0; }
double Layers(const RankState& r) {
  return r.last_layer >= r.first_layer ? static_cast<double>(r.last_layer - r.first_layer + 1) : 1.0;
}

constexpr int kMaxBackoffShift = 5;  // re-reports at most every 32 windows
constexpr size_t kMinHistory = 3;     // steps of a rank before its median counts

const char* kBasisWords[] = {"its replicas'", "the other ranks' (per layer)", "the other ranks'"};

}  // namespace

void StragglerDetector::OnStep(RunState& run, RankState& r, int64_t now_ms,
                               std::vector<pb::Event>* out) {
  if (r.steps_seen <= static_cast<uint64_t>(o_.warmup_steps)) return;
  const double compute = r.compute_seconds;
  if (!(compute > 0)) return;
  const double per_mb = compute / (r.microbatches > 0 ? r.microbatches : 1);
  r.recent_compute.Push(per_mb);
  r.baseline_compute.Push(per_mb);
  if (r.step_seconds > 0) {
    r.recent_step.Push(r.step_seconds);
    r.baseline_step.Push(r.step_seconds);
  }
  if (r.recent_compute.size() < kMinHistory) return;
  const size_t baseline_min = 2 * static_cast<size_t>(std::max(o_.straggler_window, 2));

  bool layers_known = false;
  run.ForEachCurrent([&](const RankState& p) { layers_known = layers_known || HasLayers(p); });

  // Each peer's median now and over its baseline, in the three forms.
  std::vector<double> replicas, others_per_layer, others;
  std::vector<double> replicas_base, others_per_layer_base, others_base;
  bool baselines = r.baseline_compute.size() >= baseline_min;
  run.ForEachCurrent([&](const RankState& p) {
    if (&p == &r || p.exited || p.recent_compute.size() < kMinHistory) return;
    const double m = p.recent_compute.median(), b = p.baseline_compute.median();
    baselines = baselines && p.baseline_compute.size() >= baseline_min;
    if (p.first_layer == r.first_layer && p.last_layer == r.last_layer) {
      replicas.push_back(m);
      replicas_base.push_back(b);
    }
    others_per_layer.push_back(m / Layers(p));
    others_per_layer_base.push_back(b / Layers(p));
    others.push_back(m);
    others_base.push_back(b);
  });

  const double mine = r.recent_compute.median();
  int basis = -1;
  double value = mine, reference = 0, baseline = 0;
  size_t peers = 0;
  if (layers_known && !replicas.empty()) {
    basis = 0;
    reference = Median(replicas);
    baseline = Median(replicas_base);
    peers = replicas.size();
  } else if (layers_known && others_per_layer.size() >= 2) {
    basis = 1;
    value = mine / Layers(r);
    reference = Median(others_per_layer);
    baseline = Median(others_per_layer_base);
    peers = others_per_layer.size();
  } else if (!layers_known && others.size() >= 2) {
    basis = 2;
    reference = Median(others);
    baseline = Median(others_base);
    peers = others.size();
  }
  if (basis < 0 || !(reference > 0) || !(baseline > 0)) return;

  const double ratio = value / reference;
  const double baseline_ratio = value / baseline;
  // One replica cannot say which of the two is off (a replica that got a
  // core to itself runs fast): then the rank must also be slow, by half
  // the margin, against every other rank per layer.
  double corroboration = 0;
  // The job's pace now against its baseline (every rank's, this one's too).
  // And whether it is this rank the job waits for: its compute per layer
  // within the margin of the slowest rank's.
  const double margin = 1 + (o_.straggler_ratio - 1) / 2;
  std::vector<double> pace_now, pace_base;
  double slowest = 0;
  run.ForEachCurrent([&](const RankState& p) {
    if (p.exited || p.recent_step.size() < kMinHistory) return;
    pace_now.push_back(p.recent_step.median());
    pace_base.push_back(p.baseline_step.median());
    slowest = std::max(slowest, p.recent_compute.median() / Layers(p));
  });
  const double pace = pace_now.empty() ? 0 : Median(pace_now) / Median(pace_base);
  const bool held_up = pace >= margin && mine / Layers(r) * margin >= slowest;
  // Once an episode has begun, the baselines have taken the slowdown in:
  // then the peers and the job's waiting decide whether it goes on.
  const bool begun = r.straggler_events > 0;
  bool slow = ratio >= o_.straggler_ratio &&
              (begun ? mine / Layers(r) * margin >= slowest
                     : baselines && baseline_ratio >= o_.straggler_ratio && held_up);
  if (basis == 0 && peers == 1 && others_per_layer.size() >= 2) {
    corroboration = mine / Layers(r) / Median(others_per_layer);
    slow = slow && corroboration >= 1 + (o_.straggler_ratio - 1) / 2;
  }
  r.recent_ratio.Push(ratio);
  r.straggler_vote.Push(slow);
  r.straggler_observed++;
  // A persisting straggler is reported again after n, n, 2n, 4n, … steps
  // (at most every 32n): each time on a fresh window of votes.
  if (r.straggler_events > 0) {
    const uint64_t n = static_cast<uint64_t>(o_.straggler_window);
    const uint64_t spacing = n << std::min(std::max(r.straggler_events - 2, 0), kMaxBackoffShift);
    if (r.straggler_observed < spacing) return;
    if (!r.straggler_vote.Confirmed()) {
      if (r.straggler_observed >= spacing + n) r.straggler_events = 0;  // a clean window: over
      return;
    }
  } else if (!r.straggler_vote.Confirmed()) {
    return;
  }
  r.straggler_events++;
  r.straggler_observed = 0;

  const int votes = r.straggler_vote.hits();
  r.straggler_vote.Reset();
  char msg[512];
  std::snprintf(msg, sizeof msg,
                "%s rank %u (pipeline %u stage %u) straggles at step %llu: its median compute "
                "%.2fx %s (%d of the last %d steps at or above %.2fx)",
                r.host.c_str(), r.rank, r.pipeline, r.stage,
                static_cast<unsigned long long>(r.last_step), ratio, kBasisWords[basis], votes,
                o_.straggler_window, o_.straggler_ratio);
  pb::Event e = MakeEvent(pb::EVENT_STRAGGLER, pb::SEVERITY_WARNING, r.host,
                          static_cast<int>(r.rank), r.last_step, r.generation, now_ms, msg);
  auto& ev = *e.mutable_evidence();
  ev["ratio"] = ratio;
  ev["baseline_ratio"] = baseline_ratio;
  ev["job_pace_ratio"] = pace;
  ev["threshold_ratio"] = o_.straggler_ratio;
  ev["votes"] = votes;
  ev["window"] = o_.straggler_window;
  ev["compute_seconds"] = compute;
  ev["median_compute_per_microbatch_seconds"] = mine;
  ev["reference_per_microbatch_seconds"] = basis == 1 ? reference * Layers(r) : reference;
  ev["peers"] = static_cast<double>(peers);
  if (corroboration > 0) ev["per_layer_ratio"] = corroboration;
  ev["basis"] = basis;
  ev["step_seconds"] = r.step_seconds;
  ev["communication_seconds"] = r.communication_seconds;
  ev["pipeline"] = r.pipeline;
  ev["stage"] = r.stage;
  ev["episode_events"] = r.straggler_events;
  out->push_back(std::move(e));
}

}  // namespace ob::watch
