#include "ob/io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ob::io {
namespace {

std::string Errno() { return std::strerror(errno); }

Status WriteAll(int fd, const std::string& data, const std::string& name) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::IoErr(name + ": write failed: " + Errno());
    off += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

std::string DisplayName(const std::string& path, bool output) {
  if (path == "-" || path.empty()) return output ? "<stdout>" : "<stdin>";
  return path;
}

Result<std::string> ReadFile(const std::string& path) {
  const std::string name = DisplayName(path);
  int fd = (path == "-") ? STDIN_FILENO : open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::NoInput(name + ": cannot open: " + Errno());
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    close(fd);
    return Status::NoInput(name + ": is a directory");
  }
  std::string out;
  if (S_ISREG(st.st_mode)) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::string err = Errno();
      if (fd != STDIN_FILENO) close(fd);
      return Status::NoInput(name + ": read failed: " + err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  if (fd != STDIN_FILENO) close(fd);
  return out;
}

Status WriteFile(const std::string& path, const std::string& data) {
  if (path == "-" || path.empty()) return WriteAll(STDOUT_FILENO, data, "<stdout>");
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IoErr(path + ": cannot create: " + Errno());
  Status s = WriteAll(fd, data, path);
  if (s.ok() && fsync(fd) != 0) s = Status::IoErr(path + ": fsync failed: " + Errno());
  if (close(fd) != 0 && s.ok()) s = Status::IoErr(path + ": close failed: " + Errno());
  if (s.ok() && rename(tmp.c_str(), path.c_str()) != 0)
    s = Status::IoErr(path + ": rename failed: " + Errno());
  if (!s.ok()) unlink(tmp.c_str());
  return s;
}

bool IsTerminal(int fd) { return isatty(fd) == 1; }
bool StdinIsTerminal() { return IsTerminal(STDIN_FILENO); }
bool StdoutIsTerminal() { return IsTerminal(STDOUT_FILENO); }

}  // namespace ob::io
