#include "ob/clock.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace ob {
namespace {

std::tm Utc(int64_t unix_ms) {
  const std::time_t secs = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  return tm;
}

}  // namespace

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int64_t UnixMs() {
  // $OB_TEST_CLOCK_SKEW_MS: a process whose host's clock is that far off,
  // for the tests of hosts whose clocks disagree (launch_clock_skew).
  static const int64_t skew = [] {
    const char* s = std::getenv("OB_TEST_CLOCK_SKEW_MS");
    return s != nullptr ? static_cast<int64_t>(std::atoll(s)) : int64_t{0};
  }();
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
             .count() +
         skew;
}

std::string FormatUnixMs(int64_t unix_ms) {
  const std::tm tm = Utc(unix_ms);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(unix_ms % 1000));
  return buf;
}

std::string FormatUtcSeconds(int64_t unix_ms) {
  const std::tm tm = Utc(unix_ms);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

}  // namespace ob
