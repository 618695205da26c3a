// What a --data spec names, and what identifies those files across hosts
// and runs (model/data.h): a Megatron dataset's .bin, a blend's files, the
// fingerprint, the sum of every byte, the identity, the facts handed to
// workers. The sampling itself is data.cc's.
#include <sys/stat.h>
#include <xxhash.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ob/data/megatron.h"
#include "ob/io/file.h"
#include "ob/io/text.h"
#include "ob/model/data.h"

namespace ob::model {

namespace {

// "xxh3=<16 hex>": how the fingerprint and the content sum write a hash
// (data.cc's content sum too).
std::string SumText(XXH64_hash_t h) { return io::HashText("xxh3=", h); }

int64_t WallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Result<std::vector<BlendPart>> ParseBlend(const std::string& spec) {
  std::vector<BlendPart> parts;
  struct stat st {};
  if (spec == "synthetic" || spec.find(':') == std::string::npos || ::stat(spec.c_str(), &st) == 0) return parts;
  // A blend only when it starts as one: a number, then ':'.
  char* end = nullptr;
  std::strtod(spec.c_str(), &end);
  if (end == spec.c_str() || *end != ':') return parts;
  auto bad = [&](const std::string& why) {
    return Status::Usage("--data " + spec + ": " + why + " (a blend is W1:PATH1,W2:PATH2,... with weights > 0)");
  };
  size_t at = 0;
  while (at <= spec.size()) {
    size_t comma = spec.find(',', at);
    if (comma == std::string::npos) comma = spec.size();
    const std::string item = spec.substr(at, comma - at);
    const size_t colon = item.find(':');
    if (colon == std::string::npos) return bad("'" + item + "' has no weight");
    const std::string w = item.substr(0, colon);
    char* wend = nullptr;
    const double weight = std::strtod(w.c_str(), &wend);
    if (w.empty() || wend != w.c_str() + w.size() || !(weight > 0) || !std::isfinite(weight)) {
      return bad("'" + w + "' is not a weight > 0");
    }
    BlendPart part{weight, item.substr(colon + 1)};
    if (part.path.empty()) return bad("a weight without a path");
    for (const BlendPart& p : parts)
      if (p.path == part.path) return bad(part.path + " is given twice");
    parts.push_back(std::move(part));
    at = comma + 1;
  }
  if (parts.size() < 2) return bad("one file is not a blend: give it without its weight");
  return parts;
}

std::vector<std::string> DataFiles(const std::string& spec) {
  Result<std::vector<BlendPart>> parts = ParseBlend(spec);
  if (!parts.ok() || parts->empty()) return {DataFile(spec)};
  std::vector<std::string> files;
  for (const BlendPart& p : *parts) files.push_back(DataFile(p.path));
  return files;
}

std::string DataFile(const std::string& spec) {
  const std::string prefix = data::MegatronPrefix(spec);
  return prefix.empty() ? spec : prefix + ".bin";
}

std::string DataFingerprint(const std::string& spec) {
  if (spec == "synthetic") return spec;
  if (Result<std::vector<BlendPart>> parts = ParseBlend(spec); parts.ok() && !parts->empty()) {
    std::string out;  // each part's, with its weight
    for (const BlendPart& p : *parts) {
      const std::string f = DataFingerprint(p.path);
      if (f.empty()) return "";
      out += (out.empty() ? "" : ",") + std::to_string(p.weight) + ":" + f;
    }
    return out;
  }
  const int fd = ::open(DataFile(spec).c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return "";
  }
  constexpr size_t kEdge = size_t{1} << 20;
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  std::string buf(reinterpret_cast<const char*>(&size), sizeof size);
  const size_t head = static_cast<size_t>(std::min<uint64_t>(size, kEdge));
  const uint64_t tail_at = size > 2 * kEdge ? size - kEdge : head;
  const size_t tail = static_cast<size_t>(size - tail_at);
  buf.resize(sizeof size + head + tail);
  bool ok = ::pread(fd, &buf[sizeof size], head, 0) == static_cast<ssize_t>(head) &&
            (tail == 0 || ::pread(fd, &buf[sizeof size + head], tail, static_cast<off_t>(tail_at)) ==
                              static_cast<ssize_t>(tail));
  ::close(fd);
  if (!ok) return "";
  return "bytes=" + std::to_string(size) + " " + SumText(XXH3_64bits(buf.data(), buf.size()));
}

Result<std::string> FileContentSum(const std::string& path, const std::atomic<bool>* stop,
                                   std::atomic<uint64_t>* done, const ScanCache* cache) {
  struct stat before {};
  const bool cacheable = cache != nullptr && ::stat(path.c_str(), &before) == 0 && S_ISREG(before.st_mode);
  if (cacheable) {
    if (std::optional<ScanEntry> e = cache->Find(before)) {
      if (done != nullptr) done->fetch_add(static_cast<uint64_t>(before.st_size));
      return e->sum;
    }
  }
  const int64_t pass_start_ns = WallNs();
  OB_ASSIGN_OR_RETURN(io::FileHash h, io::HashFile(path, [&](const char*, uint64_t, uint64_t n) -> Status {
                        if (stop != nullptr && stop->load()) return Status::Unavailable(path + ": read stopped");
                        if (done != nullptr) done->fetch_add(n);
                        return Status::Ok();
                      }));
  if (h.bytes != h.size) {
    return Status::DataErr(path + ": changed size while being read (" + std::to_string(h.size) + " bytes at first)");
  }
  const std::string text = SumText(h.xxh3);
  struct stat after {};
  if (cacheable && ::stat(path.c_str(), &after) == 0 && IdentityOf(after) == IdentityOf(before)) {
    cache->Remember(after, {"", "", -1, text}, pass_start_ns);
  }
  return text;
}

std::string FileIdentity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  return IdentityOf(st);
}

std::string TokenFileFacts::Encode() const {
  return std::to_string(bytes) + ":" + std::to_string(mtime_ns) + ":" + std::to_string(max_token);
}

Result<TokenFileFacts> TokenFileFacts::Decode(const std::string& text) {
  TokenFileFacts f;
  unsigned long long bytes = 0;
  long long mtime = 0;
  int max = -1, end = 0;
  if (std::sscanf(text.c_str(), "%llu:%lld:%d%n", &bytes, &mtime, &max, &end) != 3 ||
      end != static_cast<int>(text.size()) || max < 0) {
    return Status::Usage("malformed token file facts '" + text + "' (want BYTES:MTIME_NS:MAX_TOKEN)");
  }
  f.bytes = bytes;
  f.mtime_ns = mtime;
  f.max_token = max;
  return f;
}

}  // namespace ob::model
