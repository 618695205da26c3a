#include "ob/ckpt/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>

#include "ob/clock.h"
#include "ob/build_info.h"
#include "ob/io/file.h"
#include "ob/io/message.h"
#include "ob/io/text.h"
#include "ob/log.h"

namespace ob::ckpt {
namespace {

namespace fs = std::filesystem;

constexpr char kPartialSuffix[] = ".partial";
// A pruned checkpoint is renamed to this first, so that it stops being a
// checkpoint at once even if the removal is cut short.
constexpr char kDeletingSuffix[] = ".deleting";
constexpr char kManifestName[] = "manifest.pb";
constexpr char kManifestJsonName[] = "manifest.json";
constexpr char kLatestName[] = "latest";
constexpr char kRefutedName[] = "REFUTED";
// The most a manifest or a part holds (its plan and file list: MBs at the
// largest), and `latest`: what ReadRegularFile reads of them.
constexpr uint64_t kManifestMaxBytes = uint64_t{1} << 30;
constexpr uint64_t kLatestMaxBytes = 4096;

// A manifest or part from a directory others may write (io::ReadRegularFile).
Status LoadStored(const std::string& path, pb::Manifest* m) {
  OB_ASSIGN_OR_RETURN(std::string bytes, io::ReadRegularFile(path, kManifestMaxBytes));
  return io::ParseMessage(bytes, path, io::kManifestFormatVersion, m);
}

using io::EndsWith;
using io::Errno;
using io::Quote;

// "step-<digits>" (partial=false) or "step-<digits>.partial" (partial=true).
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

}  // namespace

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

Status BeginStep(const std::string& dir, int64_t step) {
  if (step < 0) return Status::DataErr(dir + ": negative step " + std::to_string(step));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec && !IsDir(dir)) return Status::IoErr(dir + ": cannot create: " + ec.message());
  const std::string partial = PartialPath(dir, step);
  if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST)
    return Status::IoErr(partial + ": cannot create: " + Errno());
  return Status::Ok();
}

Result<pb::CheckpointFile> WriteLayer(const std::string& dir, int64_t step, int layer,
                                      const std::vector<TensorView>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  if (layer < 0) return Status::DataErr(dir + ": negative layer " + std::to_string(layer));
  const std::string name = LayerFileName(layer);
  pb::CheckpointFile f;
  uint64_t size = 0;
  OB_RETURN_IF_ERROR(WriteSafetensors(io::JoinPath(PartialPath(dir, step), name), tensors, metadata, &size,
                                      f.mutable_checksum()));
  f.set_path(name);
  f.set_size(size);
  f.add_layers(static_cast<uint32_t>(layer));
  return f;
}

Status WritePart(const std::string& dir, int64_t step, int rank, const pb::Manifest& part) {
  pb::Manifest m = part;
  m.set_step(static_cast<uint64_t>(step));
  m.set_rank(rank);
  const std::string path = io::JoinPath(PartialPath(dir, step), "part-" + std::to_string(rank) + ".pb");
  return io::WriteFile(path, io::SerializeMessage(m, io::kManifestFormatVersion));
}

