// What a pass over a whole token file learned (the largest id in the format
// it was read as, and the xxh3 of every byte), kept across runs, so that a
// job that starts again does not read its data set again. A data set of TBs
// takes many minutes to read, and the ob-launch master read all of it at
// every start (to refuse a model whose vocabulary is too small, and to sum
// it for the hosts and the manifests), as did every host whose copy is its
// own; with a cache, only the first start does.
//
// An entry is one small file, DIR/DEV-INODE, holding the file's identity as
// it was read: device, inode, size, mtime and ctime in ns (FileIdentity).
// Any write, truncation, rename over the file or change of its metadata
// gives another identity (ctime cannot be set back, `touch -r` and all), and
// an entry is used only while the identity is its own. A file that changed
// less than kQuietNs before its pass began is not remembered: a rewrite in
// the same timestamp tick as the pass would leave its identity as it was.
//
// DIR is $OB_CACHE_DIR, else $XDG_CACHE_HOME/ob, else $HOME/.cache/ob (made
// mode 0700); OB_CACHE_DIR set to "" or "off" keeps nothing. A directory
// that another user may write to (not ours, or group- or world-writable) is
// not used: an entry there could vouch for a file it never read. One that
// cannot be made keeps nothing: a warning when OB_CACHE_DIR named it, a
// debug line for a home that cannot take it.
//
// Torch-free; an entry is written whole (io::WriteFile) and read whole, so
// processes may share a directory.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <optional>
#include <string>

namespace ob::model {

struct ScanEntry {
  std::string identity;  // DEV:INODE:BYTES:MTIME_NS:CTIME_NS when read
  std::string format;    // TokenFormatName of the ids counted ("" when only summed)
  int max_token = -1;    // in that format (-1 when only summed)
  std::string sum;       // "xxh3=<16 hex>" over every byte
};

class ScanCache {
 public:
  static constexpr int64_t kQuietNs = 2'000'000'000;

  // The cache at `dir` ("" keeps nothing).
  explicit ScanCache(std::string dir) : dir_(std::move(dir)) {}
  // The directory from the environment, as above, checked (and made); a
  // directory that cannot be used logs a warning and keeps nothing.
  static ScanCache FromEnvironment();
  // FromEnvironment, once per process.
  static const ScanCache& Default();

  const std::string& dir() const { return dir_; }
  // The entry for the file `st` describes, while its identity is the one
  // remembered; nullopt when there is none, it is another file's or it is
  // malformed.
  std::optional<ScanEntry> Find(const struct stat& st) const;
  // Remembers `e` for the file `st` describes (e.identity is set from it),
  // unless the file changed within kQuietNs before `pass_start_ns` (the
  // realtime clock when the pass began). Best effort: a failure to write
  // is logged at debug level and otherwise ignored.
  void Remember(const struct stat& st, ScanEntry e, int64_t pass_start_ns) const;

 private:
  std::string dir_;
};

// FileIdentity's text for `st`.
std::string IdentityOf(const struct stat& st);
// A file time (st_mtim, st_ctim) in ns since the epoch.
inline int64_t TimeNs(const struct timespec& t) { return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec; }

}  // namespace ob::model
