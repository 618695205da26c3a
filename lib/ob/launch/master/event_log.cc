#include "ob/launch/master/event_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "ob/clock.h"
#include "ob/log.h"

namespace ob::launch {

EventLog::EventLog() : start_ms_(UnixMs()) {}

EventLog::~EventLog() {
  if (fd_ >= 0) ::close(fd_);
}

Status EventLog::Open(const std::string& path) {
  path_ = path;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) return Status::IoErr(path + ": cannot open: " + std::strerror(errno));
  return Status::Ok();
}

void EventLog::Write(const std::string& kind, const std::string& text) {
  const int64_t now = UnixMs();
  char since[32];
  std::snprintf(since, sizeof since, " +%.3fs ", (now - start_ms_) / 1e3);
  const std::string line = FormatUnixMs(now) + since + kind + " " + text + "\n";
  if (on_line_) on_line_(line);
  WriteLine(line);
}

void EventLog::WriteLine(const std::string& line) {
  if (fd_ < 0) return;
  if (loss_.Count(::write(fd_, line.data(), line.size()), line.size())) {
    OB_LOG(Warn) << path_ << ": cannot append an event: " << loss_.error()
                 << "; training goes on, and the end of the run says what the log lacks";
  }
}

}  // namespace ob::launch