Result<pb::Manifest> Commit(const std::string& dir, int64_t step, const pb::Manifest& base,
                            int num_layers) {
  const std::string partial = PartialPath(dir, step), final_path = StepPath(dir, step);
  if (num_layers < 1) return Status::DataErr(partial + ": a checkpoint needs at least one layer");
  if (!IsDir(partial)) return Status::NoInput(partial + ": no checkpoint is being written there");

  // The writers' parts, by rank.
  std::vector<std::pair<int, std::string>> part_names;
  std::vector<std::string> stale;  // temporaries and leftovers not to commit
  std::error_code ec;
  for (fs::directory_iterator it(partial, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("part-", 0) == 0 && EndsWith(name, ".pb")) {
      const std::string digits = name.substr(5, name.size() - 8);
      if (!digits.empty() && digits.size() < 9 &&
          std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        part_names.emplace_back(std::stoi(digits), name);
        continue;
      }
    }
    stale.push_back(name);
  }
  if (ec) return Status::IoErr(partial + ": cannot list: " + ec.message());
  std::sort(part_names.begin(), part_names.end());

  pb::Manifest merged = base;
  merged.clear_files();
  merged.clear_rank();
  merged.set_step(static_cast<uint64_t>(step));
  merged.set_num_layers(static_cast<uint32_t>(num_layers));
  if (merged.created_unix_ms() == 0)
    merged.set_created_unix_ms(UnixMs());
  if (merged.ob_version().empty()) merged.set_ob_version(OB_VERSION);

  std::vector<std::string> owner(static_cast<size_t>(num_layers));  // "file (part)"
  std::map<std::string, std::string> listed;                         // path -> part
  for (const auto& [rank, name] : part_names) {
    const std::string part_path = io::JoinPath(partial, name);
    pb::Manifest part;
    OB_RETURN_IF_ERROR(LoadStored(part_path, &part));
    if (part.step() != static_cast<uint64_t>(step))
      return Status::DataErr(part_path + ": is of step " + std::to_string(part.step()) +
                             ", not " + std::to_string(step));
    for (const auto& f : part.files()) {
      if (std::string why = PathProblem(f.path()); !why.empty())
        return Status::DataErr(part_path + ": file path " + Quote(f.path()) + " " + why);
      if (auto [it, fresh] = listed.emplace(f.path(), name); !fresh)
        return Status::DataErr(partial + ": " + f.path() + " is listed by both " + it->second +
                               " and " + name);
      for (uint32_t layer : f.layers()) {
        if (layer >= static_cast<uint32_t>(num_layers))
          return Status::DataErr(part_path + ": layer " + std::to_string(layer) +
                                 " is outside 0.." + std::to_string(num_layers - 1));
        const std::string here = f.path() + " (" + name + ")";
        if (!owner[layer].empty())
          return Status::DataErr(partial + ": layer " + std::to_string(layer) + " is in both " +
                                 owner[layer] + " and " + here);
        owner[layer] = here;
      }
      struct stat st;
      const std::string full = io::JoinPath(partial, f.path());
      if (stat(full.c_str(), &st) != 0)
        return Status::DataErr(full + ": listed by " + name + " but missing");
      if (static_cast<uint64_t>(st.st_size) != f.size())
        return Status::DataErr(full + ": " + std::to_string(st.st_size) + " bytes, " + name +
                               " says " + std::to_string(f.size()));
      *merged.add_files() = f;
    }
  }
  std::vector<int> missing;
  for (int l = 0; l < num_layers; ++l)
    if (owner[static_cast<size_t>(l)].empty()) missing.push_back(l);
  if (!missing.empty())
    return Status::DataErr(partial + ": incomplete: layer" + (missing.size() > 1 ? "s " : " ") +
                           LayerList(missing) + " missing");
  std::sort(merged.mutable_files()->begin(), merged.mutable_files()->end(),
            [](const pb::CheckpointFile& a, const pb::CheckpointFile& b) {
              const int64_t la = a.layers_size() ? a.layers(0) : INT64_MAX;
              const int64_t lb = b.layers_size() ? b.layers(0) : INT64_MAX;
              return la != lb ? la < lb : a.path() < b.path();
            });
  merged.set_format_version(io::kManifestFormatVersion);
  merged.set_end(io::kManifestEndMarker);

  // The manifest, then the rename that commits, then `latest`.
  OB_RETURN_IF_ERROR(io::WriteFile(io::JoinPath(partial, kManifestJsonName), io::ToJson(merged)));
  OB_RETURN_IF_ERROR(io::WriteFile(io::JoinPath(partial, kManifestName),
                                   io::SerializeMessage(merged, io::kManifestFormatVersion)));
  for (const auto& [rank, name] : part_names) unlink(io::JoinPath(partial, name).c_str());
  for (const auto& name : stale)
    if (!listed.count(name) && name != kManifestName && name != kManifestJsonName &&
        (name.rfind("layer-", 0) == 0 || name.find(".tmp") != std::string::npos))
      unlink(io::JoinPath(partial, name).c_str());
  OB_RETURN_IF_ERROR(FsyncDir(partial));
  // A run resumed from an older checkpoint saves this step again: the old
  // copy is moved aside (it stops being a checkpoint) and removed after.
  const std::string replaced = final_path + kDeletingSuffix;
  const bool replacing = IsDir(final_path);
  if (replacing) {
    io::RemoveTree(replaced, &ec);
    if (rename(final_path.c_str(), replaced.c_str()) != 0)
      return Status::IoErr(final_path + ": cannot move the old copy aside: " + Errno());
  }
  if (rename(partial.c_str(), final_path.c_str()) != 0)
    return Status::IoErr(final_path + ": rename failed: " + Errno());
  OB_RETURN_IF_ERROR(FsyncDir(dir));
  if (replacing) {
    io::RemoveTree(replaced, &ec);
    if (ec) {
      OB_LOG(Warn) << replaced << ": cannot remove: " << ec.message();
    }
  }
  OB_RETURN_IF_ERROR(io::WriteFile(io::JoinPath(dir, kLatestName), StepDirName(step) + "\n"));
  OB_RETURN_IF_ERROR(FsyncDir(dir));
  return merged;
}

