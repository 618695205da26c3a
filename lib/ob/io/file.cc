#include "ob/io/file.h"

#include <fcntl.h>
#include <poll.h>
#include <ftw.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "ob/clock.h"
#include "ob/log.h"

namespace ob::io {

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

Result<std::string> RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::getrandom(&raw[got], bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::IoErr("getrandom: " + Errno());
    got += static_cast<size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char b : raw) {
    hex += kHex[b >> 4];
    hex += kHex[b & 15];
  }
  return hex;
}

std::string DisplayName(const std::string& path, bool output) {
  if (path == "-" || path.empty()) return output ? "<stdout>" : "<stdin>";
  return path;
}

namespace {
std::string FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}
}  // namespace

Result<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return Status::NoInput(path + ": cannot open: " + Errno());
  struct stat st {};
  Status bad;
  if (fstat(fd, &st) != 0) {
    bad = Status::IoErr(path + ": cannot stat: " + Errno());
  } else if (!S_ISREG(st.st_mode)) {
    bad = Status::DataErr(path + ": not a regular file (" + FileKind(st.st_mode) + ")");
  } else if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    bad = Status::DataErr(path + ": " + std::to_string(st.st_size) + " bytes, more than such a file holds (" +
                          std::to_string(max_bytes) + " at most)");
  }
  std::string out;
  while (bad.ok()) {
    char buf[1 << 16];
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) bad = Status::IoErr(path + ": read failed: " + Errno());
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) bad = Status::DataErr(path + ": grew past " + std::to_string(max_bytes) + " bytes");
  }
  close(fd);
  if (!bad.ok()) return bad;
  return out;
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

namespace {

bool StartsWith(const std::string& s, const char* prefix) {
  return s.compare(0, std::strlen(prefix), prefix) == 0;
}

// /dev/stdout, /dev/fd/3, /proc/self/fd/3, /proc/4711/fd/3: a descriptor
// the caller already holds, whatever it points at.
bool IsDescriptorPath(const std::string& path) {
  if (path == "/dev/stdout" || path == "/dev/stderr" || StartsWith(path, "/dev/fd/")) return true;
  if (!StartsWith(path, "/proc/")) return false;
  const size_t fd = path.find("/fd/", 6);
  return fd != std::string::npos && path.find('/', fd + 4) == std::string::npos;
}

// The directory part of `path` ("." for a bare name), for relative links.
std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

Result<OutputTarget> ResolveOutput(const std::string& path) {
  if (IsDescriptorPath(path)) return OutputTarget{path, false};
  // Follow links by hand: a dangling one names the file to create.
  std::string at = path;
  for (int hops = 0;; ++hops) {
    struct stat ls;
    if (lstat(at.c_str(), &ls) != 0) {
      if (errno == ENOENT) return OutputTarget{at, true};  // a new file
      return Status::IoErr(path + ": cannot inspect: " + Errno());
    }
    if (!S_ISLNK(ls.st_mode)) {
      if (S_ISDIR(ls.st_mode)) return Status::IoErr(path + ": is a directory");
      if (!S_ISREG(ls.st_mode)) return OutputTarget{at, false};  // device, FIFO, socket
      return OutputTarget{at, true};
    }
    if (hops >= 40) return Status::IoErr(path + ": too many levels of symbolic links");
    char buf[4096];
    const ssize_t n = readlink(at.c_str(), buf, sizeof buf - 1);
    if (n < 0) return Status::IoErr(path + ": cannot read the link: " + Errno());
    std::string target(buf, static_cast<size_t>(n));
    at = target[0] == '/' ? target : DirName(at) + "/" + target;
  }
}

Result<int> OpenWriteThrough(const std::string& path) {
  // A FIFO's open waits for a reader: say so, rather than hang in silence
  // (ob-launch --metrics FIFO before any ob-watch reads it).
  struct stat st {};
  const bool fifo = stat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
  int fd = open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC | (fifo ? O_NONBLOCK : 0));
  if (fifo && fd < 0 && errno == ENXIO) {
    OB_LOG(Info) << path << ": a FIFO that nobody reads yet; waiting for a reader (e.g. ob-watch " << path << ")";
    fd = open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  }
  if (fd < 0) return Status::IoErr(path + ": cannot open for writing: " + Errno());
  if (const int flags = fcntl(fd, F_GETFL); fifo && flags >= 0 && (flags & O_NONBLOCK) != 0) {
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);  // writes wait for the reader, as before
  }
  return fd;
}

