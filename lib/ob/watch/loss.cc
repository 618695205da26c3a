#include "ob/watch/loss.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "ob/watch/events.h"

namespace ob::watch {
namespace {

constexpr size_t kMinSpikeHistory = 20;     // losses before a spike can be judged
constexpr double kMinRelativeSigma = 0.01;  // σ floor: 1% of the median loss
constexpr uint64_t kFiniteMemory = 4096;    // finite steps kept for episodes

std::string LossWord(double v) {
  if (std::isnan(v)) return "NaN";
  return v > 0 ? "+Inf" : "-Inf";
}

}  // namespace

void LossDetector::Raise(uint64_t step, Step& s, bool decided_later, int64_t now_ms,
                         std::vector<pb::Event>* out) {
  if (s.raised) return;
  s.raised = true;
  if (raised_any_ && step != last_raised_) {
    // The same episode unless a finite loss lies between the two steps.
    const uint64_t lo = std::min(step, last_raised_), hi = std::max(step, last_raised_);
    const auto it = finite_steps_.upper_bound(lo);
    const bool finite_between = it != finite_steps_.end() && *it < hi;
    if (!finite_between) {
      last_raised_ = std::max(last_raised_, step);
      return;
    }
  } else if (raised_any_) {
    return;
  }
  raised_any_ = true;
  last_raised_ = std::max(last_raised_, step);
  char msg[400];
  std::snprintf(msg, sizeof msg, "loss is %s at step %llu (reported by %s rank %d, generation %llu)",
                LossWord(s.loss).c_str(), static_cast<unsigned long long>(step), s.host.c_str(),
                s.rank, static_cast<unsigned long long>(s.generation));
  pb::Event e = MakeEvent(pb::EVENT_LOSS_NAN, pb::SEVERITY_CRITICAL, s.host, s.rank, step,
                          s.generation, now_ms, msg);
  auto& ev = *e.mutable_evidence();
  ev["loss"] = s.loss;
  ev["grad_norm"] = s.grad_norm;
  ev["ranks_non_finite"] = s.non_finite;
  ev["ranks_finite"] = s.finite;
  ev["decided_after_step"] = decided_later ? 1 : 0;
  out->push_back(std::move(e));
}

void LossDetector::DecideBefore(uint64_t step, int64_t now_ms, std::vector<pb::Event>* out) {
  for (auto it = steps_.begin(); it != steps_.end() && it->first < step;) {
    Step& s = it->second;
    if (s.finite == 0 && s.non_finite > 0) Raise(it->first, s, true, now_ms, out);
    it = steps_.erase(it);
  }
}

void LossDetector::OnStep(const RankState& r, const pb::Metrics& m, int64_t now_ms,
                          std::vector<pb::Event>* out) {
  const uint64_t step = m.step();
  // Every rank has finished step k before any finishes k + 1; one step
  // more leaves room for records still on their way.
  if (step >= 2) DecideBefore(step - 1, now_ms, out);
  const double loss = m.loss();
  Step& s = steps_[step];
  if (std::isfinite(loss)) {
    s.finite++;
    finite_steps_.insert(step);
    while (!finite_steps_.empty() && *finite_steps_.begin() + kFiniteMemory < step)
      finite_steps_.erase(finite_steps_.begin());
    Spike(r, loss, now_ms, out);
    return;
  }
  if (s.non_finite++ == 0) {
    s.loss = loss;
    s.grad_norm = m.grad_norm();
    s.host = r.host;
    s.rank = static_cast<int>(r.rank);
    s.generation = r.generation;
  }
  // A rank that carried a finite loss before carries the global one: its
  // non-finite loss is news even when another rank's is finite.
  if (r.loss_seen_finite) {
    s.loss = loss;
    s.host = r.host;
    s.rank = static_cast<int>(r.rank);
    Raise(step, s, false, now_ms, out);
  }
}

void LossDetector::OnGeneration(int64_t now_ms, std::vector<pb::Event>* out) {
  Finish(now_ms, out);
  finite_steps_.clear();
  raised_any_ = false;
  last_raised_ = 0;
}

void LossDetector::Finish(int64_t now_ms, std::vector<pb::Event>* out) {
  DecideBefore(UINT64_MAX, now_ms, out);
}

void LossDetector::Spike(const RankState& r, double loss, int64_t now_ms,
                         std::vector<pb::Event>* out) {
  // One value per step: a recovery redoes a step, a rollback several, and
  // their losses count once.
  if (have_last_ && r.last_step <= last_step_) return;
  have_last_ = true;
  last_step_ = r.last_step;
  if (window_.size() >= std::min<size_t>(kMinSpikeHistory, static_cast<size_t>(o_.loss_window))) {
    const double median = window_.median();
    const double mad = Mad(window_.values(), median);
    const double sigma = std::max({kMadToSigma * mad, kMinRelativeSigma * std::fabs(median), 1e-12});
    const double z = (loss - median) / sigma;
    if (z >= o_.spike_z && !spike_active_) {
      spike_active_ = true;
      char msg[400];
      std::snprintf(msg, sizeof msg,
                    "loss spiked to %.4g at step %llu (%s rank %u): %.1f robust sigmas above the "
                    "median %.4g of the last %zu steps",
                    loss, static_cast<unsigned long long>(r.last_step), r.host.c_str(), r.rank, z,
                    median, window_.size());
      pb::Event e = MakeEvent(pb::EVENT_LOSS_SPIKE, pb::SEVERITY_WARNING, r.host,
                              static_cast<int>(r.rank), r.last_step, r.generation, now_ms, msg);
      auto& ev = *e.mutable_evidence();
      ev["loss"] = loss;
      ev["median"] = median;
      ev["mad"] = mad;
      ev["sigma"] = sigma;
      ev["z"] = z;
      ev["threshold_z"] = o_.spike_z;
      ev["window"] = static_cast<double>(window_.size());
      out->push_back(std::move(e));
    } else if (z < o_.spike_z / 2) {
      spike_active_ = false;
    }
  }
  window_.Push(loss);
}

}  // namespace ob::watch
