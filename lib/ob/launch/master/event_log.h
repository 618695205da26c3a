// RUN_DIR/events.log: the master's record of every detection and decision,
// one line each: "2026-11-21T10:00:01.250Z +12.345s KIND TEXT" (UTC wall
// time, seconds since the log was made, a one-word kind, key=value details).
// Lines are appended with one write(2) each, so a crash never leaves half a
// line in the middle of the file. Not thread-safe: the master's loop owns it.
#pragma once

#include <cstdint>
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
  // "" while every line was written; else "PATH lacks N of its M lines, the
  // first at TIME: ERROR", for a warning at the end of the run.
  std::string lost() const { return loss_.Describe(path_); }

 private:
  int fd_ = -1;
  int64_t start_ms_;
  std::string path_;
  io::AppendLoss loss_;
};

}  // namespace ob::launch
