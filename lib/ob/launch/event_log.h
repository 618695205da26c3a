// RUN_DIR/events.log: the master's record of every detection and decision,
// one line each: "2026-11-21T10:00:01.250Z +12.345s KIND TEXT" (UTC wall
// time, seconds since the log was made, a one-word kind, key=value details).
// Lines are appended with one write(2) each, so a crash never leaves half a
// line in the middle of the file. Not thread-safe: the master's loop owns it.
#pragma once

#include <cstdint>
#include <string>

#include "ob/status.h"

namespace ob::launch {

class EventLog {
 public:
  EventLog();
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  Status Open(const std::string& path);
  // Before Open, or after a failed write, lines are dropped: the log is a
  // record, never a reason to stop training.
  void Write(const std::string& kind, const std::string& text);

 private:
  int fd_ = -1;
  int64_t start_ms_;
};

}  // namespace ob::launch
