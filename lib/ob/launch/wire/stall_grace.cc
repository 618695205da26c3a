#include "ob/launch/wire/stall_grace.h"

namespace ob::launch {

int64_t StallGrace::Tick(int64_t now_ms) {
  if (last_tick_ms_ < 0) {
    last_tick_ms_ = steady_since_ms_ = now_ms;
    return 0;
  }
  const int64_t gap = gap_ms_ = now_ms - last_tick_ms_;
  last_tick_ms_ = now_ms;
  if (gap < kStallMs) return 0;
  if (now_ms - gap - steady_since_ms_ >= kSteadyMs) grace_until_ms_ = now_ms + kGraceMs;
  steady_since_ms_ = now_ms;
  return gap;
}

}  // namespace ob::launch
