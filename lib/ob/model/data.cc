// TokenSource: mmapped token files and deterministic window sampling.
#include "ob/model/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <xxhash.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cassert>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "ob/clock.h"
#include "ob/data/megatron.h"
#include "ob/io/file.h"
#include "ob/io/text.h"

namespace ob::model {
namespace {

// llm.c's token file header: 256 int32 words, then the ids.
constexpr int32_t kLlmcMagic = 20240520;
constexpr size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

using io::EndsWith;

int64_t RealtimeNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int TokenBytes(TokenFormat f) {
  switch (f) {
    case TokenFormat::kU16: return 2;
    case TokenFormat::kU32: return 4;
    default: return 1;
  }
}

}  // namespace

struct TokenSource::Mapping {
  void* addr = nullptr;
  size_t bytes = 0;
  int fd = -1;  // the file mapped, kept open to see whether it changes (Unchanged)
  mutable std::atomic<int64_t> ctime_ns{0};  // as Touched last saw it
  ~Mapping() {
    if (addr != nullptr) munmap(addr, bytes);
    if (fd >= 0) ::close(fd);
  }
};

// A blend's parts and where in [0, 2^64) each one's share ends.
struct TokenSource::Blend {
  std::vector<TokenSource> parts;
  std::vector<double> weights;  // as given
  std::vector<uint64_t> ends;   // ascending; the last is 2^64 - 1
  int Choose(uint64_t seed, uint64_t step, uint64_t sample_index) const {
    // R2's constants, 1/ρ and 1/ρ² (ρ the plastic number), as 64-bit fractions.
    const uint64_t u = Mix64(seed, 0xB1E4D) + sample_index * 0xC13FA9A902A6328FULL + step * 0x91E10DA5C79E7B1DULL;
    size_t k = 0;
    while (k + 1 < ends.size() && u > ends[k]) ++k;
    return static_cast<int>(k);
  }
};

uint64_t Mix64(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = SplitMix64(a ^ 0x6a09e667f3bcc908ULL);
  h = SplitMix64(h ^ b);
  return SplitMix64(h ^ SplitMix64(c + 0xbb67ae8584caa73bULL));
}

const char* TokenFormatName(TokenFormat f) {
  switch (f) {
    case TokenFormat::kAuto: return "auto";
    case TokenFormat::kU16: return "u16";
    case TokenFormat::kU32: return "u32";
    case TokenFormat::kText: return "text";
    case TokenFormat::kSynthetic: return "synthetic";
  }
  return "?";
}

Result<TokenFormat> ParseTokenFormat(const std::string& name) {
  for (TokenFormat f : {TokenFormat::kAuto, TokenFormat::kU16, TokenFormat::kU32,
                        TokenFormat::kText, TokenFormat::kSynthetic}) {
    if (name == TokenFormatName(f)) return f;
  }
  return Status::Usage("unknown data format '" + name +
                       "' (known: auto, u16, u32, text, synthetic)");
}

namespace {

// "xxh3=<16 hex>": how the content sum writes a hash (data_files.cc's too).
std::string Xxh3Text(XXH64_hash_t h) { return io::HashText("xxh3=", h); }

}  // namespace

TokenFormat TokenFormatForPath(const std::string& path) {
  return EndsWith(path, ".bin") ? TokenFormat::kU16 : EndsWith(path, ".u32") ? TokenFormat::kU32 : TokenFormat::kText;
}

Result<TokenSource> TokenSource::Open(const std::string& path, TokenFormat format,
                                      const TokenFileFacts* known, const ScanCache* cache) {
  if (format == TokenFormat::kSynthetic) {
    return Status::Usage(path + ": synthetic data has no file (use TokenSource::Synthetic)");
  }
  if (format == TokenFormat::kAuto) {
    OB_ASSIGN_OR_RETURN(std::vector<BlendPart> blend, ParseBlend(path));
    if (!blend.empty()) {  // each file as it is; `known` facts are one file's
      std::vector<TokenSource> parts;
      std::vector<double> weights;
      for (const BlendPart& p : blend) {
        OB_ASSIGN_OR_RETURN(TokenSource part, Open(p.path, TokenFormat::kAuto, nullptr, cache));
        parts.push_back(std::move(part));
        weights.push_back(p.weight);
      }
      return Blended(std::move(parts), weights, path);
    }
  }
  // A Megatron dataset (data/megatron.h): its .bin, read as its .idx says.
  const std::string megatron = format == TokenFormat::kAuto ? data::MegatronPrefix(path) : std::string();
  const std::string file = megatron.empty() ? path : megatron + ".bin";
  if (format == TokenFormat::kAuto) format = TokenFormatForPath(file);
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
  const int fd = ::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return Status::NoInput(file + ": cannot read: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return Status::NoInput(path + ": cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    if (S_ISDIR(st.st_mode)) {
      return Status::DataErr(path + ": a directory, not a token file (give a file of it)");
    }
    return Status::DataErr(path + ": not a regular file (" +
                           (S_ISFIFO(st.st_mode) ? std::string("a FIFO") : std::string("a device or socket")) +
                           "): training samples token windows at random offsets, so the data "
                           "must be a file; save the stream to one first");
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (!megatron.empty()) {
    Result<data::MegatronIndex> ix = data::ReadMegatronIndex(megatron, bytes);
    if (!ix.ok()) {
      ::close(fd);
      return ix.status();
    }
    format = ix->token_bytes == 2 ? TokenFormat::kU16 : TokenFormat::kU32;
  }
  if (bytes == 0) {
    ::close(fd);
    return Status::DataErr(file + ": empty data file");
  }
  void* addr = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  if (addr == MAP_FAILED) {
    ::close(fd);
    return Status::NoInput(path + ": cannot map: " + std::strerror(map_errno));
  }
  auto map = std::make_shared<Mapping>();
  map->addr = addr;
  map->bytes = bytes;
  map->fd = fd;
  map->ctime_ns = TimeNs(st.st_ctim);

  TokenSource src;
  src.path_ = path;
  src.map_ = map;
  src.file_bytes_ = bytes;
  src.mtime_ns_ = TimeNs(st.st_mtim);
  const auto* base = static_cast<const unsigned char*>(addr);
  size_t offset = 0;
  size_t payload = bytes;

  int32_t header[3] = {0, 0, 0};
  if (format == TokenFormat::kU16 && bytes >= kLlmcHeaderBytes && megatron.empty()) {
    std::memcpy(header, base, sizeof(header));
  }
  if (header[0] == kLlmcMagic) {
    if (header[1] != 1 && header[1] != 2) {
      return Status::DataErr(path + ": llm.c token file version " + std::to_string(header[1]) +
                             " is not supported (1 = uint16, 2 = uint32)");
    }
    format = header[1] == 1 ? TokenFormat::kU16 : TokenFormat::kU32;
    offset = kLlmcHeaderBytes;
    payload = bytes - kLlmcHeaderBytes;
    const uint64_t declared = static_cast<uint32_t>(header[2]);
    if (declared * TokenBytes(format) != payload) {
      return Status::DataErr(path + ": llm.c header declares " + std::to_string(declared) +
                             " tokens but the file holds " + std::to_string(payload) +
                             " bytes of tokens (truncated?)");
    }
  }
  src.format_ = format;
  const int width = TokenBytes(format);
  if (payload % width != 0) {
    return Status::DataErr(path + ": size " + std::to_string(payload) +
                           " bytes is not a multiple of " + std::to_string(width) + " (" +
                           TokenFormatName(format) + " tokens; truncated?)");
  }
  src.tokens_ = base + offset;
  src.size_ = payload / width;
  if (src.size_ == 0) return Status::DataErr(path + ": no tokens");

  // Largest id, once, so a model with too small a vocabulary can be refused.
  if (known != nullptr && known->bytes == src.file_bytes_ && known->mtime_ns == src.mtime_ns_ &&
      known->max_token >= 0) {
    src.max_token_ = known->max_token;
    return src;
  }
  // Or from an earlier pass over this very file (scan_cache.h).
  if (cache != nullptr) {
    if (std::optional<ScanEntry> e = cache->Find(st); e && e->format == TokenFormatName(format)) {
      src.max_token_ = e->max_token;
      src.content_sum_ = e->sum;
      return src;
    }
  }
  const int64_t pass_start_ns = RealtimeNs();
  // One pass, a chunk at a time while it is in cache: the largest id and
  // the hash of every byte (the header's too).
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> sum(XXH3_createState(), XXH3_freeState);
  if (sum == nullptr || XXH3_64bits_reset(sum.get()) != XXH_OK) {
    return Status::Internal(path + ": cannot make a hash state");
  }
  XXH3_64bits_update(sum.get(), base, offset);
  constexpr size_t kChunk = size_t{1} << 20;  // a multiple of every token width
  uint64_t max_id = 0;
  for (size_t at = 0; at < payload; at += kChunk) {
    const size_t len = std::min(kChunk, payload - at);
    const unsigned char* chunk = src.tokens_ + at;
    XXH3_64bits_update(sum.get(), chunk, len);
    if (format == TokenFormat::kU16) {
      for (size_t i = 0; i < len; i += 2) {
        uint16_t v;
        std::memcpy(&v, chunk + i, 2);
        max_id = std::max<uint64_t>(max_id, v);
      }
    } else if (format == TokenFormat::kU32) {
      for (size_t i = 0; i < len; i += 4) {
        uint32_t v;
        std::memcpy(&v, chunk + i, 4);
        max_id = std::max<uint64_t>(max_id, v);
      }
    } else {
      for (size_t i = 0; i < len; ++i) max_id = std::max<uint64_t>(max_id, chunk[i]);
    }
  }
  if (format == TokenFormat::kU32 && max_id > 0x7fffffffULL) {
    return Status::DataErr(path + ": token id " + std::to_string(max_id) + " is out of range");
  }
  src.max_token_ = static_cast<int>(max_id);
  src.content_sum_ = Xxh3Text(XXH3_64bits_digest(sum.get()));
  struct stat after {};
  if (cache != nullptr && fstat(fd, &after) == 0 && IdentityOf(after) == IdentityOf(st)) {
    cache->Remember(after, {"", TokenFormatName(format), src.max_token_, src.content_sum_}, pass_start_ns);
  }
  return src;
}

TokenSource TokenSource::Blended(std::vector<TokenSource> parts, const std::vector<double>& weights,
                                 const std::string& spec) {
  assert(parts.size() == weights.size() && !parts.empty());
  auto blend = std::make_shared<Blend>();
  long double total = 0;
  for (double w : weights) total += w;
  long double cum = 0;
  for (size_t k = 0; k < weights.size(); ++k) {
    cum += weights[k];
    const long double end = cum / total * 18446744073709551616.0L;
    blend->ends.push_back(k + 1 == weights.size() || end >= 18446744073709551615.0L ? UINT64_MAX
                                                                                     : static_cast<uint64_t>(end));
  }
  TokenSource src;
  src.path_ = spec;
  src.size_ = SIZE_MAX;
  src.max_token_ = 0;
  src.format_ = TokenFormat::kU16;
  for (const TokenSource& p : parts) {
    src.size_ = std::min(src.size_, p.size());
    src.max_token_ = std::max(src.max_token_, p.max_token());
    if (p.format() == TokenFormat::kText) src.format_ = TokenFormat::kText;
    if (p.content_sum().empty() || src.content_sum_ == "-") {
      src.content_sum_ = "-";
    } else {
      src.content_sum_ += (src.content_sum_.empty() ? "" : ",") + p.content_sum();
    }
  }
  if (src.content_sum_ == "-") src.content_sum_.clear();
  blend->parts = std::move(parts);
  blend->weights = weights;
  src.blend_ = std::move(blend);
  return src;
}

int TokenSource::parts() const { return blend_ ? static_cast<int>(blend_->parts.size()) : 1; }

int TokenSource::Part(uint64_t seed, uint64_t step, uint64_t sample_index) const {
  return blend_ ? blend_->Choose(seed, step, sample_index) : 0;
}

double TokenSource::weight(int i) const { return blend_ ? blend_->weights[static_cast<size_t>(i)] : 1.0; }

const TokenSource& TokenSource::part(int i) const {
  return blend_ ? blend_->parts[static_cast<size_t>(i)] : *this;
}

TokenSource TokenSource::Synthetic(int vocab_size, uint64_t seed, size_t size) {
  assert(vocab_size > 0 && size >= 2);
  TokenSource src;
  src.format_ = TokenFormat::kSynthetic;
  src.path_ = "synthetic";
  src.size_ = size;
  src.max_token_ = vocab_size - 1;
  src.synthetic_seed_ = seed;
  src.synthetic_vocab_ = vocab_size;
  return src;
}

Status TokenSource::Check(int seq_len, int vocab_size) const {
  if (blend_) {
    for (const TokenSource& p : blend_->parts) OB_RETURN_IF_ERROR(p.Check(seq_len, vocab_size));
    return Status::Ok();
  }
  if (seq_len <= 0 || size_ < static_cast<size_t>(seq_len) + 1) {
    return Status::DataErr(path_ + ": " + std::to_string(size_) +
                           " tokens is too short for sequences of " + std::to_string(seq_len) +
                           " (needs at least " + std::to_string(seq_len + 1) + ")");
  }
  if (max_token_ >= vocab_size) {
    return Status::DataErr(path_ + ": token id " + std::to_string(max_token_) +
                           " does not fit the model's vocabulary of " +
                           std::to_string(vocab_size));
  }
  return Status::Ok();
}

int64_t TokenSource::at(size_t p) const {
  assert(p < size_);
  switch (format_) {
    case TokenFormat::kU16: {
      uint16_t v;
      std::memcpy(&v, tokens_ + 2 * p, 2);
      return v;
    }
    case TokenFormat::kU32: {
      uint32_t v;
      std::memcpy(&v, tokens_ + 4 * p, 4);
      return v;
    }
    case TokenFormat::kSynthetic:
      return static_cast<int64_t>(Mix64(synthetic_seed_, synthetic_base_ + p) %
                                  static_cast<uint64_t>(synthetic_vocab_));
    default:
      return tokens_[p];
  }
}

Status TokenSource::Unchanged() const {
  if (blend_) {
    for (const TokenSource& p : blend_->parts) OB_RETURN_IF_ERROR(p.Unchanged());
    return Status::Ok();
  }
  if (map_ == nullptr || map_->fd < 0) return Status::Ok();
  struct stat st {};
  if (fstat(map_->fd, &st) != 0) return Status::IoErr(path_ + ": cannot stat: " + std::strerror(errno));
  const int64_t mtime = TimeNs(st.st_mtim);
  if (static_cast<uint64_t>(st.st_size) == file_bytes_ && mtime == mtime_ns_) return Status::Ok();
  auto when = [](int64_t ns) { return FormatUtcSeconds(ns / 1000000); };
  return Status::DataErr(path_ + ": rewritten while the run read it (" + std::to_string(file_bytes_) +
                         " bytes modified " + when(mtime_ns_) + " when opened, now " +
                         std::to_string(static_cast<uint64_t>(st.st_size)) + " bytes modified " + when(mtime) +
                         "): the tokens read since are not the job's data. Restore it, or resume on the new "
                         "file with --resume-from-other; a file written anew and renamed into place leaves "
                         "running jobs the old one");
}

std::string TokenSource::Touched() const {
  if (map_ == nullptr || map_->fd < 0) return "";
  struct stat st {};
  if (fstat(map_->fd, &st) != 0) return "";
  const int64_t now = TimeNs(st.st_ctim);
  if (map_->ctime_ns.exchange(now) == now) return "";
  return IdentityOf(st);
}

std::string TokenSource::ReadPath() const {
  if (map_ == nullptr || map_->fd < 0) return path_;
  return "/proc/self/fd/" + std::to_string(map_->fd);
}

TokenSource TokenSource::Window(size_t first, size_t count) const {
  assert(first + count <= size_);
  TokenSource w = *this;
  switch (format_) {
    case TokenFormat::kU16: w.tokens_ += 2 * first; break;
    case TokenFormat::kU32: w.tokens_ += 4 * first; break;
    case TokenFormat::kSynthetic: w.synthetic_base_ += first; break;
    default: w.tokens_ += first; break;
  }
  w.size_ = count;
  return w;
}

Status SplitForEval(const TokenSource& all, double fraction, int seq_len, TokenSource* train,
                    TokenSource* eval) {
  if (!(fraction > 0 && fraction < 1)) {
    return Status::Usage("an evaluation split of " + std::to_string(fraction) + " is not between 0 and 1");
  }
  if (all.parts() > 1) {  // each file split, the parts blended again with their weights
    std::vector<TokenSource> trains, evals;
    std::vector<double> weights;
    for (int k = 0; k < all.parts(); ++k) {
      TokenSource t = all.part(k), e = all.part(k);
      OB_RETURN_IF_ERROR(SplitForEval(all.part(k), fraction, seq_len, &t, &e));
      trains.push_back(std::move(t));
      evals.push_back(std::move(e));
      weights.push_back(all.weight(k));
    }
    *train = TokenSource::Blended(std::move(trains), weights, all.path());
    *eval = TokenSource::Blended(std::move(evals), weights, all.path());
    return Status::Ok();
  }
  const size_t n = all.size();
  const size_t held = static_cast<size_t>(static_cast<double>(n) * fraction);
  const size_t window = static_cast<size_t>(seq_len) + 1;
  if (held < window || n - held < window) {
    return Status::DataErr(all.path() + ": " + std::to_string(n) + " tokens split " +
                           std::to_string(n - held) + " for training and " + std::to_string(held) +
                           " for evaluation; each part needs at least " + std::to_string(window) +
                           " (one sequence and its next token)");
  }
  *train = all.Window(0, n - held);
  *eval = all.Window(n - held, held);
  return Status::Ok();
}

size_t TokenSource::Offset(uint64_t seed, uint64_t step, uint64_t sample_index,
                           int seq_len) const {
  if (blend_) return part(Part(seed, step, sample_index)).Offset(seed, step, sample_index, seq_len);
  assert(seq_len > 0 && size_ >= static_cast<size_t>(seq_len) + 1);
  const uint64_t windows = size_ - static_cast<size_t>(seq_len);  // starts 0..size-seq_len-1
  return static_cast<size_t>(Mix64(seed, step, sample_index) % windows);
}

void TokenSource::Sample(uint64_t seed, uint64_t step, uint64_t sample_index, int seq_len,
                         int64_t* x, int64_t* y) const {
  if (blend_) return part(Part(seed, step, sample_index)).Sample(seed, step, sample_index, seq_len, x, y);
  const size_t off = Offset(seed, step, sample_index, seq_len);
  int64_t prev = at(off);
  for (int i = 0; i < seq_len; ++i) {
    const int64_t next = at(off + i + 1);
    x[i] = prev;
    y[i] = next;
    prev = next;
  }
}

}  // namespace ob::model
