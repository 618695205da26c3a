#include "ob/launch/master/hang_watch.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "ob/metrics.pb.h"

namespace ob::launch {

namespace {

int64_t MedianMs(const std::deque<double>& seconds) {
  if (seconds.empty()) return 0;
  std::vector<double> v(seconds.begin(), seconds.end());
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return static_cast<int64_t>(v[v.size() / 2] * 1e3);
}

std::string Seconds(int64_t ms) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", static_cast<double>(ms) / 1e3);
  return text;
}

}  // namespace

void HangWatch::Reset(size_t ranks, bool recovery) {
  ranks_.assign(ranks, Rank{});
  judged_ = false;
  recovery_ = recovery;
}

int64_t HangWatch::Deadline(bool stepped) const {
  const Period p = PeriodOf(stepped);
  const int64_t floor = stepped ? o_.timeout_ms : std::max(o_.first_step_timeout_ms, o_.timeout_ms);
  return std::max({floor, kGapsOfSilence * longest_gap_ms_[p], kStepsOfSilence * MedianMs(steps_)});
}

std::string HangWatch::DeadlineBasis(bool stepped) const {
  const Period p = PeriodOf(stepped);
  const int64_t d = Deadline(stepped);
  if (d == kGapsOfSilence * longest_gap_ms_[p] && longest_gap_ms_[p] > 0) {
    return std::to_string(kGapsOfSilence) + " x the longest interval between counter moves seen " +
           (p == kSteady ? "in a step" : p == kRecoveryStep ? "before a first step after a recovery"
                                                            : "before the first step") +
           ", " + Seconds(longest_gap_ms_[p]);
  }
  if (d == kStepsOfSilence * MedianMs(steps_) && !steps_.empty()) {
    return std::to_string(kStepsOfSilence) + " x the median step, " + Seconds(MedianMs(steps_));
  }
  return stepped ? "--hang-timeout" : "the first step's bound";
}

void HangWatch::Record(uint32_t rank, int phase, uint64_t progress, bool waiting, int64_t step,
                       int64_t now_ms, double step_seconds) {
  if (rank >= ranks_.size()) return;
  if (step_seconds > 0) {
    steps_.push_back(step_seconds);
    if (steps_.size() > kStepWindow) steps_.pop_front();
  }
  Rank& r = ranks_[rank];
  if (!r.heard || progress != r.progress || phase != r.phase) {
    // An interval between two moves of a training rank's counter: what a
    // rank of this job has shown it may take (in this period).
    if (r.heard && r.phase == pb::PHASE_TRAINING && phase == pb::PHASE_TRAINING) {
      int64_t& longest = longest_gap_ms_[PeriodOf(r.stepped)];
      longest = std::max(longest, now_ms - r.moved_ms);
    }
    r.moved_ms = now_ms;
  }
  r.heard = true;
  r.phase = phase;
  r.progress = progress;
  r.waiting = waiting;
  if (step >= 0) {
    r.stepped = true;
    r.last_step = std::max(r.last_step, step);
  }
}

void HangWatch::Exited(uint32_t rank) {
  if (rank < ranks_.size()) ranks_[rank].exited = true;
}

std::optional<HangWatch::Verdict> HangWatch::Check(int64_t now_ms, bool peek) {
  if (judged_) return std::nullopt;
  auto judged = [&](const Rank& r) { return r.heard && !r.exited && r.phase == pb::PHASE_TRAINING; };
  // Every training rank stopped past its deadline (while one moves, the
  // others wait for a live peer); when none of them waits for a peer,
  // kSlowdownFactor times past it.
  // (Two deadlines, computed once a check: not a median per rank per tick.)
  const int64_t deadline_of[2] = {Deadline(false), Deadline(true)};
  std::vector<uint32_t> stopped, busy, waiting;
  for (uint32_t q = 0; q < ranks_.size(); ++q) {
    const Rank& r = ranks_[q];
    if (!judged(r)) continue;
    if (now_ms - r.moved_ms < deadline_of[r.stepped]) return std::nullopt;
    stopped.push_back(q);
    (r.waiting ? waiting : busy).push_back(q);
  }
  if (stopped.empty()) return std::nullopt;
  const bool slowdown = waiting.empty();
  if (slowdown) {
    for (uint32_t q : stopped) {
      if (now_ms - ranks_[q].moved_ms < kSlowdownFactor * deadline_of[ranks_[q].stepped]) return std::nullopt;
    }
  }
  judged_ = !peek;
  std::vector<uint32_t> named;
  if (!busy.empty()) {
    named = busy;
  } else {  // everybody waits: the one(s) furthest behind
    auto key = [&](uint32_t q) { return std::make_tuple(ranks_[q].last_step, ranks_[q].progress); };
    auto least = key(stopped.front());
    for (uint32_t q : stopped) least = std::min(least, key(q));
    for (uint32_t q : stopped) {
      if (key(q) == least) named.push_back(q);
    }
  }
  std::string others;
  for (uint32_t q : waiting) {
    if (std::find(named.begin(), named.end(), q) == named.end()) {
      others += (others.empty() ? "" : ", ") + std::to_string(q);
    }
  }
  Verdict v;
  int64_t last_move = ranks_[stopped.front()].moved_ms;
  for (uint32_t q : stopped) last_move = std::max(last_move, ranks_[q].moved_ms);
  v.still_ms = now_ms - last_move;
  for (uint32_t q : named) {
    const Rank& r = ranks_[q];
    const int64_t silent = now_ms - r.moved_ms;
    v.stalled_ms = std::max(v.stalled_ms, silent);
    const int64_t deadline = (slowdown ? kSlowdownFactor : 1) * deadline_of[r.stepped];
    char text[160];
    std::snprintf(text, sizeof text, "no progress for %.1f s in step %lld (its counter at %llu; deadline ",
                  static_cast<double>(silent) / 1e3, static_cast<long long>(r.last_step + 1),
                  static_cast<unsigned long long>(r.progress));
    std::string why = text + Seconds(deadline) + ": " + DeadlineBasis(r.stepped) +
                      (slowdown ? ", x" + std::to_string(kSlowdownFactor) + " with every rank computing" : "") +
                      "), " +
                      (r.waiting ? "waiting for a peer like every stopped rank, and furthest behind"
                                 : "not waiting for a peer");
    if (!others.empty()) {
      why += std::string("; rank") + (others.find(',') == std::string::npos ? " " : "s ") + others +
             " wait";
    }
    v.ranks.push_back({q, silent, r.progress, r.waiting, r.last_step + 1, deadline, std::move(why)});
  }
  return v;
}

}  // namespace ob::launch
