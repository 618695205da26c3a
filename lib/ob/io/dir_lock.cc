#include "ob/io/dir_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace ob::io {

Result<DirLock> DirLock::Acquire(const std::string& dir, const std::string& what) {
  const std::string path = dir + "/.lock";
  // Never through a link (one planted in a shared directory, to a file of
  // root's, would be truncated and written), nor a FIFO or a device.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  if (fd < 0 && errno == ELOOP) {
    return Status::Config(path + ": is a symbolic link, not the lock file this directory's jobs make; remove it");
  }
  if (fd < 0) return Status::IoErr(path + ": cannot create the lock file: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::Config(path + ": is not a regular file, not the lock file this directory's jobs make; remove it");
  }
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  if (::fcntl(fd, F_OFD_SETLK, &fl) != 0) {
    const int e = errno;
    if (e != EAGAIN && e != EACCES) {
      ::close(fd);
      return Status::IoErr(path + ": cannot lock: " + std::strerror(e));
    }
    char buf[512] = {0};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    for (char& c : holder) {  // it came from a file anyone with access could write
      if (c < 0x20 || c > 0x7e) c = '?';
    }
    return Status::Config(dir + " is in use by another process" +
                          (holder.empty() ? std::string() : " (" + holder + ")"));
  }
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::string line = "host " + std::string(host) + " pid " + std::to_string(::getpid()) +
                           ": " + what + "\n";
  DirLock lock;
  lock.fd_ = fd;
  if (::ftruncate(fd, 0) == 0 && ::pwrite(fd, line.data(), line.size(), 0) == static_cast<ssize_t>(line.size()) &&
      ::fsync(fd) == 0) {
    lock.line_ = line.substr(0, line.size() - 1);
  }  // else the lock holds all the same; only the next contender's message is poorer
  return lock;
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

DirLock::DirLock(DirLock&& other) noexcept : fd_(other.fd_), line_(std::move(other.line_)) { other.fd_ = -1; }

DirLock& DirLock::operator=(DirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    line_ = std::move(other.line_);
    other.fd_ = -1;
  }
  return *this;
}

}  // namespace ob::io
