// A checkpoint root's names (see checkpoint.h), and the checks and reads
// the operations on checkpoints share (checkpoint_impl.h).
#include "ob/ckpt/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

#include "ob/ckpt/checkpoint_impl.h"
#include "ob/io/file.h"
#include "ob/io/message.h"

namespace ob::ckpt {
namespace detail {

namespace fs = std::filesystem;

Status LoadStored(const std::string& path, pb::Manifest* m) {
  OB_ASSIGN_OR_RETURN(std::string bytes, io::ReadRegularFile(path, kManifestMaxBytes));
  return io::ParseMessage(bytes, path, io::kManifestFormatVersion, m);
}

bool ParseStepName(const std::string& name, int64_t* step, bool* partial) {
  if (name.rfind("step-", 0) != 0) return false;
  std::string digits = name.substr(5);
  *partial = EndsWith(digits, kPartialSuffix);
  if (*partial) digits.resize(digits.size() - std::strlen(kPartialSuffix));
  if (digits.empty() || digits.size() > 18) return false;
  for (char c : digits)
    if (c < '0' || c > '9') return false;
  *step = std::stoll(digits);
  return true;
}

// Verify's refusal of a refuted checkpoint.
Status Refuted(const std::string& ckpt_path, const std::string& why) {
  return Status::DataErr(ckpt_path + ": refuted: " + why + " (remove " + io::JoinPath(ckpt_path, kRefutedName) +
                         " to use it anyway)");
}

bool IsDir(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Status FsyncDir(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::IoErr(path + ": cannot open directory: " + Errno());
  Status s;
  if (fsync(fd) != 0) s = Status::IoErr(path + ": fsync failed: " + Errno());
  close(fd);
  return s;
}

// Why `path` may not be a manifest's file path, or "" when it may.
std::string PathProblem(const std::string& path) {
  if (path.empty()) return "is empty";
  if (path.find('\0') != std::string::npos) return "contains a NUL byte";
  if (path[0] == '/') return "leaves the checkpoint directory (absolute)";
  size_t start = 0;
  for (;;) {
    const size_t slash = path.find('/', start);
    const std::string part = path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (part == "..") return "leaves the checkpoint directory (contains '..')";
    if (part.empty() || part == ".") return "is not a plain relative path";
    if (slash == std::string::npos) return "";
    start = slash + 1;
  }
}

// What DIR/latest names ("step-…"), or "" when it is missing or not a name.
std::string ReadLatestName(const std::string& dir) {
  auto text = io::ReadRegularFile(io::JoinPath(dir, kLatestName), kLatestMaxBytes);
  if (!text.ok()) return "";
  std::string name = *text;
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' '))
    name.pop_back();
  int64_t step;
  bool partial;
  if (!ParseStepName(name, &step, &partial) || partial) return "";
  return name;
}

// Sum of the sizes of the regular files under `path`.
uint64_t DiskBytes(const std::string& path) {
  uint64_t total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e2;
    if (it->is_regular_file(e2)) total += it->file_size(e2);
  }
  return total;
}

// A committed checkpoint whose manifest loads, is of `step`, and whose files
// all exist at their sizes.
bool IsComplete(const std::string& path, int64_t step, uint64_t* bytes) {
  auto m = LoadManifest(path);
  if (!m.ok() || m->step() != static_cast<uint64_t>(step)) return false;
  uint64_t total = 0;
  for (const auto& f : m->files()) {
    struct stat st;
    if (stat(io::JoinPath(path, f.path()).c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
        static_cast<uint64_t>(st.st_size) != f.size())
      return false;
    total += f.size();
  }
  *bytes = total;
  return true;
}

// CKPT/file, after checking that it stays inside CKPT through symbolic links.
Result<std::string> ResolveInside(const std::string& ckpt, const pb::CheckpointFile& f) {
  const std::string full = io::JoinPath(ckpt, f.path());
  struct stat st;
  if (lstat(full.c_str(), &st) != 0) return Status::DataErr(full + ": missing");
  std::unique_ptr<char, decltype(&std::free)> root(realpath(ckpt.c_str(), nullptr), &std::free);
  std::unique_ptr<char, decltype(&std::free)> real(realpath(full.c_str(), nullptr), &std::free);
  if (!real) return Status::DataErr(full + ": missing (" + Errno() + ")");
  if (!root || std::string(real.get()).rfind(std::string(root.get()) + "/", 0) != 0)
    return Status::DataErr(full + ": leaves the checkpoint directory (to " + real.get() + ")");
  if (stat(full.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    return Status::DataErr(full + ": not a regular file");
  if (static_cast<uint64_t>(st.st_size) != f.size())
    return Status::DataErr(full + ": " + std::to_string(st.st_size) + " bytes, the manifest says " +
                           std::to_string(f.size()) +
                           (static_cast<uint64_t>(st.st_size) < f.size() ? " (truncated)" : ""));
  if (f.checksum().rfind("xxh3:", 0) != 0)
    return Status::DataErr(full + ": unknown checksum " + Quote(f.checksum()) +
                           " in the manifest (ob writes xxh3)");
  return full;
}

// Reads `path` front to back in chunks, hashing every byte; `each` sees
// every chunk with its file offset. Reports bytes read to `progress`.
Result<std::string> ScanFile(const std::string& path, uint64_t size,
                             const std::function<Status(const char*, uint64_t, uint64_t)>& each,
                             const Progress& progress, uint64_t* done, uint64_t total) {
  Result<io::FileHash> h = io::HashFile(path, [&](const char* data, uint64_t off, uint64_t n) -> Status {
    if (each) OB_RETURN_IF_ERROR(each(data, off, n));
    *done += n;
    if (progress) progress(*done, total);
    return Status::Ok();
  });
  if (!h.ok()) return h.status().code() == Code::kNoInput ? Status::DataErr(h.status().message()) : h.status();
  if (h->bytes != size)
    return Status::DataErr(path + ": changed while being read (" + std::to_string(h->bytes) +
                           " bytes, expected " + std::to_string(size) + ")");
  return io::HashText("xxh3:", h->xxh3);
}

std::string LayerList(const std::vector<int>& layers) {
  std::vector<std::string> names;
  for (int l : layers) names.push_back(std::to_string(l));
  return io::NameSome(names, 20);
}

}  // namespace detail

using namespace detail;  // checkpoint_impl.h

std::string StepDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%012lld", static_cast<long long>(step));
  return buf;
}

std::string LayerFileName(int layer) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "layer-%04d.safetensors", layer);
  return buf;
}

std::string PartialPath(const std::string& dir, int64_t step) {
  return io::JoinPath(dir, StepDirName(step) + kPartialSuffix);
}

bool IsMoment(const std::string& tensor) {
  return EndsWith(tensor, ".exp_avg") || EndsWith(tensor, ".exp_avg_sq");
}

std::string StepPath(const std::string& dir, int64_t step) { return io::JoinPath(dir, StepDirName(step)); }

}  // namespace ob::ckpt
