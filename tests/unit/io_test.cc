// io/file.h's output targets and io/dir_lock.h.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "ob/io/dir_lock.h"
#include "ob/io/fd_limit.h"
#include "ob/control.pb.h"
#include "ob/io/file.h"
#include "ob/io/message.h"
#include "ob/io/text.h"
#include "ob/log.h"

namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/ob-io-test.XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { ob::io::RemoveTree(path.string()); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

std::string Slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("ResolveOutput replaces regular files and writes through everything else") {
  TempDir t;
  auto r = ob::io::ResolveOutput(t / "new.pb");  // does not exist yet
  REQUIRE(r.ok());
  CHECK(r->replace);
  CHECK(r->path == t / "new.pb");

  REQUIRE(ob::io::WriteFile(t / "file", "old").ok());
  fs::create_directory(t.path / "links");
  fs::create_symlink("../file", t.path / "links" / "rel");
  fs::create_symlink(t.path / "links" / "rel", t.path / "chain");  // a link to a link
  r = ob::io::ResolveOutput(t / "chain");
  REQUIRE(r.ok());
  CHECK(r->replace);
  CHECK(fs::equivalent(r->path, t / "file"));
  REQUIRE(ob::io::WriteFile(t / "chain", "new").ok());
  CHECK(fs::is_symlink(t.path / "chain"));
  CHECK(fs::is_symlink(t.path / "links" / "rel"));
  CHECK(Slurp(t / "file") == "new");

  fs::create_symlink("missing", t.path / "dangling");  // creates what it names
  r = ob::io::ResolveOutput(t / "dangling");
  REQUIRE(r.ok());
  CHECK(r->path == t / "missing");

  REQUIRE(::mkfifo((t / "fifo").c_str(), 0600) == 0);
  r = ob::io::ResolveOutput(t / "fifo");
  REQUIRE(r.ok());
  CHECK_FALSE(r->replace);
  for (const char* p : {"/dev/null", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1", "/proc/4711/fd/9"}) {
    r = ob::io::ResolveOutput(p);
    REQUIRE(r.ok());
    CHECK_FALSE(r->replace);
    CHECK(r->path == p);
  }
  REQUIRE(ob::io::WriteFile("/dev/null", "bytes").ok());
  struct stat st {};
  REQUIRE(::stat("/dev/null", &st) == 0);
  CHECK(S_ISCHR(st.st_mode));

  auto dir = ob::io::ResolveOutput(t.path.string());
  CHECK(dir.status().code() == ob::Code::kIoErr);
  CHECK_THAT(dir.status().message(), Catch::EndsWith("is a directory"));
  fs::create_symlink("loop", t.path / "loop");
  CHECK_THAT(ob::io::ResolveOutput(t / "loop").status().message(), Catch::Contains("too many levels"));
}

TEST_CASE("DirLock: one holder at a time, released when dropped") {
  TempDir t;
  auto first = ob::io::DirLock::Acquire(t.path.string(), "the first run");
  REQUIRE(first.ok());
  CHECK(first->held());
  // A second open file description conflicts, even in the same process.
  auto second = ob::io::DirLock::Acquire(t.path.string(), "the second run");
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().code() == ob::Code::kConfig);
  CHECK_THAT(second.status().message(), Catch::StartsWith(t.path.string() + " is in use by another process (host "));
  CHECK_THAT(second.status().message(), Catch::EndsWith(": the first run)"));
  { ob::io::DirLock moved = std::move(first).value(); }  // released here
  auto third = ob::io::DirLock::Acquire(t.path.string(), "the third run");
  CHECK(third.ok());
  CHECK(ob::io::DirLock::Acquire(t / "missing", "x").status().code() == ob::Code::kIoErr);
}

TEST_CASE("DirLock never follows a planted link nor opens a FIFO: the file it points at is untouched") {
  TempDir t;
  const std::string dir = t / "shared", victim = t / "victim";
  std::filesystem::create_directories(dir);
  std::ofstream(victim) << "root's file\n";
  std::filesystem::create_symlink(victim, dir + "/.lock");
  auto linked = ob::io::DirLock::Acquire(dir, "a run");
  REQUIRE_FALSE(linked.ok());
  CHECK(linked.status().code() == ob::Code::kConfig);
  CHECK(linked.status().message() == dir + "/.lock: is a symbolic link, not the lock file this directory's jobs "
                                           "make; remove it");
  CHECK(Slurp(victim) == "root's file\n");  // before: truncated and overwritten by the lock's line
  std::filesystem::remove(dir + "/.lock");
  REQUIRE(mkfifo((dir + "/.lock").c_str(), 0600) == 0);
  auto fifo = ob::io::DirLock::Acquire(dir, "a run");
  REQUIRE_FALSE(fifo.ok());
  CHECK(fifo.status().code() == ob::Code::kConfig);
  std::filesystem::remove(dir + "/.lock");
  CHECK(ob::io::DirLock::Acquire(dir, "a run").ok());
}

TEST_CASE("CheckOwnDirectory: ours and not writable by every user, group-writable allowed") {
  TempDir t;
  const std::string d = t / "run";
  std::filesystem::create_directories(d);
  ::chmod(d.c_str(), 0775);
  CHECK(ob::io::CheckOwnDirectory(d, "run directory").ok());
  ::chmod(d.c_str(), 0777);
  const ob::Status open = ob::io::CheckOwnDirectory(d, "run directory");
  CHECK(open.code() == ob::Code::kConfig);
  CHECK(open.message() == d + ": the run directory is writable by every user (mode 0777): another user could put "
                              "links there in place of the files written into it; give a directory of your own");
  ::chmod(d.c_str(), 0700);
  if (::geteuid() == 0) {  // only root can give it away
    REQUIRE(::chown(d.c_str(), 12345, 12345) == 0);
    const ob::Status theirs = ob::io::CheckOwnDirectory(d, "run directory");
    CHECK(theirs.code() == ob::Code::kConfig);
    CHECK_THAT(theirs.message(), Catch::StartsWith(d + ": the run directory is owned by uid 12345, not 0 (mode 0700)"));
  }
  CHECK(ob::io::CheckOwnDirectory(t / "missing", "run directory").code() == ob::Code::kNoInput);
  std::ofstream(t / "file") << "x";
  CHECK(ob::io::CheckOwnDirectory(t / "file", "run directory").code() == ob::Code::kNoInput);
}

TEST_CASE("ReadRegularFile reads a plain file, and refuses a FIFO, a device or too many bytes at once") {
  TempDir t;
  const std::string plain = t / "plain";
  std::ofstream(plain) << "step-000000000004\n";
  CHECK(*ob::io::ReadRegularFile(plain, 64) == "step-000000000004\n");
  std::filesystem::create_symlink(plain, t / "link");
  CHECK(*ob::io::ReadRegularFile(t / "link", 64) == "step-000000000004\n");
  auto big = ob::io::ReadRegularFile(plain, 4);
  CHECK(big.status().code() == ob::Code::kDataErr);
  CHECK(big.status().message() == plain + ": 18 bytes, more than such a file holds (4 at most)");
  REQUIRE(mkfifo((t / "fifo").c_str(), 0600) == 0);  // nobody writes it: ReadFile would wait forever
  auto fifo = ob::io::ReadRegularFile(t / "fifo", 64);
  CHECK(fifo.status().code() == ob::Code::kDataErr);
  CHECK(fifo.status().message() == t / "fifo" + ": not a regular file (a FIFO)");
  std::filesystem::create_symlink("/dev/zero", t / "zero");  // endless
  auto zero = ob::io::ReadRegularFile(t / "zero", 64);
  CHECK(zero.status().message() == t / "zero" + ": not a regular file (a device)");
  CHECK(ob::io::ReadRegularFile(t / "missing", 64).status().code() == ob::Code::kNoInput);
  CHECK(ob::io::ReadRegularFile(t.path.string(), 64).status().code() == ob::Code::kDataErr);
}

TEST_CASE("RemoveTree removes a tree and does not follow its links") {
  TempDir t;
  const std::string outside = t / "outside", tree = t / "tree";
  fs::create_directories(outside);
  std::ofstream(outside + "/keep") << "kept";
  fs::create_directories(tree + "/a/b/c");
  std::ofstream(tree + "/a/b/c/file") << "x";
  std::ofstream(tree + "/top") << "y";
  fs::create_directory_symlink(outside, tree + "/a/link");
  std::error_code ec;
  CHECK(ob::io::RemoveTree(tree, &ec));
  CHECK_FALSE(ec);
  CHECK_FALSE(fs::exists(tree));
  CHECK(Slurp(outside + "/keep") == "kept");  // through the link: untouched
  CHECK(ob::io::RemoveTree(tree, &ec));       // a missing path is no error
  CHECK_FALSE(ec);
  std::ofstream(t / "plain") << "z";  // a plain file
  CHECK(ob::io::RemoveTree(t / "plain"));
  CHECK_FALSE(fs::exists(t / "plain"));
  if (::geteuid() != 0) {  // root removes from a read-only directory anyway
    fs::create_directories(tree + "/locked/inner");
    fs::permissions(tree + "/locked", fs::perms::owner_read | fs::perms::owner_exec);
    CHECK_FALSE(ob::io::RemoveTree(tree, &ec));
    CHECK(ec);
    fs::permissions(tree + "/locked", fs::perms::owner_all);
  }
}

TEST_CASE("RegularFileId and OutputKey: one file under every name, nothing for streams and devices") {
  TempDir t;
  std::ofstream(t / "a") << "a";
  fs::create_directories(t / "sub");
  fs::create_symlink("../a", t / "sub/link");
  fs::create_hard_link(t / "a", t / "hard");
  const auto a = ob::io::RegularFileId(t / "a");
  REQUIRE(a);
  CHECK(ob::io::RegularFileId(t / "sub/link") == a);
  CHECK(ob::io::RegularFileId(t / "hard") == a);
  CHECK_FALSE(ob::io::RegularFileId(t / "missing"));
  CHECK_FALSE(ob::io::RegularFileId(t / "sub"));  // a directory
  CHECK_FALSE(ob::io::RegularFileId("-"));
  CHECK_FALSE(ob::io::RegularFileId(""));
  CHECK_FALSE(ob::io::RegularFileId("/dev/null"));

  CHECK(ob::io::OutputKey(t / "a") == ob::io::OutputKey(t / "sub/link"));
  CHECK(ob::io::OutputKey(t / "a") == ob::io::OutputKey(t / "hard"));
  // Not there yet: the real directory and the name, through a linked one.
  fs::create_directory_symlink(t.path, t / "dirlink");
  CHECK_FALSE(ob::io::OutputKey(t / "new").empty());
  CHECK(ob::io::OutputKey(t / "new") == ob::io::OutputKey(t / "dirlink/./new"));
  CHECK(ob::io::OutputKey(t / "new") != ob::io::OutputKey(t / "new2"));
  fs::create_symlink("new", t / "dangling");  // the file it will create
  CHECK(ob::io::OutputKey(t / "dangling") == ob::io::OutputKey(t / "new"));
  CHECK(ob::io::OutputKey("-").empty());
  CHECK(ob::io::OutputKey("/dev/null").empty());
  CHECK(ob::io::OutputKey(t / "no-such-dir/x").empty());
}

TEST_CASE("SameDirectory: through links when they exist, as text when they do not") {
  TempDir t;
  fs::create_directories(t / "d/e");
  fs::create_directory_symlink("d", t / "link");
  CHECK(ob::io::SameDirectory(t / "d", t / "link/"));
  CHECK(ob::io::SameDirectory(t / "d", t / "d/e/.."));
  CHECK_FALSE(ob::io::SameDirectory(t / "d", t / "d/e"));
  CHECK(ob::io::SameDirectory(t / "new", t / "d/../new//"));
  CHECK_FALSE(ob::io::SameDirectory(t / "new", t / "new2"));
  CHECK_FALSE(ob::io::SameDirectory(t / "d", t / "new"));
}

TEST_CASE("text: Format of any length, Fixed, XmlEscape, TickStep") {
  CHECK(ob::io::Format("%s=%d", "a", 3) == "a=3");
  const std::string long_text(1000, 'x');  // past the stack buffer: the whole of it
  CHECK(ob::io::Format("<%s>", long_text.c_str()) == "<" + long_text + ">");
  CHECK(ob::io::Fixed(2.0 / 3, 3) == "0.667");
  CHECK(ob::io::Fixed(-1.25, 0) == "-1");
  CHECK(ob::io::XmlEscape("a<b & 'c' \"d\">") == "a&lt;b &amp; &apos;c&apos; &quot;d&quot;&gt;");
  CHECK(ob::io::XmlEscape(std::string("t\tab\x01\n") + "é") == "t\tab" + std::string("é"));
  CHECK(ob::io::TickStep(100, 10) == 10);
  CHECK(ob::io::TickStep(101, 10) == 20);  // at most about 10 parts
  CHECK(ob::io::TickStep(0.03, 10) == Approx(0.005));
  CHECK(ob::io::TickStep(0, 10) == 1);
  CHECK(ob::io::TickStep(std::nan(""), 10) == 1);
}

TEST_CASE("text: NameSome names the first few and counts the rest") {
  using ob::io::NameSome;
  CHECK(NameSome({}, 3).empty());
  CHECK(NameSome({"a"}, 3) == "a");
  CHECK(NameSome({"a", "b", "c"}, 3) == "a, b, c");
  CHECK(NameSome({"a", "b", "c", "d", "e"}, 3) == "a, b, c and 2 more");
  CHECK(NameSome({"a", "b"}, 0) == "a and 1 more");  // at least one is named
}

TEST_CASE("text: HashText writes 16 hex digits after the prefix, leading zeros kept") {
  CHECK(ob::io::HashText("xxh3:", 0xabcULL) == "xxh3:0000000000000abc");
  CHECK(ob::io::HashText("xxh3=", ~0ULL) == "xxh3=ffffffffffffffff");
}

TEST_CASE("text: Trim") {
  CHECK(ob::io::Trim("  a b \t\r\n") == "a b");
  CHECK(ob::io::Trim(" \t\n") == "");
  CHECK(ob::io::Trim("x") == "x");
}

TEST_CASE("Beside and SelfExe: a program's sibling by its real path") {
  CHECK(ob::io::Beside("/opt/ob/bin/ob-launch", "ob-launch-worker") == "/opt/ob/bin/ob-launch-worker");
  CHECK(ob::io::Beside("/ob-launch", "w") == "/w");
  CHECK(ob::io::Beside("ob-launch", "w") == "w");  // found on PATH, as the program was
  const std::string self = ob::io::SelfExe("none");
  REQUIRE(self.size() > 1);
  CHECK(self[0] == '/');
  CHECK(self.substr(self.rfind('/') + 1) == "core_test");
}

TEST_CASE("ReadFor: until done, end of file, the deadline or too many bytes") {
  int p[2];
  REQUIRE(::pipe(p) == 0);
  std::string out;
  REQUIRE(::write(p[1], "ab\ncd", 5) == 5);
  auto line = [](const std::string& s) { return s.find('\n') != std::string::npos; };
  CHECK(ob::io::ReadFor(p[0], 1000, 100, &out, line) == ob::io::ReadEnd::kDone);
  CHECK(out == "ab\ncd");
  out.clear();
  CHECK(ob::io::ReadFor(p[0], 50, 100, &out) == ob::io::ReadEnd::kTimeout);
  REQUIRE(::write(p[1], "0123456789", 10) == 10);
  CHECK(ob::io::ReadFor(p[0], 1000, 5, &out) == ob::io::ReadEnd::kTooLong);
  CHECK(out == "0123456789");
  ::close(p[1]);
  out.clear();
  CHECK(ob::io::ReadFor(p[0], 1000, 100, &out) == ob::io::ReadEnd::kEof);
  CHECK(out.empty());
  ::close(p[0]);
}

TEST_CASE("OpenNewStream keeps what a file held as FILE.N, never overwritten") {
  TempDir t;
  const std::string m = t / "run.metrics";
  std::string kept;
  auto write = [](int fd, const std::string& text) {
    REQUIRE(ob::io::WriteAll(fd, text, "test").ok());
    ::close(fd);
  };
  auto fd = ob::io::OpenNewStream(m, 0600, &kept);  // a new file
  REQUIRE(fd.ok());
  CHECK(kept.empty());
  struct stat st {};
  REQUIRE(::stat(m.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  write(*fd, "first run");
  fd = ob::io::OpenNewStream(m, 0600, &kept);  // the same command line again
  REQUIRE(fd.ok());
  CHECK(kept == m + ".1");
  write(*fd, "second run");
  std::ofstream(m + ".2") << "not ours";  // a name taken: the next free one
  fd = ob::io::OpenNewStream(m, 0600, &kept);
  REQUIRE(fd.ok());
  CHECK(kept == m + ".3");
  write(*fd, "third run");
  CHECK(Slurp(m + ".1") == "first run");
  CHECK(Slurp(m + ".2") == "not ours");
  CHECK(Slurp(m + ".3") == "second run");
  CHECK(Slurp(m) == "third run");
  // An empty file is written over, and through a link its target is the
  // file kept and made anew; the link stays a link.
  std::ofstream(t / "empty").close();
  fd = ob::io::OpenNewStream(t / "empty", 0600, &kept);
  REQUIRE(fd.ok());
  CHECK(kept.empty());
  ::close(*fd);
  REQUIRE(::symlink(m.c_str(), (t / "link").c_str()) == 0);
  fd = ob::io::OpenNewStream(t / "link", 0600, &kept);
  REQUIRE(fd.ok());
  CHECK(kept == m + ".4");
  write(*fd, "fourth run");
  CHECK(fs::is_symlink(t / "link"));
  CHECK(Slurp(t / "link") == "fourth run");
  CHECK(Slurp(m + ".4") == "third run");
  // A FIFO is written through, not moved.
  REQUIRE(::mkfifo((t / "fifo").c_str(), 0600) == 0);
  const int reader = ::open((t / "fifo").c_str(), O_RDONLY | O_NONBLOCK);
  REQUIRE(reader >= 0);
  fd = ob::io::OpenNewStream(t / "fifo", 0600, &kept);
  REQUIRE(fd.ok());
  CHECK(kept.empty());
  ::close(*fd);
  ::close(reader);
  CHECK(fs::is_fifo(t / "fifo"));
  CHECK_FALSE(fs::exists(t / "fifo.1"));
  CHECK(ob::io::OpenNewStream(t / "no/such/dir/m", 0600, &kept).status().code() == ob::Code::kIoErr);
}

TEST_CASE("OpenNewStream appends to a file it may write in a directory it may not") {
  if (::geteuid() == 0) {
    // root writes any directory: drop to nobody in a child for this case
    TempDir t;
    const std::string dir = t / "ro", m = dir + "/run.metrics";
    REQUIRE(::chmod(t.path.c_str(), 0755) == 0);  // mkdtemp's 0700 would keep nobody out
    REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
    std::ofstream(m) << "first run";
    REQUIRE(::chown(m.c_str(), 65534, 65534) == 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
      std::string kept;
      auto fd = ob::io::OpenNewStream(m, 0600, &kept);
      if (!fd.ok()) ::_exit(3);
      if (kept.rfind(m + " itself, the new records after them (" + m + ".1 cannot be made: ", 0) != 0) ::_exit(4);
      if (!ob::io::WriteAll(*fd, ", second run", "test").ok()) ::_exit(5);
      ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(Slurp(m) == "first run, second run");
    CHECK_FALSE(fs::exists(m + ".1"));
  } else {
    WARN("not root: the case needs a file of another user; not run");
  }
}

TEST_CASE("FieldDifferences: the fields that differ, repeated ones whole, skipped ones left out") {
  ob::pb::Hello a, b;
  a.set_host("h1");
  b.set_host("h2");
  a.add_gpus("GPU-a");
  b.add_gpus("GPU-a");
  b.add_gpus("GPU-b");
  a.set_pid(7);
  b.set_pid(7);
  const auto d = ob::io::FieldDifferences(a, b, {ob::pb::Hello::kHostFieldNumber});
  REQUIRE(d.size() == 1);
  CHECK(d[0].name == "gpus");
  CHECK(d[0].a == "[\"GPU-a\"]");
  CHECK(d[0].b == "[\"GPU-a\",\"GPU-b\"]");
  CHECK(ob::io::FieldDifferences(a, a).empty());
  CHECK(ob::io::FieldDifferences(a, b).size() == 2);  // host too
}

TEST_CASE("a log file that stops taking lines is counted, and counted anew for another file") {
  // ob-launch --run-dir on a full disk lost master.log's lines and exited 0
  // without a word (cli::Main now says FileLost at the end).
  REQUIRE(ob::log::SetFile("/dev/full"));
  CHECK(ob::log::FileLost().empty());
  ob::log::Write(ob::log::Level::kInfo, "one");
  ob::log::Write(ob::log::Level::kInfo, "two");
  CHECK_THAT(ob::log::FileLost(), Catch::StartsWith("/dev/full lacks 2 of its 2 lines, the first at 20"));
  CHECK_THAT(ob::log::FileLost(), Catch::EndsWith(": No space left on device"));
  REQUIRE(ob::log::SetFile(""));
  CHECK(ob::log::FileLost().empty());

  ob::io::AppendLoss loss;
  CHECK_FALSE(loss.Count(5, 5));
  CHECK_FALSE(loss.Count(3, 3));
  CHECK(loss.Describe("x").empty());
  CHECK(loss.Count(2, 5));  // a short write loses the line too; the first loss returns true
  CHECK_FALSE(loss.Count(-1, 5));
  CHECK_THAT(loss.Describe("x"), Catch::StartsWith("x lacks 2 of its 4 lines, the first at "));
  CHECK_THAT(loss.Describe("x"), Catch::EndsWith(": short write"));
}

TEST_CASE("HashFile: every byte in chunks with their offsets, a stop from the chunk's callee, and what it refuses") {
  char tmpl[] = "/tmp/ob-hashfile-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string path = dir + "/f";
  const std::string bytes(5u << 20, 'x');  // two chunks
  std::ofstream(path, std::ios::binary) << bytes;
  std::vector<std::pair<uint64_t, uint64_t>> chunks;
  auto h = ob::io::HashFile(path, [&](const char*, uint64_t off, uint64_t n) {
    chunks.push_back({off, n});
    return ob::Status::Ok();
  });
  REQUIRE(h.ok());
  CHECK(h->bytes == bytes.size());
  CHECK(h->size == bytes.size());
  CHECK(chunks == std::vector<std::pair<uint64_t, uint64_t>>{{0, 4u << 20}, {4u << 20, 1u << 20}});
  CHECK(ob::io::HashFile(path)->xxh3 == h->xxh3);
  auto stopped = ob::io::HashFile(path, [](const char*, uint64_t, uint64_t) { return ob::Status::Unavailable("no"); });
  CHECK(stopped.status().code() == ob::Code::kUnavailable);
  CHECK(ob::io::HashFile(dir).status().code() == ob::Code::kDataErr);          // a directory
  CHECK(ob::io::HashFile(dir + "/absent").status().code() == ob::Code::kNoInput);
  std::error_code ec;
  ob::io::RemoveTree(dir, &ec);
}

TEST_CASE("OnSharedFileSystem: NFS, Lustre, GPFS, FUSE and the like by their magic numbers, not a local disk") {
  for (unsigned long t : {0x6969ul, 0x0BD00BD0ul, 0x47504653ul, 0x65735546ul, 0xFE534D42ul, 0x00C36400ul}) {
    CHECK(ob::io::IsSharedFileSystemType(t));
  }
  for (unsigned long t : {0xEF53ul /* ext4 */, 0x58465342ul /* xfs */, 0x01021994ul /* tmpfs */,
                          0x9123683Eul /* btrfs */, 0x794C7630ul /* overlayfs */}) {
    CHECK_FALSE(ob::io::IsSharedFileSystemType(t));
  }
  char tmpl[] = "/tmp/ob-sharedfs-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  CHECK_FALSE(ob::io::OnSharedFileSystem(dir));  // this machine's own disk (or its tmpfs)
  CHECK_FALSE(ob::io::OnSharedFileSystem(dir + "/absent"));
  ::rmdir(dir.c_str());
}

TEST_CASE("the open-file limit is raised to the hard limit, never lowered, and capped") {
  rlimit was{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &was) == 0);
  const rlim_t hard = std::min<rlim_t>(was.rlim_max, ob::io::kMaxOpenFiles);
  if (hard <= 64) {
    WARN("the hard open-file limit is " << was.rlim_max << ": nothing to raise");
    return;
  }
  rlimit low = was;
  low.rlim_cur = 64;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  const ob::io::FileLimit l = ob::io::RaiseOpenFileLimit();
  rlimit now{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &now) == 0);
  CHECK(l.before == 64);
  CHECK(l.after == hard);
  CHECK(now.rlim_cur == hard);
  CHECK(now.rlim_max == was.rlim_max);  // the hard limit untouched
  const ob::io::FileLimit again = ob::io::RaiseOpenFileLimit();
  CHECK(again.before == hard);
  CHECK(again.after == hard);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &was) == 0);
}
