// Internal to the network profile (network.cc, net_agent.cc): the text-line
// channel between coordinator and agents, and small helpers. Not a public API.
#pragma once

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "ob/watch/stats.h"

namespace ob::profile::net_io {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxLine = 4096;                // longest protocol line accepted

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

inline std::vector<std::string> Words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> w;
  for (std::string s; in >> s;) w.push_back(s);
  return w;
}

// write() all of `data`; a closed peer is an error (EPIPE), never a SIGPIPE.
inline bool WriteAll(int fd, const void* data, size_t n) {
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  const char* p = static_cast<const char*>(data);
  bool ok = true;
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      ok = false;
      break;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  if (!ok && errno == EPIPE) {
    timespec zero{0, 0};
    sigtimedwait(&pipe_set, nullptr, &zero);  // consume the pending SIGPIPE
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return ok;
}

inline bool WriteLine(int fd, const std::string& line) {
  std::string s = line + "\n";
  return WriteAll(fd, s.data(), s.size());
}

// Buffered line reader over one descriptor, with an optional deadline.
class LineReader {
 public:
  explicit LineReader(int fd) : fd_(fd) {}
  enum Outcome { kLine, kEof, kTimeout, kError };
  Outcome Read(std::string* line, Clock::time_point deadline) {
    for (;;) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        *line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return kLine;
      }
      if (buf_.size() > kMaxLine) return kError;
      auto left = deadline - Clock::now();
      if (left <= Clock::duration::zero()) return kTimeout;
      pollfd p{fd_, POLLIN, 0};
      int ms = static_cast<int>(std::min<int64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1, 1 << 30));
      int r = ::poll(&p, 1, ms);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return kError;
      if (r == 0) continue;  // re-check the deadline
      char tmp[4096];
      ssize_t n = ::read(fd_, tmp, sizeof tmp);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return kError;
      if (n == 0) return kEof;
      buf_.append(tmp, static_cast<size_t>(n));
    }
  }

 private:
  int fd_;
  std::string buf_;
};

inline std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

}  // namespace ob::profile::net_io