Result<std::vector<std::string>> RemovePartials(const std::string& dir) {
  std::vector<std::string> removed;
  if (!IsDir(dir)) return removed;
  std::error_code ec;
  std::vector<std::string> doomed;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int64_t step;
    bool partial;
    if ((ParseStepName(name, &step, &partial) && partial) || EndsWith(name, kDeletingSuffix))
      doomed.push_back(io::JoinPath(dir, name));
  }
  if (ec) return Status::IoErr(dir + ": cannot list: " + ec.message());
  for (const auto& path : doomed) {
    io::RemoveTree(path, &ec);
    if (ec) return Status::IoErr(path + ": cannot remove: " + ec.message());
    removed.push_back(path);
  }
  return removed;
}

Result<std::vector<CheckpointInfo>> List(const std::string& dir) {
  if (struct stat st {}; stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    return Status::NoInput(dir + ": not a directory (give a checkpoint, DIR/step-…, or the directory "
                           "that holds them)");
  }
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return Status::NoInput(dir + ": cannot open: " + ec.message());
  const std::string latest = ReadLatestName(dir);
  std::vector<CheckpointInfo> out;
  for (fs::directory_iterator end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    CheckpointInfo info;
    bool partial;
    std::error_code dir_ec;
    if (!ParseStepName(name, &info.step, &partial) || !it->is_directory(dir_ec)) continue;
    info.path = io::JoinPath(dir, name);
    info.complete = !partial && IsComplete(info.path, info.step, &info.bytes);
    if (!info.complete) info.bytes = DiskBytes(info.path);
    info.latest = !partial && name == latest;
    if (info.complete) info.refuted = RefutedWhy(info.path);
    out.push_back(std::move(info));
  }
  if (ec) return Status::NoInput(dir + ": cannot list: " + ec.message());
  std::sort(out.begin(), out.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) {
    return a.step != b.step ? a.step < b.step : a.path < b.path;
  });
  return out;
}

Result<std::string> Latest(const std::string& dir) {
  if (!IsDir(dir)) return Status::NoInput(dir + ": no such checkpoint directory");
  const std::string name = ReadLatestName(dir);
  int64_t step = 0;
  bool partial = false;
  uint64_t bytes = 0;
  bool refuted = false;
  if (!name.empty() && ParseStepName(name, &step, &partial) &&
      IsComplete(io::JoinPath(dir, name), step, &bytes)) {
    refuted = !RefutedWhy(io::JoinPath(dir, name)).empty();
    if (!refuted) return io::JoinPath(dir, name);
  }
  OB_ASSIGN_OR_RETURN(auto all, List(dir));
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (!it->complete || !it->refuted.empty()) continue;
    if (!name.empty()) {
      OB_LOG(Warn) << io::JoinPath(dir, kLatestName) << " names " << name << ", which is "
                   << (refuted ? "refuted" : "not complete") << "; using " << it->path;
    }
    return it->path;
  }
  return Status::NoInput(dir + ": no complete checkpoint");
}

