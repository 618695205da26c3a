// Progress of long work on stderr (STYLE "Tools people enjoy"): how much is
// done, of how much, and the time left. On a terminal one line, redrawn at
// most ten times a second and cleared at the end; otherwise (a log, a
// pipe, a CI job) a plain line every few seconds: OB_PROGRESS_SECONDS, 5
// by default, 0 for a line at every update. Nothing when quiet.
// Thread-compatible; Update is cheap when nothing is printed, so callers
// report as often as they like.
#pragma once

#include <chrono>
#include <string>

namespace ob::cli {

class ProgressLine {
 public:
  // `tool` heads each line ("ob-data").
  ProgressLine(std::string tool, bool quiet);
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // `done` of `total` (in any unit; total <= 0: unknown, no share and no
  // time left), `what` saying it in words ("12.0 MiB of 40.0 MiB, 3,021
  // tokens").
  void Update(double done, double total, const std::string& what);
  // Whether anything is shown at all (not quiet).
  bool on() const { return on_; }

 private:
  using Clock = std::chrono::steady_clock;
  std::string tool_;
  bool on_, terminal_;
  double interval_;  // seconds between plain lines
  Clock::time_point start_, last_;
  bool drawn_ = false;
};

// "45 s", "3 min 05 s", "2 h 07 min": a time left, for progress lines.
std::string FormatDuration(double seconds);

}  // namespace ob::cli
