// Progress lines on stderr (progress.h).
#include "ob/cli/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "ob/io/file.h"

namespace ob::cli {
namespace {

// OB_PROGRESS_SECONDS when it is a non-negative number, else 5.
double IntervalFromEnv() {
  const char* v = std::getenv("OB_PROGRESS_SECONDS");
  if (v == nullptr || *v == '\0') return 5;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  return (end != nullptr && *end == '\0' && std::isfinite(s) && s >= 0) ? s : 5;
}

}  // namespace

std::string FormatDuration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char buf[48];
  const long long t = std::llround(s);
  if (t < 60) {
    std::snprintf(buf, sizeof buf, "%lld s", t);
  } else if (t < 3600) {
    std::snprintf(buf, sizeof buf, "%lld min %02lld s", t / 60, t % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lld h %02lld min", t / 3600, t / 60 % 60);
  }
  return buf;
}

ProgressLine::ProgressLine(std::string tool, bool quiet)
    : tool_(std::move(tool)),
      on_(!quiet),
      terminal_(io::IsTerminal(STDERR_FILENO)),
      interval_(IntervalFromEnv()),
      start_(Clock::now()),
      last_(start_) {}

ProgressLine::~ProgressLine() {
  if (drawn_ && terminal_) {
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
  }
}

void ProgressLine::Update(double done, double total, const std::string& what) {
  if (!on_) return;
  const auto now = Clock::now();
  const double since_last = std::chrono::duration<double>(now - last_).count();
  if (terminal_ ? (drawn_ && since_last < 0.1) : since_last < interval_) return;
  last_ = now;
  std::string line = tool_ + ": " + what;
  if (total > 0) {
    const double share = std::min(1.0, std::max(0.0, done / total));
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    char pct[16];
    std::snprintf(pct, sizeof pct, "%.0f%%", 100 * share);
    line += std::string(" (") + pct;
    if (share > 0) line += ", " + FormatDuration(elapsed * (1 - share) / share) + " left";
    line += ")";
  }
  if (terminal_) {
    std::fprintf(stderr, "\r%s\033[K", line.c_str());
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace ob::cli
