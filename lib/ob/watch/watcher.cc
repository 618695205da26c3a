#include "ob/watch/watcher.h"

#include <algorithm>
#include <cmath>

namespace ob::watch {

Watcher::Watcher(const DetectorOptions& options, Clock clock)
    : options_(options),
      clock_(clock),
      straggler_(options),
      loss_(options),
      throughput_(options),
      memory_(options),
      liveness_(options) {}

void Watcher::Note(const pb::Event& e) {
  run_.event_counts[e.kind()]++;
  run_.recent_events.push_back(e);
  if (run_.recent_events.size() > RunState::kRecentEvents) run_.recent_events.pop_front();
}

void Watcher::NoteFrom(size_t first, std::vector<pb::Event>* out) {
  for (size_t i = first; i < out->size(); ++i) {
    (*out)[i].set_run(run_.run);
    Note((*out)[i]);
  }
}

void Watcher::NewRun() {
  RunState fresh;
  fresh.records = run_.records;
  fresh.now_ms = run_.now_ms;
  fresh.event_counts = std::move(run_.event_counts);
  fresh.recent_events = std::move(run_.recent_events);
  run_ = std::move(fresh);
  straggler_ = StragglerDetector(options_);
  loss_ = LossDetector(options_);
  throughput_ = ThroughputDetector(options_);
  memory_ = MemoryDetector(options_);
  liveness_ = LivenessDetector(options_);
}

RankState& Watcher::Rank(const pb::Metrics& m) {
  const RankKey key{m.generation(), m.rank()};
  auto it = run_.ranks.find(key);
  if (it == run_.ranks.end()) {
    RankState r;
    r.generation = m.generation();
    r.rank = m.rank();
    r.recent_compute = Window(static_cast<size_t>(options_.straggler_window));
    r.baseline_compute = Window(static_cast<size_t>(options_.straggler_window * kBaselineWindows));
    r.recent_step = Window(static_cast<size_t>(options_.straggler_window));
    r.baseline_step = Window(static_cast<size_t>(options_.straggler_window * kBaselineWindows));
    r.recent_ratio = Window(static_cast<size_t>(options_.straggler_window));
    r.straggler_vote = KOfN(options_.straggler_votes, options_.straggler_window);
    r.memory = Window(static_cast<size_t>(options_.memory_window));
    it = run_.ranks.emplace(key, std::move(r)).first;
  }
  if (!m.host().empty()) it->second.host = m.host();
  return it->second;
}

void Watcher::TakeStep(RankState& r, const pb::Metrics& m, int64_t now,
                       std::vector<pb::Event>* out) {
  r.pipeline = m.pipeline();
  r.stage = m.stage();
  r.first_layer = m.first_layer();
  r.last_layer = m.last_layer();
  r.microbatches = m.num_microbatches();
  r.have_step = true;
  r.last_step = m.step();
  r.steps_seen++;
  r.step_seconds = m.step_seconds();
  r.compute_seconds = m.forward_seconds() + m.backward_seconds();
  r.communication_seconds = m.communication_seconds();
  r.tokens_per_second = m.tokens_per_second();
  r.loss = m.loss();
  r.grad_norm = m.grad_norm();
  r.memory_bytes = m.memory_bytes();
  r.last_progress_ms = now;

  run_.have_progress = true;
  run_.last_progress_ms = now;
  run_.stall_reported = false;
  run_.max_step = std::max(run_.max_step, m.step());
  if (r.steps_seen > static_cast<uint64_t>(options_.warmup_steps) && m.step_seconds() > 0)
    run_.job_step_seconds.Push(m.step_seconds());

  liveness_.OnStep(run_, r, now, out);
  straggler_.OnStep(run_, r, now, out);
  loss_.OnStep(r, m, now, out);
  if (std::isfinite(m.loss())) r.loss_seen_finite = true;
  throughput_.OnStep(r, now, out);
  memory_.OnStep(r, now, out);
}

void Watcher::Feed(const pb::Metrics& m, int64_t wall_ms, std::vector<pb::Event>* out) {
  if (!m.run().empty() && m.run() != run_.run) {
    if (!run_.run.empty()) {
      Finish(out);  // what the old run's records left undecided, as its own
      NewRun();
    }
    run_.run = m.run();
  }
  const size_t first = out->size();
  run_.records++;
  // The master's clock where it stamped the record: a host whose clock is
  // ahead would otherwise move "now" past every other rank's last record,
  // and they would all look hung.
  const int64_t at = m.received_unix_ms() > 0 ? m.received_unix_ms() : m.unix_ms();
  const int64_t now = clock_ == Clock::kStream ? std::max(run_.now_ms, at) : wall_ms;
  run_.now_ms = now;

  if (m.generation() > run_.generation) {
    const uint64_t previous = run_.generation;
    loss_.OnGeneration(now, out);
    throughput_.OnGeneration();
    run_.generation = m.generation();
    liveness_.OnNewGeneration(run_, previous, now);
    // Keep the previous generation for display; drop older ones.
    for (auto it = run_.ranks.begin(); it != run_.ranks.end();) {
      it = it->first.generation < previous ? run_.ranks.erase(it) : std::next(it);
    }
  }
  // A late record of a retired generation: its workers are being replaced,
  // and what they do now is not news.
  if (m.generation() == run_.generation) {
    RankState& r = Rank(m);
    if (r.first_heard_ms == 0) r.first_heard_ms = now;
    r.last_heard_ms = now;
    r.hang_reported = false;
    if (m.has_exit()) {
      liveness_.OnExit(run_, r, m, now, out);
    } else if (m.has_hang()) {
      liveness_.OnHung(run_, r, m, now, out);
    } else if (!m.heartbeat() && !m.evaluation_only()) {
      TakeStep(r, m, now, out);
    }
    liveness_.Check(run_, now, out);
  }
  NoteFrom(first, out);
}

void Watcher::Tick(int64_t wall_ms, std::vector<pb::Event>* out) {
  if (clock_ != Clock::kWall) return;
  const size_t first = out->size();
  run_.now_ms = wall_ms;
  liveness_.Check(run_, wall_ms, out);
  NoteFrom(first, out);
}

void Watcher::Finish(std::vector<pb::Event>* out) {
  const size_t first = out->size();
  loss_.Finish(run_.now_ms, out);
  liveness_.Finish(run_, out);
  NoteFrom(first, out);
}

}  // namespace ob::watch
