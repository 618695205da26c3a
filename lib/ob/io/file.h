// Whole-file reads and writes with `-` meaning stdin/stdout, and atomic
// replacement of output files. Every failure names the file.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>

#include "ob/status.h"

namespace ob::io {

// strerror(errno): the text of the last system call's error, for messages.
std::string Errno();

// `bytes` bytes of the kernel's random pool (getrandom(2)) as 2 x `bytes`
// lower-case hex digits: run ids, tokens. kIoErr when the pool fails.
Result<std::string> RandomHex(size_t bytes);

// All of `data` to `fd` (in one write(2) where the descriptor takes it
// whole: a pipe keeps up to PIPE_BUF bytes from interleaving with other
// writers'), retrying interrupted calls; kIoErr naming `name`.
Status WriteAll(int fd, const std::string& data, const std::string& name);

// Reads all of `path`; "-" reads stdin. Missing/unreadable → kNoInput.
Result<std::string> ReadFile(const std::string& path);
// Reads `path` only when it is a regular file (a symbolic link to one
// will do) of at most `max_bytes`: for files in a directory others can
// write (a checkpoint's manifest, `latest`, .lock), where a FIFO or a
// device planted there must not block or flood the reader. The open does
// not wait on a FIFO. kNoInput when it cannot be opened; kDataErr naming
// it when it is not a regular file or is larger; kIoErr on a read error.
Result<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes);

// Where an output path (`-o PATH` and the like) really goes.
//  - A regular file, a path that does not exist yet, or a symbolic link to
//    either: replaced atomically. `path` is the real file (every symlink
//    followed, so the link stays a link and its target gets the new bytes);
//    write a temporary beside it, fsync, rename over it.
//  - Anything else that exists (a device such as /dev/null, a FIFO, a
//    socket, a terminal) and the descriptor paths /dev/stdout, /dev/stderr,
//    /dev/fd/N and /proc/<pid>/fd/N (what `-o >(cmd)` passes): written
//    through in place (`replace` false) — never unlinked or renamed over.
// kIoErr for a directory or an unresolvable link, naming `path`.
struct OutputTarget {
  std::string path;
  bool replace = true;
};
Result<OutputTarget> ResolveOutput(const std::string& path);

// Opens a write-through target (ResolveOutput's replace == false) for
// writing: O_WRONLY | O_TRUNC (the truncation is a no-op on devices and
// FIFOs). kIoErr naming `path`.
Result<int> OpenWriteThrough(const std::string& path);

// A temporary beside `target` (the real file ResolveOutput gave) for an
// output replaced atomically: made anew (O_EXCL, mode 0644 less the umask) as
// TARGET.tmp.PID.N, so that two processes or threads writing one target
// never write one temporary (a second export truncated the first's, which
// then renamed a file the second was still writing), and remembered until
// ForgetTemporary, so that a fatal signal deletes it (RemoveTemporariesOn
// Signal): an interrupted ob-data left TARGET.partial-PID, as large as
// what it had tokenized. Returns the descriptor and sets *path. kIoErr
// naming `name` (the path as the user gave it), *path left empty.
Result<int> CreateTemporary(const std::string& target, const std::string& name, std::string* path);
// The temporary was renamed into place or unlinked: no signal deletes it.
void ForgetTemporary(const std::string& path);
// Makes SIGINT, SIGTERM and SIGHUP (those not ignored: nohup) delete the
// temporaries not yet forgotten, then end the process as the signal would
// have (cli::Main, before a tool runs; a tool that handles these signals
// itself, as ob-launch's master and agents do, replaces the handlers).
void RemoveTemporariesOnSignal();

// Opens `path` for a new stream of records (ob-launch --metrics), keeping
// what it held: a non-empty regular file there (every symlink followed) is
// first renamed to PATH.N, the first N free, never overwritten (*kept says
// which; "" when nothing was kept), so a job restarted or resumed with the
// same command line, or a second job naming the same file, loses no
// records of the first. Where the directory does not let it be renamed,
// the new records are appended to it (*kept says so). An empty file is
// written over; a device, FIFO or socket is written through
// (OpenWriteThrough). New files get `mode`. kIoErr naming `path`.
Result<int> OpenNewStream(const std::string& path, unsigned mode, std::string* kept);

// Writes `data` to `path`: "-" writes stdout; otherwise as ResolveOutput
// says: a temporary file beside the real target is written, fsynced and
// renamed over it, so a reader never sees a half-written file, or a device
// or pipe is written through. Failure → kIoErr, and a replaced file is
// untouched.
Status WriteFile(const std::string& path, const std::string& data);

// Whether `path` is a directory no other user can change: owned by this
// process's user and not writable by others (group-writable is allowed: a
// group of one's own, the usual umask 002). kConfig naming it, its owner
// and mode otherwise: the files a tool writes there (logs, a control
// socket) could be replaced by links that the tool would follow. kNoInput
// when it is missing or not a directory.
Status CheckOwnDirectory(const std::string& path, const std::string& what);

