// DirLock: one process at a time owns a directory (a run directory, a
// checkpoint directory), so that two runs pointed at the same place refuse
// instead of overwriting each other.
//
// The lock is an open-file-description lock (fcntl F_OFD_SETLK, Linux) on
// DIR/.lock, held while the DirLock lives and released by the kernel when
// the process dies, however it dies: a crashed run never leaves a stale
// lock behind. The file holds "host pid what" for the message the next
// contender prints. Works on local file systems and on NFSv4 (POSIX byte-
// range locks); the file itself is never removed, so two contenders always
// lock the same inode. The line is synced to disk, so that another host
// sharing the directory reads it (a check that a directory is shared:
// launch/worker/inputs.h).
//
// Thread-safety: none needed (no shared state). Failure: kConfig "DIR is in
// use by <what> (pid P on host H)" when another process holds it; kIoErr
// when DIR/.lock cannot be created or locked.
#pragma once

#include <string>

#include "ob/status.h"

namespace ob::io {

class DirLock {
 public:
  DirLock() = default;
  // Locks `dir` (which must exist) for `what` (e.g. "the run in /x/run").
  // kConfig when DIR/.lock is a symbolic link or not a regular file
  // (planted in a directory others can write: never followed or written).
  static Result<DirLock> Acquire(const std::string& dir, const std::string& what);
  ~DirLock();
  DirLock(DirLock&& other) noexcept;
  DirLock& operator=(DirLock&& other) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  bool held() const { return fd_ >= 0; }
  // What the lock file says of this holder ("host H pid P: what"); "" when
  // it could not be written.
  const std::string& line() const { return line_; }

 private:
  int fd_ = -1;
  std::string line_;
};

}  // namespace ob::io
