// RUN_DIR/events.log: the master's record of every detection and decision,
// one line each: "2026-11-21T10:00:01.250Z +12.345s KIND TEXT" (UTC wall
// time, seconds since the log was made, a one-word kind, key=value details).
// Lines are appended with one write(2) each, so a crash never leaves half a
// line in the middle of the file. Not thread-safe: the master's loop owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "ob/io/file.h"
#include "ob/status.h"

namespace ob::launch {

class EventLog {
 public:
  EventLog();
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  Status Open(const std::string& path);
  // Before Open, or when a write fails, lines are dropped: the log is a
  // record, never a reason to stop training. The first line lost is
  // warned of at once, and lost() says what the log lacks.
  void Write(const std::string& kind, const std::string& text);
  // A line as another master wrote it (MasterSync.events), whole.
  void WriteLine(const std::string& line);
  // Each line written, as written (the master mirrors them to its standby).
  void OnLine(std::function<void(const std::string&)> f) { on_line_ = std::move(f); }
  // The run's start, which the "+S.SSSs" of each line counts from.
  int64_t start_ms() const { return start_ms_; }
  void set_start_ms(int64_t ms) { start_ms_ = ms; }
  // "" while every line was written; else "PATH lacks N of its M lines, the
  // first at TIME: ERROR", for a warning at the end of the run.
  std::string lost() const { return loss_.Describe(path_); }

 private:
  int fd_ = -1;
  int64_t start_ms_;
  std::string path_;
  io::AppendLoss loss_;
  std::function<void(const std::string&)> on_line_;
};

}  // namespace ob::launch
