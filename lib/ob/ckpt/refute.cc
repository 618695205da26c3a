// Refuting a checkpoint (see checkpoint.h): the REFUTED file that keeps
// it from being trained from, `latest` moved off it, and reading why.
#include "ob/ckpt/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "ob/ckpt/checkpoint_impl.h"
#include "ob/io/file.h"
#include "ob/log.h"

namespace ob::ckpt {

using namespace detail;  // checkpoint_impl.h
namespace fs = std::filesystem;

Status Refute(const std::string& ckpt_path, const std::string& why) {
  if (!IsDir(ckpt_path) || !fs::exists(io::JoinPath(ckpt_path, kManifestName)))
    return Status::NoInput(ckpt_path + ": not a committed checkpoint");
  std::string line = why;
  for (char& c : line)
    if (c == '\n' || c == '\r') c = ' ';
  OB_RETURN_IF_ERROR(io::WriteFile(io::JoinPath(ckpt_path, kRefutedName), line + "\n"));
  OB_RETURN_IF_ERROR(FsyncDir(ckpt_path));
  // `latest` names the one to resume from: not this one any more.
  fs::path p = fs::path(ckpt_path).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "…/step-…/"
  const std::string root = p.has_parent_path() ? p.parent_path().string() : ".";
  if (ReadLatestName(root) != p.filename().string()) return Status::Ok();
  const std::string latest = io::JoinPath(root, kLatestName);
  if (Result<std::string> next = Latest(root); next.ok()) {
    OB_RETURN_IF_ERROR(io::WriteFile(latest, fs::path(*next).filename().string() + "\n"));
  } else if (::unlink(latest.c_str()) != 0 && errno != ENOENT) {
    return Status::IoErr(latest + ": cannot remove: " + Errno());
  }
  return FsyncDir(root);
}

Status NotRefuted(const std::string& ckpt_path) {
  const std::string why = RefutedWhy(ckpt_path);
  return why.empty() ? Status::Ok() : Refuted(ckpt_path, why);
}

std::string RefutedWhy(const std::string& ckpt_path) {
  const std::string path = io::JoinPath(ckpt_path, kRefutedName);
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return "";
  // Its first line only, and never through a link, a FIFO or a device (a
  // planted REFUTED must not hang or flood a reader): present, it refutes.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "a REFUTED that cannot be opened (" + Errno() + ")";
  std::string text(1024, '\0');
  ssize_t n = -1;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) n = ::read(fd, text.data(), text.size());
  ::close(fd);
  if (n < 0) return "a REFUTED that is not a readable plain file";
  text.resize(static_cast<size_t>(n));
  std::string line = io::Trim(text.substr(0, text.find('\n')));
  if (line.empty()) line = "no reason given";
  return log::Printable(line, 1024);
}

}  // namespace ob::ckpt
