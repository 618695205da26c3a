#include "ob/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>

#include <google/protobuf/stubs/logging.h>
#include <mutex>

#include "ob/io/file.h"

namespace ob::log {
namespace {

std::atomic<Level> g_level{Level::kInfo};
std::string g_prefix = "ob";   // written once by Init before threads start
int g_file_fd = -1;
std::string g_file_path;    // SetFile's, for FileLost
// The lines g_file_fd did not take; never destroyed (threads may log at exit).
io::AppendLoss& FileLoss() {
  static auto* loss = new io::AppendLoss;
  return *loss;
}

const char* LevelName(Level l) {
  switch (l) {
    case Level::kError: return "error";
    case Level::kWarn: return "warning";
    case Level::kInfo: return "info";
    case Level::kDebug: return "debug";
  }
  return "?";
}

// protobuf reports what it rejects (e.g. invalid UTF-8) on stderr by itself;
// our readers already turn a rejected message into one clear error, so its
// lines go to the debug log instead.
void ProtobufLog(google::protobuf::LogLevel level, const char* file, int line,
                 const std::string& message) {
  if (GetLevel() >= Level::kDebug) Write(Level::kDebug, "protobuf: " + message);
}

}  // namespace

void Init(const std::string& role, int rank, const std::string& host_name) {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '?';
  g_prefix = (host_name.empty() ? std::string(host) : host_name) + ":" + std::to_string(getpid()) + ":" + role;
  if (rank >= 0) g_prefix += "[" + std::to_string(rank) + "]";
  google::protobuf::SetLogHandler(&ProtobufLog);
}

void SetLevel(Level level) { g_level = level; }
Level GetLevel() { return g_level; }

bool SetFile(const std::string& path) {
  if (g_file_fd >= 0) close(g_file_fd);
  g_file_fd = -1;
  g_file_path = path;
  FileLoss().Reset();
  if (path.empty()) return true;
  g_file_fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  return g_file_fd >= 0;
}

std::string Printable(const std::string& text, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 3);
  for (size_t i = 0; i < text.size() && i < max_bytes; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    out += c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?';
  }
  if (text.size() > max_bytes) out += "...";
  return out;
}

void Write(Level level, const std::string& message) {
  std::string line = g_prefix + ": " + LevelName(level) + ": " + message + "\n";
  ssize_t unused = write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
  if (g_file_fd < 0) return;
  if (FileLoss().Count(write(g_file_fd, line.data(), line.size()), line.size())) {
    // Said on stderr at once (not through Write: the file would fail again).
    const std::string warn = g_prefix + ": " + LevelName(Level::kWarn) + ": " + g_file_path +
                             ": cannot append to the log: " + FileLoss().error() +
                             "; its lines go to stderr only, and the end says what it lacks\n";
    unused = write(STDERR_FILENO, warn.data(), warn.size());
  }
}

std::string FileLost() { return FileLoss().Describe(g_file_path); }

}  // namespace ob::log