Result<Verified> NewestVerified(const std::string& dir,
                                const std::function<std::string(const pb::Manifest&)>& accept) {
  if (!IsDir(dir)) return Status::NoInput(dir + ": no such checkpoint directory");
  // What `latest` names first, then newest first; refuted ones too, so
  // that each passed over is said.
  // A committed one (step-…, not step-….partial) that is not complete (a
  // file truncated or gone) is damaged, and passed over with the others,
  // saying why, never in silence.
  std::vector<std::string> order;
  OB_ASSIGN_OR_RETURN(auto all, List(dir));
  auto committed = [](const CheckpointInfo& c) {
    int64_t step = 0;
    bool partial = true;
    return ParseStepName(fs::path(c.path).filename().string(), &step, &partial) && !partial;
  };
  for (const CheckpointInfo& c : all)
    if (c.complete && c.latest) order.push_back(c.path);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (committed(*it) && (order.empty() || it->path != order.front())) order.push_back(it->path);
  }
  Verified out;
  for (const std::string& path : order) {
    Status st = Verify(path);
    Result<pb::Manifest> m = st.ok() ? LoadManifest(path) : Result<pb::Manifest>(st);
    std::string why = m.ok() ? (accept ? accept(*m) : "") : FirstLine(m.status().message());
    if (why.empty()) {
      out.path = path;
      out.manifest = std::move(m).value();
      // Newer ones refuted that `latest` no longer names are passed over too.
      const auto tried_to = std::find(order.begin(), order.end(), path);
      for (auto c = all.rbegin(); c != all.rend(); ++c) {
        if (c->complete && !c->refuted.empty() && c->step > static_cast<int64_t>(out.manifest.step()) &&
            std::find(order.begin(), order.end(), c->path) > tried_to) {
          out.skipped.push_back(Refuted(c->path, c->refuted).message());
        }
      }
      return out;
    }
    // Verify's messages name the file already; others get the checkpoint.
    out.skipped.push_back(why.compare(0, path.size(), path) == 0 ? why : path + ": " + why);
  }
  if (out.skipped.empty()) return Status::NoInput(dir + ": no complete checkpoint");
  return Status::DataErr(dir + ": none of " + std::to_string(out.skipped.size()) +
                         " checkpoint(s) can be used (newest: " + out.skipped.front() + ")");
}

Result<pb::Manifest> LoadManifest(const std::string& ckpt_path) {
  struct stat st;
  if (stat(ckpt_path.c_str(), &st) != 0)
    return Status::NoInput(ckpt_path + ": cannot open: " + Errno());
  if (!S_ISDIR(st.st_mode)) return Status::NoInput(ckpt_path + ": not a checkpoint directory");
  const std::string path = io::JoinPath(ckpt_path, kManifestName);
  if (stat(path.c_str(), &st) != 0)
    return Status::DataErr(path + ": missing (not a committed checkpoint)");
  pb::Manifest m;
  Status s = LoadStored(path, &m);
  if (!s.ok()) return Status::DataErr(s.message());
  std::set<std::string> seen;
  uint64_t entries = 0;
  for (const auto& f : m.files()) {
    if (std::string why = PathProblem(f.path()); !why.empty())
      return Status::DataErr(path + ": file path " + Quote(f.path()) + " " + why);
    if (!seen.insert(f.path()).second)
      return Status::DataErr(path + ": file " + Quote(f.path()) + " is listed twice");
    entries += static_cast<uint64_t>(f.layers_size());
  }
  if (m.num_layers() == 0) return m;  // written before num_layers existed
  // Checked before anything is sized by num_layers, which a hostile file sets.
  if (m.num_layers() != entries)
    return Status::DataErr(path + ": " + std::to_string(m.num_layers()) +
                           " layers, but the files list " + std::to_string(entries));
  std::vector<int> count(m.num_layers(), 0);
  for (const auto& f : m.files()) {
    for (uint32_t l : f.layers()) {
      if (l >= m.num_layers())
        return Status::DataErr(path + ": " + f.path() + " holds layer " + std::to_string(l) +
                               " of " + std::to_string(m.num_layers()));
      if (++count[l] > 1)
        return Status::DataErr(path + ": layer " + std::to_string(l) + " is in two files");
    }
  }
  // As many layer entries as layers, all distinct and in range: each layer is
  // in exactly one file.
  return m;
}

Status Verify(const std::string& ckpt_path, const Progress& progress) {
  OB_ASSIGN_OR_RETURN(auto m, LoadManifest(ckpt_path));
  OB_RETURN_IF_ERROR(NotRefuted(ckpt_path));
  uint64_t total = 0, done = 0;
  for (const auto& f : m.files()) total += f.size();
  for (const auto& f : m.files()) {
    OB_ASSIGN_OR_RETURN(std::string full, ResolveInside(ckpt_path, f));
    OB_ASSIGN_OR_RETURN(std::string sum, ScanFile(full, f.size(), {}, progress, &done, total));
    if (sum != f.checksum())
      return Status::DataErr(full + ": checksum mismatch: " + sum + ", the manifest says " +
                             f.checksum());
    if (EndsWith(f.path(), ".safetensors")) {
      auto h = ReadSafetensorsHeader(full);
      if (!h.ok()) return Status::DataErr(h.status().message());
    }
  }
  return Status::Ok();
}