Result<int> OpenNewStream(const std::string& path, unsigned mode, std::string* kept) {
  kept->clear();
  OB_ASSIGN_OR_RETURN(OutputTarget out, ResolveOutput(path));
  if (!out.replace) return OpenWriteThrough(out.path);
  // Bounded: each round either creates the file, reuses an empty one, or
  // moves one away; another process racing us can only make it take more.
  for (int round = 0; round < 100; ++round) {
    int fd = open(out.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, static_cast<mode_t>(mode));
    if (fd >= 0) return fd;
    if (errno != EEXIST) return Status::IoErr(path + ": cannot create: " + Errno());
    struct stat st {};
    if (stat(out.path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0) {
      fd = open(out.path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
      if (fd >= 0) return fd;
      if (errno != ENOENT) return Status::IoErr(path + ": cannot open for writing: " + Errno());
      continue;
    }
    for (int n = 1; n < 100000; ++n) {
      const std::string to = out.path + "." + std::to_string(n);
      int rc = renameat2(AT_FDCWD, out.path.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE);
      if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {  // a file system without it: link and unlink
        rc = link(out.path.c_str(), to.c_str());
        if (rc == 0 && unlink(out.path.c_str()) != 0) return Status::IoErr(path + ": cannot move: " + Errno());
      }
      if (rc == 0) {
        *kept = to;
        break;
      }
      if (errno == EEXIST) continue;
      if (errno == ENOENT) break;  // gone meanwhile: create it
      if (errno == EACCES || errno == EPERM) {
        // A file we may write in a directory we may not: after its records.
        const std::string why = Errno();
        fd = open(out.path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
        if (fd < 0) return Status::IoErr(path + ": cannot open for writing: " + Errno());
        *kept = out.path + " itself, the new records after them (" + to + " cannot be made: " + why + ")";
        return fd;
      }
      return Status::IoErr(path + ": cannot keep it as " + to + ": " + Errno());
    }
  }
  return Status::IoErr(path + ": cannot create it anew (another process keeps recreating it)");
}

namespace {

// The temporaries a signal handler deletes: fixed slots, so the handler
// touches no allocation or lock. A slot is free (0), being filled (1) or
// holds a path (2).
struct TemporarySlot {
  std::atomic<int> state{0};
  char path[PATH_MAX];
};
constexpr int kTemporarySlots = 64;
TemporarySlot g_temporaries[kTemporarySlots];
std::atomic<uint64_t> g_temporary_serial{0};

void RememberTemporary(const std::string& path) {
  if (path.size() >= PATH_MAX) return;
  for (TemporarySlot& slot : g_temporaries) {
    int free = 0;
    if (!slot.state.compare_exchange_strong(free, 1)) continue;
    std::memcpy(slot.path, path.c_str(), path.size() + 1);
    slot.state.store(2, std::memory_order_release);
    return;
  }
  // More at once than the slots hold: this one is left to its owner.
}

extern "C" void RemoveTemporariesAndDie(int sig) {
  for (TemporarySlot& slot : g_temporaries) {
    if (slot.state.load(std::memory_order_acquire) == 2) ::unlink(slot.path);
  }
  // Die of the signal (blocked while this runs: delivered on return).
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

Result<int> CreateTemporary(const std::string& target, const std::string& name, std::string* path) {
  for (int attempt = 0;; ++attempt) {
    *path = target + ".tmp." + std::to_string(getpid()) + "." + std::to_string(g_temporary_serial++);
    const int fd = open(path->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      RememberTemporary(*path);
      return fd;
    }
    if (errno != EEXIST || attempt >= 100) {
      const std::string err = Errno();
      path->clear();  // nothing of ours to remove
      return Status::IoErr(name + ": cannot create: " + err);
    }
  }
}

void ForgetTemporary(const std::string& path) {
  for (TemporarySlot& slot : g_temporaries) {
    if (slot.state.load(std::memory_order_acquire) == 2 && path == slot.path) {
      slot.state.store(0, std::memory_order_release);
      return;
    }
  }
}

void RemoveTemporariesOnSignal() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    if (sigaction(sig, nullptr, &old) != 0 || old.sa_handler == SIG_IGN) continue;
    struct sigaction sa {};
    sa.sa_handler = RemoveTemporariesAndDie;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
  }
}

Status WriteFile(const std::string& path, const std::string& data) {
  if (path == "-" || path.empty()) return WriteAll(STDOUT_FILENO, data, "<stdout>");
  OB_ASSIGN_OR_RETURN(OutputTarget out, ResolveOutput(path));
  if (!out.replace) {
    OB_ASSIGN_OR_RETURN(int fd, OpenWriteThrough(out.path));
    Status s = WriteAll(fd, data, path);
    if (close(fd) != 0 && s.ok()) s = Status::IoErr(path + ": close failed: " + Errno());
    return s;
  }
  std::string tmp;
  OB_ASSIGN_OR_RETURN(const int fd, CreateTemporary(out.path, path, &tmp));
  Status s = WriteAll(fd, data, path);
  if (s.ok() && fsync(fd) != 0) s = Status::IoErr(path + ": fsync failed: " + Errno());
  if (close(fd) != 0 && s.ok()) s = Status::IoErr(path + ": close failed: " + Errno());
  if (s.ok() && rename(tmp.c_str(), out.path.c_str()) != 0)
    s = Status::IoErr(path + ": rename failed: " + Errno());
  if (!s.ok()) unlink(tmp.c_str());
  ForgetTemporary(tmp);
  return s;
}

std::optional<FileId> RegularFileId(const std::string& path) {
  if (path.empty() || path == "-") return std::nullopt;
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return FileId{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

std::string OutputKey(const std::string& path) {
  if (path.empty() || path == "-") return "";
  if (const auto id = RegularFileId(path)) {
    return "inode " + std::to_string(id->device) + ":" + std::to_string(id->inode);
  }
  const Result<OutputTarget> target = ResolveOutput(path);
  if (!target.ok() || !target->replace) return "";
  const std::string& at = target->path;
  char real[PATH_MAX];
  if (realpath(DirName(at).c_str(), real) == nullptr) return "";
  return JoinPath(real, at.substr(at.rfind('/') + 1));  // npos + 1: the whole name
}

bool SameDirectory(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  const bool has_a = stat(a.c_str(), &sa) == 0, has_b = stat(b.c_str(), &sb) == 0;
  if (has_a && has_b) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (has_a || has_b) return false;
  auto normal = [](const std::string& p) {
    std::string n = std::filesystem::absolute(p).lexically_normal().string();
    while (n.size() > 1 && n.back() == '/') n.pop_back();
    return n;
  };
  return normal(a) == normal(b);
}

bool IsTerminal(int fd) { return isatty(fd) == 1; }
bool StdinIsTerminal() { return IsTerminal(STDIN_FILENO); }
bool StdoutIsTerminal() { return IsTerminal(STDOUT_FILENO); }

std::string JoinPath(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string Beside(const std::string& path, const std::string& name) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? name : path.substr(0, slash + 1) + name;
}

std::string SelfExe(const std::string& fallback) {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : fallback;
}

namespace {
thread_local int remove_tree_errno = 0;
int RemoveOne(const char* path, const struct stat*, int type, struct FTW*) {
  const int rc = (type == FTW_DP) ? ::rmdir(path) : ::unlink(path);
  if (rc != 0 && errno != ENOENT && remove_tree_errno == 0) remove_tree_errno = errno;
  return 0;  // go on: remove what can be removed
}
}  // namespace

bool RemoveTree(const std::string& path, std::error_code* ec) {
  if (ec != nullptr) ec->clear();
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return true;
    if (ec != nullptr) *ec = std::error_code(errno, std::generic_category());
    return false;
  }
  remove_tree_errno = 0;
  if (!S_ISDIR(st.st_mode)) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) remove_tree_errno = errno;
  } else if (::nftw(path.c_str(), RemoveOne, 32, FTW_DEPTH | FTW_PHYS) != 0 && remove_tree_errno == 0) {
    remove_tree_errno = errno != 0 ? errno : EIO;
  }
  if (remove_tree_errno != 0 && ec != nullptr) *ec = std::error_code(remove_tree_errno, std::generic_category());
  return remove_tree_errno == 0;
}

Status CheckOwnDirectory(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::NoInput(path + ": cannot open the " + what + ": " + Errno());
  if (!S_ISDIR(st.st_mode)) return Status::NoInput(path + ": the " + what + " is not a directory");
  if (st.st_uid == ::geteuid() && (st.st_mode & S_IWOTH) == 0) return Status::Ok();
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  return Status::Config(path + ": the " + what + " is " +
                        (st.st_uid != ::geteuid() ? "owned by uid " + std::to_string(st.st_uid) + ", not " +
                                                        std::to_string(::geteuid())
                                                  : std::string("writable by every user")) +
                        " (mode " + mode + "): another user could put links there in place of the files written " +
                        "into it; give a directory of your own");
}

Status MakeDirs(const std::string& path, const std::string& what, unsigned mode) {
  for (size_t at = 1; at <= path.size(); ++at) {
    if (at == path.size() || path[at] == '/') {
      std::string part = path.substr(0, at);
      if (::mkdir(part.c_str(), at == path.size() ? mode : 0777) != 0 && errno != EEXIST) {
        return Status::IoErr(part + ": cannot create the " + what + ": " + std::strerror(errno));
      }
    }
  }
  return Status::Ok();
}

ReadEnd ReadFor(int fd, int64_t timeout_ms, size_t max_bytes, std::string* out,
                bool (*done)(const std::string&)) {
  const int64_t deadline = SteadyMs() + timeout_ms;
  char buf[4096];
  while (done == nullptr || !done(*out)) {
    const int64_t left = deadline - SteadyMs();
    if (left <= 0) return ReadEnd::kTimeout;
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (r < 0 && errno != EINTR) return ReadEnd::kError;
    if (r <= 0) continue;
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ReadEnd::kError;
    if (n == 0) return ReadEnd::kEof;
    out->append(buf, static_cast<size_t>(n));
    if (out->size() > max_bytes) return ReadEnd::kTooLong;
  }
  return ReadEnd::kDone;
}

bool AppendLoss::Count(ssize_t written, size_t size) {
  const int err = errno;
  std::lock_guard<std::mutex> lock(mu_);
  ++lines_;
  if (written >= 0 && static_cast<size_t>(written) == size) return false;
  if (lost_++ > 0) return false;
  first_ms_ = UnixMs();
  error_ = written < 0 ? std::strerror(err) : "short write";
  return true;
}

std::string AppendLoss::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void AppendLoss::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  lines_ = lost_ = first_ms_ = 0;
  error_.clear();
}

std::string AppendLoss::Describe(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (lost_ == 0) return "";
  return name + " lacks " + std::to_string(lost_) + " of its " + std::to_string(lines_) + " lines, the first at " +
         FormatUnixMs(first_ms_) + ": " + error_;
}

Result<FileHash> HashFile(const std::string& path,
                          const std::function<Status(const char*, uint64_t, uint64_t)>& each) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // a FIFO is refused below, not waited on
  if (fd < 0) return Status::NoInput(path + ": cannot open: " + Errno());
  std::unique_ptr<int, void (*)(int*)> closer(new int(fd), [](int* f) {
    ::close(*f);
    delete f;
  });
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::IoErr(path + ": cannot stat: " + Errno());
  if (!S_ISREG(st.st_mode)) return Status::DataErr(path + ": not a regular file");
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> h(XXH3_createState(), &XXH3_freeState);
  if (h == nullptr || XXH3_64bits_reset(h.get()) != XXH_OK) return Status::Internal(path + ": no hash state");
  FileHash out;
  out.size = static_cast<uint64_t>(st.st_size);
  std::vector<char> buf(size_t{4} << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::IoErr(path + ": read failed: " + Errno());
    if (n == 0) break;
    XXH3_64bits_update(h.get(), buf.data(), static_cast<size_t>(n));
    if (each) OB_RETURN_IF_ERROR(each(buf.data(), out.bytes, static_cast<uint64_t>(n)));
    out.bytes += static_cast<uint64_t>(n);
  }
  out.xxh3 = XXH3_64bits_digest(h.get());
  return out;
}

bool IsSharedFileSystemType(unsigned long f_type) {
  // linux/magic.h and the file systems' own sources.
  static constexpr unsigned long kShared[] = {
      0x6969,      // NFS
      0x517B,      // SMB
      0xFF534D42,  // CIFS
      0xFE534D42,  // SMB2
      0x0BD00BD0,  // Lustre
      0x47504653,  // GPFS (Spectrum Scale)
      0x19830326,  // BeeGFS
      0x00C36400,  // CephFS
      0x20030528,  // OrangeFS (PVFS2)
      0xAAD7AAEA,  // Panasas
      0x5346414F,  // AFS
      0x6B414653,  // kAFS
      0x01161970,  // GFS2
      0x7461636F,  // OCFS2
      0x01021997,  // 9p
      0x65735546,  // FUSE
  };
  for (unsigned long t : kShared) {
    if ((f_type & 0xFFFFFFFFul) == t) return true;
  }
  return false;
}

bool OnSharedFileSystem(const std::string& path) {
  struct statfs fs {};
  return ::statfs(path.c_str(), &fs) == 0 && IsSharedFileSystemType(static_cast<unsigned long>(fs.f_type));
}

}  // namespace ob::io
