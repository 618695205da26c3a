// What ob-data tokenize reads (ob-data(1), ob-formats(5)): an input's
// bytes, decompressed, and what they are. Torch-free.
//
// Kinds, by name: a trailing ".gz" (gzip, through zlib; concatenated
// members too) or ".zst" (Zstandard, through libzstd; any number of
// frames) says the file is compressed; what the name says under it,
// ".jsonl", ".json" or ".ndjson", says JSON Lines (one document a line,
// jsonl.h), anything else text (the whole input one document).
//
// Never garbage in silence: the first bytes of every input are checked
// against what its name says. Compressed data (gzip, zstd, xz, bzip2, zip)
// under a name without its suffix, or a ".gz"/".zst" name over other
// bytes, is refused (kDataErr naming the file and what it holds), as is a
// text input holding a NUL byte or bytes that are not UTF-8 (TextCheck).
// Truncated or corrupt compressed data is kDataErr naming the file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "ob/status.h"

namespace ob::data {

enum class Compression { kNone, kGzip, kZstd };

struct InputKind {
  Compression compression = Compression::kNone;
  bool json_lines = false;
};
// From the name alone ("-", stdin, is uncompressed text).
InputKind KindOf(const std::string& path);

// The decompressed bytes of one input ("-": stdin), in pieces.
class ByteReader {
 public:
  // kNoInput when it cannot be opened; kDataErr when its first bytes are
  // not what its name says (above). Standard input ("-") is plain text, or
  // plain JSON Lines with `stdin_json_lines`.
  static Result<std::unique_ptr<ByteReader>> Open(const std::string& path, bool stdin_json_lines = false);
  virtual ~ByteReader();
  // Up to `n` bytes into `buf`; 0 at the end. kDataErr naming the file for
  // corrupt or truncated compressed data, kNoInput on a read error.
  virtual Result<size_t> Read(char* buf, size_t n) = 0;
  // Bytes of the file itself consumed so far (compressed, where it is).
  uint64_t raw_bytes() const { return raw_bytes_; }
  const InputKind& kind() const { return kind_; }
  const std::string& name() const { return name_; }  // as messages name it

 protected:
  ByteReader() = default;
  // The next bytes of the file itself.
  Result<size_t> ReadRaw(char* buf, size_t n);
  std::string name_;
  InputKind kind_;
  int fd_ = -1;
  bool own_fd_ = false;
  uint64_t raw_bytes_ = 0;
  std::string head_;      // what Open read to check the format, not yet returned
  size_t head_used_ = 0;
};

// UTF-8 validation of a stream in pieces, counting lines for messages.
class TextCheck {
 public:
  // kDataErr "NAME:LINE: ..." at a NUL byte or the first byte that is not
  // UTF-8 (a sequence may straddle two pieces).
  Status Add(std::string_view piece, const std::string& name);
  // kDataErr when the stream ends inside a sequence.
  Status End(const std::string& name) const;

 private:
  uint64_t line_ = 1;
  int need_ = 0;        // continuation bytes still expected
  uint32_t lo_ = 0x80;  // the range the next continuation byte must fall in
  uint32_t hi_ = 0xBF;
};

}  // namespace ob::data
