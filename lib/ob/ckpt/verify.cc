// Reading a committed checkpoint (see checkpoint.h): its manifest loaded
// and checked, every file verified against its checksum, and the weights
// (with or without the AdamW moments) exported as one safetensors file.
#include "ob/ckpt/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <set>

#include "ob/ckpt/checkpoint_impl.h"
#include "ob/io/file.h"

namespace ob::ckpt {

using namespace detail;  // checkpoint_impl.h

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

}  // namespace ob::ckpt
