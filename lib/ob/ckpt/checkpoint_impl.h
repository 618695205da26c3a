// The private parts of checkpoint directories (checkpoint.h) that its .cc
// files share: the names in a checkpoint root, and the checks and reads
// that committing (commit.cc), listing (catalog.cc), verifying and
// exporting (verify.cc) and refuting (refute.cc) make alike; checkpoint.cc
// defines them. Nothing outside lib/ob/ckpt includes it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ob/ckpt/checkpoint.h"
#include "ob/io/file.h"
#include "ob/io/text.h"

namespace ob::ckpt::detail {

inline constexpr char kPartialSuffix[] = ".partial";
// A pruned checkpoint is renamed to this first, so that it stops being a
// checkpoint at once even if the removal is cut short.
inline constexpr char kDeletingSuffix[] = ".deleting";
inline constexpr char kManifestName[] = "manifest.pb";
inline constexpr char kManifestJsonName[] = "manifest.json";
inline constexpr char kLatestName[] = "latest";
inline constexpr char kRefutedName[] = "REFUTED";
// The most a manifest or a part holds (its plan and file list: MBs at the
// largest), and `latest`: what ReadRegularFile reads of them.
inline constexpr uint64_t kManifestMaxBytes = uint64_t{1} << 30;
inline constexpr uint64_t kLatestMaxBytes = 4096;

using io::EndsWith;
using io::Errno;
using io::Quote;

// A manifest or part from a directory others may write (io::ReadRegularFile).
Status LoadStored(const std::string& path, pb::Manifest* m);
// "step-<digits>" (partial=false) or "step-<digits>.partial" (partial=true).
bool ParseStepName(const std::string& name, int64_t* step, bool* partial);
// Verify's refusal of a refuted checkpoint.
Status Refuted(const std::string& ckpt_path, const std::string& why);
bool IsDir(const std::string& path);
Status FsyncDir(const std::string& path);
// Why `path` may not be a manifest's file path, or "" when it may.
std::string PathProblem(const std::string& path);
// What DIR/latest names ("step-…"), or "" when it is missing or not a name.
std::string ReadLatestName(const std::string& dir);
// Sum of the sizes of the regular files under `path`.
uint64_t DiskBytes(const std::string& path);
// A committed checkpoint whose manifest loads, is of `step`, and whose files
// all exist at their sizes (their sum in *bytes).
bool IsComplete(const std::string& path, int64_t step, uint64_t* bytes);
// CKPT/file, after checking that it stays inside CKPT through symbolic links.
Result<std::string> ResolveInside(const std::string& ckpt, const pb::CheckpointFile& f);
// Reads `path` front to back in chunks, hashing every byte; `each` sees
// every chunk with its file offset. Reports bytes read to `progress`.
Result<std::string> ScanFile(const std::string& path, uint64_t size,
                             const std::function<Status(const char*, uint64_t, uint64_t)>& each,
                             const Progress& progress, uint64_t* done, uint64_t total);
// "0, 1, 2" for a list of layers, the first 20 named.
std::string LayerList(const std::vector<int>& layers);

}  // namespace ob::ckpt::detail