Status Export(const std::string& ckpt_path, const std::string& out, bool with_optimizer,
              const Progress& progress) {
  OB_ASSIGN_OR_RETURN(auto m, LoadManifest(ckpt_path));
  OB_RETURN_IF_ERROR(NotRefuted(ckpt_path));  // weights trained on other data leave only on purpose
  struct Source {
    std::string path;
    const pb::CheckpointFile* file;
    SafetensorsHeader header;
    std::vector<SafetensorsEntry> picked;  // by offset
  };
  std::vector<Source> sources;
  std::vector<SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                 {"ob.step", std::to_string(m.step())}};
  if (!m.model().name().empty()) metadata["ob.model"] = m.model().name();
  std::set<std::string> names;
  uint64_t total = 0;
  for (const auto& f : m.files()) {
    if (!EndsWith(f.path(), ".safetensors")) continue;
    OB_ASSIGN_OR_RETURN(std::string full, ResolveInside(ckpt_path, f));
    auto h = ReadSafetensorsHeader(full);
    if (!h.ok()) return Status::DataErr(h.status().message());
    Source src{full, &f, std::move(*h), {}};
    for (const auto& e : src.header.tensors) {
      if (!with_optimizer && IsMoment(e.name)) continue;
      if (!names.insert(e.name).second)
        return Status::DataErr(full + ": tensor " + Quote(e.name) + " is also in another file");
      src.picked.push_back(e);
      tensors.push_back(e);
    }
    if (with_optimizer)
      for (const auto& [k, v] : src.header.metadata) metadata[k] = v;
    total += f.size();
    sources.push_back(std::move(src));
  }
  OB_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::Open(out, std::move(tensors), metadata));
  uint64_t done = 0;
  for (const auto& src : sources) {
    // Copies the parts of each chunk that fall in picked tensors, in order.
    size_t next = 0;
    auto copy = [&](const char* data, uint64_t off, uint64_t n) -> Status {
      while (next < src.picked.size()) {
        const uint64_t b = src.header.data_offset + src.picked[next].begin;
        const uint64_t e = src.header.data_offset + src.picked[next].end;
        const uint64_t lo = std::max(b, off), hi = std::min(e, off + n);
        if (lo < hi) OB_RETURN_IF_ERROR(writer->Append(data + (lo - off), hi - lo));
        if (e > off + n) break;  // the tensor goes on in the next chunk
        ++next;
      }
      return Status::Ok();
    };
    OB_ASSIGN_OR_RETURN(std::string sum, ScanFile(src.path, src.file->size(), copy, progress, &done, total));
    if (sum != src.file->checksum())
      return Status::DataErr(src.path + ": checksum mismatch: " + sum + ", the manifest says " +
                             src.file->checksum() + "; nothing exported");
  }
  return writer->Finish(nullptr, nullptr);
}

Result<std::vector<std::string>> Prune(const std::string& dir, int keep) {
  if (keep < 1) return Status::Usage("--keep must be at least 1, got " + std::to_string(keep));
  OB_ASSIGN_OR_RETURN(auto all, List(dir));
  std::vector<const CheckpointInfo*> complete;
  for (const auto& c : all)
    if (c.complete && c.refuted.empty()) complete.push_back(&c);
  std::vector<std::string> removed;
  const size_t protect_from = complete.size() > static_cast<size_t>(keep) ? complete.size() - keep : 0;
  for (size_t i = 0; i < protect_from; ++i) {
    const CheckpointInfo& c = *complete[i];
    if (c.latest) continue;  // `latest` still names it: a resume would want it
    const std::string doomed = c.path + kDeletingSuffix;
    if (rename(c.path.c_str(), doomed.c_str()) != 0)
      return Status::IoErr(c.path + ": cannot rename for removal: " + Errno());
    OB_RETURN_IF_ERROR(FsyncDir(dir));
    std::error_code ec;
    io::RemoveTree(doomed, &ec);
    if (ec) return Status::IoErr(doomed + ": cannot remove: " + ec.message());
    removed.push_back(c.path);
  }
  return removed;
}

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
