// The checkpoints under a root (see checkpoint.h): listing them, the one to
// resume from (latest, or the newest that verifies), and removing partial,
// old and half-deleted ones.
#include "ob/ckpt/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "ob/ckpt/checkpoint_impl.h"
#include "ob/io/file.h"
#include "ob/log.h"

namespace ob::ckpt {

using namespace detail;  // checkpoint_impl.h
namespace fs = std::filesystem;

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

}  // namespace ob::ckpt