// Creates `path` and its parents (mode 0777 less the umask), the last one
// with `mode` (also less the umask); one that exists is left as it is.
// kIoErr naming the part and `what` ("run directory").
Status MakeDirs(const std::string& path, const std::string& what, unsigned mode = 0777);

// Removes `path` and, if it is a directory, everything under it, without
// following symbolic links (as std::filesystem::remove_all, which ob does
// not call: the PyTorch wheel's libtorch.so exports a copy of it that
// crashes, and it is the one our binaries bind to). A missing `path` is
// not an error. On failure sets *ec (when given) to the first error and
// returns false; what could be removed is.
bool RemoveTree(const std::string& path, std::error_code* ec = nullptr);

// DIR/NAME, without doubling a slash DIR ends with.
std::string JoinPath(const std::string& dir, const std::string& name);
// `name` in the directory of the file `path` ("/opt/ob/bin/x" ->
// "/opt/ob/bin/name"); `name` alone when `path` has no slash.
std::string Beside(const std::string& path, const std::string& name);
// This process's executable as /proc/self/exe names it (its real path: a
// link to it finds what lies beside its target); `fallback` when unreadable.
std::string SelfExe(const std::string& fallback);

// The regular file `path` names, through symbolic links: its device and
// inode, equal for two names of one file (hard links included). nullopt
// for "-", "", a path that does not exist or cannot be inspected, and
// anything but a regular file (a device or pipe is written through, never
// replaced, so reading and writing one is no loss).
struct FileId {
  uint64_t device = 0;
  uint64_t inode = 0;
  bool operator==(const FileId& o) const { return device == o.device && inode == o.inode; }
};
std::optional<FileId> RegularFileId(const std::string& path);
// What an output path (as ResolveOutput takes it) would replace, as a key
// equal for every name of that file: "" for "-", "" and write-through
// targets (devices, pipes); the device and inode of an existing regular
// file; else the real directory and the name of the file to be created
// ("" when the directory cannot be resolved).
std::string OutputKey(const std::string& path);

// Whether `a` and `b` name one directory: the same device and inode when
// both exist; when neither does, the same absolute path once ".", ".." and
// doubled or trailing slashes are resolved as text (one existing and one
// not are two).
bool SameDirectory(const std::string& a, const std::string& b);

bool IsTerminal(int fd);
bool StdinIsTerminal();
bool StdoutIsTerminal();

// The display name of a path in messages: "<stdin>"/"<stdout>" for "-".
std::string DisplayName(const std::string& path, bool output = false);

// The lines an append-only record (a log, events.log) failed to take: a
// full disk must not leave a run's record short without a word, and must not
// stop training either. Thread-safe.
class AppendLoss {
 public:
  // After write(2) of one line of `size` bytes returned `written` (errno
  // still set when it is negative). Returns true for the first line lost.
  bool Count(ssize_t written, size_t size);
  // "" while every line was written whole; else "NAME lacks N of its M
  // lines, the first at TIME: ERROR" (ERROR: the first failure's strerror,
  // or "short write").
  std::string Describe(const std::string& name) const;
  // The first lost line's error ("" while none was lost), for the warning
  // at once.
  std::string error() const;
  // Counts anew (another file).
  void Reset();

 private:
  mutable std::mutex mu_;
  int64_t lines_ = 0;
  int64_t lost_ = 0;
  int64_t first_ms_ = 0;
  std::string error_;
};

// What HashFile read.
struct FileHash {
  uint64_t xxh3 = 0;     // XXH3-64 of every byte read (io::HashText writes it)
  uint64_t bytes = 0;    // how many
  uint64_t size = 0;     // the file's size when it was opened
};
// Reads the regular file `path` front to back a chunk at a time (4 MiB),
// hashing every byte; `each` (may be empty) sees each chunk with its
// offset, and a Status it returns other than Ok stops the read and is
// returned. Callers compare bytes with size (a file that changed while
// read). kNoInput "PATH: cannot open: …", kDataErr "PATH: not a regular
// file", kIoErr "PATH: read failed: …".
Result<FileHash> HashFile(const std::string& path,
                          const std::function<Status(const char* data, uint64_t offset, uint64_t n)>& each = {});

// Whether `path` is on a file system that many machines mount as one: NFS,
// SMB/CIFS, Lustre, GPFS, BeeGFS, CephFS, OrangeFS, Panasas, AFS, GFS2,
// OCFS2, 9p and FUSE (gcsfuse, s3fs, GlusterFS, JuiceFS, ...), by statfs(2)'s
// f_type (IsSharedFileSystemType). False when it cannot be stat'ed.
bool OnSharedFileSystem(const std::string& path);
bool IsSharedFileSystemType(unsigned long f_type);

// How ReadFor ended.
enum class ReadEnd { kDone, kEof, kTimeout, kTooLong, kError };
// Appends what `fd` (a pipe or stream socket) gives to *out until
// `done(*out)` holds (nullptr: never), end of file, `timeout_ms` pass, or
// *out outgrows `max_bytes`; interrupted calls are retried. kError leaves
// errno set.
ReadEnd ReadFor(int fd, int64_t timeout_ms, size_t max_bytes, std::string* out,
                bool (*done)(const std::string&) = nullptr);

}  // namespace ob::io
