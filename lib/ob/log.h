// Logging to stderr, prefixed `host:pid:role[rank]` (design.md), with levels.
//
// Thread-safe: each line is written with one write(2). The prefix and level
// are process-wide and set once at start-up by the tool's main.
#pragma once

#include <sstream>
#include <string>

namespace ob::log {

enum class Level { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// role: "profile", "master", "agent", "worker"; rank < 0 omits "[rank]";
// host "" is this machine's hostname (an agent passes the name the master
// knows it by, which differs under --rsh local).
void Init(const std::string& role, int rank = -1, const std::string& host = "");
void SetLevel(Level level);
Level GetLevel();
// Also append every line to this file (in addition to stderr); "" disables.
bool SetFile(const std::string& path);
// "" while the file of SetFile took every line; else "PATH lacks N of its M
// lines, the first at TIME: ERROR" (a full disk): said at the end of a tool.
std::string FileLost();

void Write(Level level, const std::string& message);

// Text that came from a peer (a host name in a Hello, a reject reason), fit
// for a log line: every byte outside printable ASCII becomes '?', and text
// longer than `max_bytes` is cut and ends in "...". Pure.
std::string Printable(const std::string& text, size_t max_bytes = 128);

class Line {
 public:
  explicit Line(Level level) : level_(level) {}
  ~Line() { Write(level_, os_.str()); }
  template <typename T>
  Line& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  Level level_;
  std::ostringstream os_;
};

}  // namespace ob::log

// OB_LOG(Warn) << ...; OB_LOG_AT(level) at a level chosen at run time (an
// ob::log::Level).
#define OB_LOG_AT(level) \
  if ((level) > ::ob::log::GetLevel()) {} else ::ob::log::Line(level)
#define OB_LOG(level) OB_LOG_AT(::ob::log::Level::k##level)
