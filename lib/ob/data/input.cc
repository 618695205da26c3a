#include "ob/data/input.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "ob/io/file.h"

namespace ob::data {
namespace {

bool HasSuffix(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// What the first bytes of a file say it is: "" for none of the formats
// below (text, or anything else).
std::string Sniff(std::string_view head) {
  auto starts = [&](std::string_view magic) { return head.substr(0, magic.size()) == magic; };
  if (starts("\x1f\x8b")) return "gzip";
  if (starts(std::string_view("\x28\xb5\x2f\xfd", 4))) return "zstd";
  if (starts(std::string_view("\xfd" "7zXZ\0", 6))) return "xz";
  if (head.size() >= 10 && starts("BZh") && head[3] >= '1' && head[3] <= '9' &&
      head.substr(4, 6) == "1AY&SY")
    return "bzip2";
  if (starts("PK\x03\x04")) return "zip";
  return "";
}

const char* CompressionName(Compression c) {
  switch (c) {
    case Compression::kGzip: return "gzip";
    case Compression::kZstd: return "zstd";
    case Compression::kNone: break;
  }
  return "";
}

class PlainReader : public ByteReader {
 public:
  Result<size_t> Read(char* buf, size_t n) override { return ReadRaw(buf, n); }
};

class GzipReader : public ByteReader {
 public:
  GzipReader() { in_.resize(size_t{1} << 18); }
  ~GzipReader() override {
    if (init_) inflateEnd(&z_);
  }
  Status Init() {
    std::memset(&z_, 0, sizeof z_);
    if (inflateInit2(&z_, 15 + 16) != Z_OK) return Status::Internal(name_ + ": zlib: cannot start");
    init_ = true;
    return Status::Ok();
  }
  Result<size_t> Read(char* buf, size_t n) override {
    const uInt want = static_cast<uInt>(std::min<size_t>(n, UINT32_MAX));
    z_.next_out = reinterpret_cast<Bytef*>(buf);
    z_.avail_out = want;
    while (z_.avail_out == want) {  // nothing out yet
      if (z_.avail_in == 0) {
        OB_ASSIGN_OR_RETURN(size_t got, ReadRaw(in_.data(), in_.size()));
        if (got == 0) {
          if (member_open_) return Status::DataErr(name_ + ": gzip data ends early (truncated)");
          return size_t{0};
        }
        z_.next_in = reinterpret_cast<Bytef*>(in_.data());
        z_.avail_in = static_cast<uInt>(got);
      }
      member_open_ = true;
      const int rc = inflate(&z_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        // Another member may follow: concatenated gzip files are one stream.
        member_open_ = false;
        if (inflateReset(&z_) != Z_OK) return Status::Internal(name_ + ": zlib: cannot reset");
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        return Status::DataErr(name_ + ": corrupt gzip data (zlib: " + (z_.msg ? z_.msg : "error") + ")");
      }
    }
    return static_cast<size_t>(want - z_.avail_out);
  }

 private:
  z_stream z_;
  bool init_ = false;
  bool member_open_ = false;
  std::string in_;
};

class ZstdReader : public ByteReader {
 public:
  ZstdReader() : ctx_(ZSTD_createDCtx()) { in_.resize(ZSTD_DStreamInSize()); }
  ~ZstdReader() override { ZSTD_freeDCtx(ctx_); }
  Result<size_t> Read(char* buf, size_t n) override {
    ZSTD_outBuffer out{buf, n, 0};
    while (out.pos == 0) {
      if (src_.pos == src_.size) {
        OB_ASSIGN_OR_RETURN(size_t got, ReadRaw(in_.data(), in_.size()));
        if (got == 0) {
          if (frame_open_) return Status::DataErr(name_ + ": zstd data ends early (truncated)");
          return size_t{0};
        }
        src_ = {in_.data(), got, 0};
      }
      const size_t rc = ZSTD_decompressStream(ctx_, &out, &src_);
      if (ZSTD_isError(rc)) {
        return Status::DataErr(name_ + ": corrupt zstd data (" + ZSTD_getErrorName(rc) + ")");
      }
      frame_open_ = rc != 0;
    }
    return out.pos;
  }

 private:
  ZSTD_DCtx* ctx_;
  std::string in_;
  ZSTD_inBuffer src_{nullptr, 0, 0};
  bool frame_open_ = false;
};

}  // namespace

ByteReader::~ByteReader() {
  if (own_fd_) ::close(fd_);
}

InputKind KindOf(const std::string& path) {
  InputKind k;
  std::string_view name = path;
  if (HasSuffix(name, ".gz")) {
    k.compression = Compression::kGzip;
    name.remove_suffix(3);
  } else if (HasSuffix(name, ".zst")) {
    k.compression = Compression::kZstd;
    name.remove_suffix(4);
  }
  k.json_lines = HasSuffix(name, ".jsonl") || HasSuffix(name, ".json") || HasSuffix(name, ".ndjson");
  return k;
}

Result<size_t> ByteReader::ReadRaw(char* buf, size_t n) {
  if (head_used_ < head_.size()) {
    const size_t k = std::min(n, head_.size() - head_used_);
    std::memcpy(buf, head_.data() + head_used_, k);
    head_used_ += k;
    return k;
  }
  for (;;) {
    const ssize_t got = ::read(fd_, buf, n);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return Status::NoInput(name_ + ": cannot read: " + std::strerror(errno));
    raw_bytes_ += static_cast<uint64_t>(got);
    return static_cast<size_t>(got);
  }
}

Result<std::unique_ptr<ByteReader>> ByteReader::Open(const std::string& path, bool stdin_json_lines) {
  const InputKind kind = path == "-" ? InputKind{Compression::kNone, stdin_json_lines} : KindOf(path);
  std::unique_ptr<ByteReader> r;
  switch (kind.compression) {
    case Compression::kNone: r = std::make_unique<PlainReader>(); break;
    case Compression::kGzip: r = std::make_unique<GzipReader>(); break;
    case Compression::kZstd: r = std::make_unique<ZstdReader>(); break;
  }
  r->name_ = io::DisplayName(path);
  r->kind_ = kind;
  if (path == "-") {
    r->fd_ = STDIN_FILENO;
  } else {
    r->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (r->fd_ < 0) return Status::NoInput(path + ": cannot read: " + std::strerror(errno));
    r->own_fd_ = true;
  }
  // The first bytes (up to 16; fewer only at the end of the input), to
  // check against the name.
  std::string head(16, '\0');
  size_t have = 0;
  while (have < head.size()) {
    OB_ASSIGN_OR_RETURN(size_t got, r->ReadRaw(head.data() + have, head.size() - have));
    if (got == 0) break;
    have += got;
  }
  head.resize(have);
  r->head_ = std::move(head);
  const std::string is = Sniff(r->head_);
  const std::string says = CompressionName(kind.compression);
  if (is != says) {
    if (says.empty()) {
      return Status::DataErr(r->name_ + ": " + is + "-compressed data, not text: " +
                             (is == "gzip" || is == "zstd"
                                  ? "name it *." + std::string(is == "gzip" ? "gz" : "zst") +
                                        " (e.g. corpus.jsonl." + (is == "gzip" ? "gz" : "zst") +
                                        ") for ob-data to decompress it"
                                  : "decompress it first"));
    }
    if (have > 0 || kind.compression != Compression::kNone) {
      return Status::DataErr(r->name_ + ": not " + says + " data, as its name says" +
                             (is.empty() ? std::string() : " (it holds " + is + " data)"));
    }
  }
  if (kind.compression == Compression::kGzip) {
    OB_RETURN_IF_ERROR(static_cast<GzipReader*>(r.get())->Init());
  }
  return r;
}

Status TextCheck::Add(std::string_view piece, const std::string& name) {
  const auto* p = reinterpret_cast<const unsigned char*>(piece.data());
  const size_t n = piece.size();
  size_t i = 0;
  auto fail = [&](const char* what) {
    const uint64_t line = line_ + static_cast<uint64_t>(std::count(piece.begin(), piece.begin() + i, '\n'));
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02X", p[i]);
    return Status::DataErr(name + ":" + std::to_string(line) + ": " + what + " (byte " + byte +
                           "): not UTF-8 text; give JSON Lines (*.jsonl) or text");
  };
  while (i < n) {
    if (need_ == 0) {
      // Runs of ASCII, eight bytes at a time.
      while (i + 8 <= n) {
        uint64_t w;
        std::memcpy(&w, p + i, 8);
        // No byte >= 0x80 and none zero.
        if ((w & 0x8080808080808080ULL) != 0 || ((w - 0x0101010101010101ULL) & ~w & 0x8080808080808080ULL) != 0)
          break;
        i += 8;
      }
      if (i == n) break;
      const unsigned char c = p[i];
      if (c == 0) return fail("a NUL byte");
      if (c < 0x80) {
        ++i;
        continue;
      }
      if (c >= 0xC2 && c <= 0xDF) {
        need_ = 1, lo_ = 0x80, hi_ = 0xBF;
      } else if (c >= 0xE0 && c <= 0xEF) {
        need_ = 2, lo_ = c == 0xE0 ? 0xA0 : 0x80, hi_ = c == 0xED ? 0x9F : 0xBF;
      } else if (c >= 0xF0 && c <= 0xF4) {
        need_ = 3, lo_ = c == 0xF0 ? 0x90 : 0x80, hi_ = c == 0xF4 ? 0x8F : 0xBF;
      } else {
        return fail("an invalid UTF-8 byte");
      }
      ++i;
      continue;
    }
    if (p[i] < lo_ || p[i] > hi_) return fail("an invalid UTF-8 sequence");
    lo_ = 0x80, hi_ = 0xBF;
    --need_;
    ++i;
  }
  line_ += static_cast<uint64_t>(std::count(piece.begin(), piece.end(), '\n'));
  return Status::Ok();
}

Status TextCheck::End(const std::string& name) const {
  if (need_ > 0) {
    return Status::DataErr(name + ":" + std::to_string(line_) + ": ends inside a UTF-8 sequence: not UTF-8 text");
  }
  return Status::Ok();
}

}  // namespace ob::data
