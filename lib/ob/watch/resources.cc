#include "ob/watch/resources.h"

#include <cstdio>

#include "ob/watch/events.h"

namespace ob::watch {
namespace {

constexpr size_t kMinBaseline = 10;  // steps before a drop can be judged
constexpr int kBlocks = 5;           // memory window blocks

}  // namespace

void ThroughputDetector::OnGeneration() {
  baseline_.Clear();
  vote_.Reset();
  have_last_ = false;
  steps_ = 0;
  active_ = false;
  clear_run_ = 0;
}

void ThroughputDetector::OnStep(const RankState& r, int64_t now_ms, std::vector<pb::Event>* out) {
  if (have_last_ && r.last_step <= last_step_) return;  // the step's first report only
  have_last_ = true;
  last_step_ = r.last_step;
  if (++steps_ <= static_cast<uint64_t>(o_.warmup_steps)) return;
  const double tps = r.tokens_per_second;
  if (!(tps > 0)) return;
  if (baseline_.size() >= kMinBaseline) {
    const double median = baseline_.median();
    const double ratio = tps / median;
    const bool low = ratio < 1 - o_.throughput_drop;
    vote_.Push(low);
    clear_run_ = low ? 0 : clear_run_ + 1;
    if (active_ && clear_run_ >= vote_.n()) active_ = false;
    if (!active_ && vote_.Confirmed()) {
      active_ = true;
      const int votes = vote_.hits();
      vote_.Reset();
      char msg[400];
      std::snprintf(msg, sizeof msg,
                    "throughput fell to %.0f tokens/s at step %llu (reported by %s rank %u), "
                    "%.2fx the median %.0f of the previous %zu steps (%d of the last %d steps "
                    "below %.2fx)",
                    tps, static_cast<unsigned long long>(r.last_step), r.host.c_str(), r.rank,
                    ratio, median, baseline_.size(), votes, vote_.n(), 1 - o_.throughput_drop);
      pb::Event e = MakeEvent(pb::EVENT_THROUGHPUT_DROP, pb::SEVERITY_WARNING, "", -1,
                              r.last_step, r.generation, now_ms, msg);
      auto& ev = *e.mutable_evidence();
      ev["tokens_per_second"] = tps;
      ev["median_tokens_per_second"] = median;
      ev["ratio"] = ratio;
      ev["threshold_ratio"] = 1 - o_.throughput_drop;
      ev["votes"] = votes;
      ev["window"] = static_cast<double>(baseline_.size());
      ev["step_seconds"] = r.step_seconds;
      out->push_back(std::move(e));
    }
  }
  baseline_.Push(tps);
}

void MemoryDetector::OnStep(RankState& r, int64_t now_ms, std::vector<pb::Event>* out) {
  if (r.memory_bytes == 0 || r.steps_seen <= static_cast<uint64_t>(o_.warmup_steps)) return;
  r.memory.Push(static_cast<double>(r.memory_bytes));
  r.memory_steps_since_report++;
  if (!r.memory.full() || r.memory.size() < static_cast<size_t>(kBlocks)) return;
  const std::vector<double> v = r.memory.values();
  const size_t block = v.size() / kBlocks;
  std::vector<double> medians;
  for (int b = 0; b < kBlocks; ++b) {
    const size_t from = v.size() - (kBlocks - b) * block;  // the newest kBlocks·block values
    medians.push_back(Median({v.begin() + static_cast<std::ptrdiff_t>(from),
                              v.begin() + static_cast<std::ptrdiff_t>(from + block)}));
  }
  for (int b = 1; b < kBlocks; ++b)
    if (!(medians[b] > medians[b - 1])) return;
  const double first = medians.front(), last = medians.back();
  if (!(first > 0) || last < first * (1 + o_.memory_growth)) return;
  if (r.memory_reported_level > 0 &&
      (last < r.memory_reported_level * (1 + o_.memory_growth) ||
       r.memory_steps_since_report < static_cast<uint64_t>(o_.memory_window)))
    return;
  r.memory_reported_level = last;
  r.memory_steps_since_report = 0;
  const double growth = last / first - 1;
  char msg[400];
  std::snprintf(msg, sizeof msg,
                "%s rank %u memory grew %.0f%% over the last %zu steps to step %llu "
                "(%.3f GiB to %.3f GiB), rising in every fifth of them",
                r.host.c_str(), r.rank, growth * 100, v.size(),
                static_cast<unsigned long long>(r.last_step), first / (1 << 30), last / (1 << 30));
  pb::Event e = MakeEvent(pb::EVENT_MEMORY_GROWTH, pb::SEVERITY_WARNING, r.host,
                          static_cast<int>(r.rank), r.last_step, r.generation, now_ms, msg);
  auto& ev = *e.mutable_evidence();
  ev["bytes_first"] = first;
  ev["bytes_last"] = last;
  ev["growth"] = growth;
  ev["threshold_growth"] = o_.memory_growth;
  ev["window"] = static_cast<double>(v.size());
  ev["bytes_now"] = static_cast<double>(r.memory_bytes);
  out->push_back(std::move(e));
}

}  // namespace ob::watch
