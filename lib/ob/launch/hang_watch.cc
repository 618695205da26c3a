#include "ob/launch/hang_watch.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "ob/metrics.pb.h"

namespace ob::launch {

void HangWatch::Reset(size_t ranks) {
  ranks_.assign(ranks, Rank{});
  judged_ = false;
}

int64_t HangWatch::Limit() const {
  if (steps_.empty()) return o_.timeout_ms;
  std::vector<double> v(steps_.begin(), steps_.end());
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return std::max(o_.timeout_ms, static_cast<int64_t>(kStepsOfSilence * v[v.size() / 2] * 1e3));
}

void HangWatch::Record(uint32_t rank, int phase, uint64_t progress, bool waiting, int64_t step,
                       int64_t now_ms, double step_seconds) {
  if (rank >= ranks_.size()) return;
  if (step_seconds > 0) {
    steps_.push_back(step_seconds);
    if (steps_.size() > kStepWindow) steps_.pop_front();
  }
  Rank& r = ranks_[rank];
  if (!r.heard || progress != r.progress || phase != r.phase) r.moved_ms = now_ms;
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
  bool hung = false;
  const int64_t after_first = Limit();
  for (const Rank& r : ranks_) {
    if (!judged(r)) continue;
    const int64_t limit = r.stepped ? after_first : std::max(o_.first_step_timeout_ms, after_first);
    if (now_ms - r.moved_ms >= limit) hung = true;
  }
  if (!hung) return std::nullopt;
  judged_ = !peek;
  const int64_t quiet = std::min(o_.quiet_ms, o_.timeout_ms);
  std::vector<uint32_t> stopped, busy, waiting;
  for (uint32_t q = 0; q < ranks_.size(); ++q) {
    const Rank& r = ranks_[q];
    if (!judged(r) || now_ms - r.moved_ms < quiet) continue;
    stopped.push_back(q);
    (r.waiting ? waiting : busy).push_back(q);
  }
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
  for (uint32_t q : named) {
    const Rank& r = ranks_[q];
    const int64_t silent = now_ms - r.moved_ms;
    v.stalled_ms = std::max(v.stalled_ms, silent);
    char text[160];
    std::snprintf(text, sizeof text, "no progress for %.1f s in step %lld (its counter at %llu), %s",
                  static_cast<double>(silent) / 1e3, static_cast<long long>(r.last_step + 1),
                  static_cast<unsigned long long>(r.progress),
                  r.waiting ? "waiting for a peer like every stopped rank, and furthest behind"
                            : "not waiting for a peer");
    std::string why = text;
    if (!others.empty()) {
      why += std::string("; rank") + (others.find(',') == std::string::npos ? " " : "s ") + others +
             " wait";
    }
    v.ranks.push_back({q, silent, r.progress, r.waiting, r.last_step + 1, std::move(why)});
  }
  return v;
}

}  // namespace ob::launch
