// Writing a checkpoint (see checkpoint.h, "Protocol"): every writer's
// layer files and part, and the commit that merges the parts into the
// manifest and renames the directory.
#include "ob/ckpt/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <map>
#include <utility>

#include "ob/build_info.h"
#include "ob/ckpt/checkpoint_impl.h"
#include "ob/clock.h"
#include "ob/io/file.h"
#include "ob/io/message.h"
#include "ob/log.h"

namespace ob::ckpt {
namespace {

using namespace detail;  // checkpoint_impl.h
namespace fs = std::filesystem;

using PartNames = std::vector<std::pair<int, std::string>>;  // (rank, file name)

// The writers' parts in `partial`, by rank, and the other files there
// (temporaries and leftovers not to commit).
Status ListParts(const std::string& partial, PartNames* part_names, std::vector<std::string>* stale) {
  std::error_code ec;
  for (fs::directory_iterator it(partial, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("part-", 0) == 0 && EndsWith(name, ".pb")) {
      const std::string digits = name.substr(5, name.size() - 8);
      if (!digits.empty() && digits.size() < 9 &&
          std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        part_names->emplace_back(std::stoi(digits), name);
        continue;
      }
    }
    stale->push_back(name);
  }
  if (ec) return Status::IoErr(partial + ": cannot list: " + ec.message());
  std::sort(part_names->begin(), part_names->end());
  return Status::Ok();
}

// The parts' files merged into *merged: each layer in exactly one file,
// every file present at its size, sorted by layer; *listed maps each file
// to the part that lists it.
Status MergeParts(const std::string& partial, int64_t step, int num_layers, const PartNames& part_names,
                  pb::Manifest* merged, std::map<std::string, std::string>* listed) {
  std::vector<std::string> owner(static_cast<size_t>(num_layers));  // "file (part)"
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
      if (auto [it, fresh] = listed->emplace(f.path(), name); !fresh)
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
      *merged->add_files() = f;
    }
  }
  std::vector<int> missing;
  for (int l = 0; l < num_layers; ++l)
    if (owner[static_cast<size_t>(l)].empty()) missing.push_back(l);
  if (!missing.empty())
    return Status::DataErr(partial + ": incomplete: layer" + (missing.size() > 1 ? "s " : " ") +
                           LayerList(missing) + " missing");
  std::sort(merged->mutable_files()->begin(), merged->mutable_files()->end(),
            [](const pb::CheckpointFile& a, const pb::CheckpointFile& b) {
              const int64_t la = a.layers_size() ? a.layers(0) : INT64_MAX;
              const int64_t lb = b.layers_size() ? b.layers(0) : INT64_MAX;
              return la != lb ? la < lb : a.path() < b.path();
            });
  merged->set_format_version(io::kManifestFormatVersion);
  merged->set_end(io::kManifestEndMarker);
  return Status::Ok();
}

// The manifest written, the parts and leftovers removed, then the rename
// that commits (moving aside a committed copy of the same step), then
// `latest`.
Status Publish(const std::string& dir, int64_t step, const pb::Manifest& merged, const PartNames& part_names,
               const std::vector<std::string>& stale, const std::map<std::string, std::string>& listed) {
  const std::string partial = PartialPath(dir, step), final_path = StepPath(dir, step);
  std::error_code ec;
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
  return Status::Ok();
}

}  // namespace

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

  PartNames part_names;
  std::vector<std::string> stale;  // temporaries and leftovers not to commit
  OB_RETURN_IF_ERROR(ListParts(partial, &part_names, &stale));

  pb::Manifest merged = base;
  merged.clear_files();
  merged.clear_rank();
  merged.set_step(static_cast<uint64_t>(step));
  merged.set_num_layers(static_cast<uint32_t>(num_layers));
  if (merged.created_unix_ms() == 0)
    merged.set_created_unix_ms(UnixMs());
  if (merged.ob_version().empty()) merged.set_ob_version(OB_VERSION);

  std::map<std::string, std::string> listed;  // path -> part
  OB_RETURN_IF_ERROR(MergeParts(partial, step, num_layers, part_names, &merged, &listed));
  OB_RETURN_IF_ERROR(Publish(dir, step, merged, part_names, stale, listed));
  return merged;
}

}  // namespace ob::ckpt
