// The safetensors file format, written and read without LibTorch.
//
// Layout (https://github.com/huggingface/safetensors, "Format"): 8 bytes
// little-endian N, then N bytes of a JSON object
//   {"__metadata__":{"k":"v",...},
//    "name":{"dtype":"F32","shape":[2,3],"data_offsets":[begin,end]}, ...}
// then the data section; offsets are relative to its start. ob pads the JSON
// with trailing spaces so that the data section starts 8-byte aligned, and
// lays the tensors out contiguously in the order given.
//
// Writers go through a temporary file (io::CreateTemporary: `path` +
// ".tmp.PID.N") that is fsynced and renamed over `path`, so a reader never sees a half-written file; the
// checksum ("xxh3:<16 hex>" of the whole file) is computed while writing.
// Readers are strict: anything the format does not allow is kDataErr naming
// the file and the problem.
//
// Thread-safety: free functions with no shared state; distinct writers may run
// on distinct paths concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ob/status.h"

namespace ob::ckpt {

enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// The safetensors spelling: "F64", "F32", "F16", "BF16", "I64", ..., "BOOL".
const char* DTypeName(DType dtype);
// The inverse of DTypeName; kDataErr "unknown dtype 'X'".
Result<DType> ParseDType(const std::string& name);
// Bytes per element.
size_t DTypeSize(DType dtype);

// A tensor to write: contiguous, little-endian `bytes` bytes at `data`,
// which the caller owns and keeps alive for the call.
// REQUIRES: bytes == DTypeSize(dtype) × product(shape) (checked: kDataErr).
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t bytes = 0;
};

// Writes `tensors` (in that order) and `metadata` (the "__metadata__" object,
// omitted when empty) to `path` as described above. On success the file is
// durable under its name (the directory entry is the caller's to fsync) and
// *size_out / *checksum_out (either may be null) hold its size and checksum.
// kDataErr for bad input (a duplicate or reserved name, a byte count that does
// not match dtype × shape); kIoErr "PATH: write failed: No space left on
// device" and the like, with no temporary file left behind.
Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata, uint64_t* size_out,
                        std::string* checksum_out);

// One tensor of a file: where its bytes lie in the data section [begin, end).
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;       // by data offset
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;                    // file offset of the data section: 8 + N
  uint64_t file_size = 0;
};

// Reads and checks the header of `path`. kNoInput when it cannot be opened;
// kDataErr "PATH: ..." for a file too short, a header length beyond the file,
// JSON that is malformed or not of the format's shape, an unknown dtype,
// offsets that do not match dtype × shape, tensors that overlap, leave gaps or
// lie beyond the file, and duplicate names.
Result<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path);

// The same checks on a header already in memory (`json` is the N bytes after
// the length), for a file of `file_size` bytes; `name` prefixes messages.
Result<SafetensorsHeader> ParseSafetensorsHeader(const std::string& json, uint64_t file_size,
                                                 const std::string& name);

// Reads e.end - e.begin bytes of tensor `e` (an entry of `h`, the header of
// `path`) into `into`, which must have room for them. kNoInput when the file
// cannot be opened, kDataErr when it is shorter than `h` says, kIoErr on a
// read error.
Status ReadTensor(const std::string& path, const SafetensorsHeader& h, const SafetensorsEntry& e,
                  void* into);

// Streams a safetensors file whose tensors are known up front but whose data
// arrives in pieces (ob-ckpt export never holds a whole model in memory).
// Open writes the header; Append the data section in order; Finish checks
// that every byte came, fsyncs and renames. Destroying an unfinished writer
// removes its temporary file. `path` "-" writes standard output, and a
// device or pipe is written through (io::ResolveOutput): no rename then.
// Not thread-safe.
class SafetensorsWriter {
 public:
  // `tensors` gives names, dtypes and shapes; their begin/end are assigned
  // (contiguous, in order) and can be read back with tensors().
  static Result<std::unique_ptr<SafetensorsWriter>> Open(
      const std::string& path, std::vector<SafetensorsEntry> tensors,
      const std::map<std::string, std::string>& metadata);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  const std::vector<SafetensorsEntry>& tensors() const { return tensors_; }
  // The next `n` bytes of the data section; more than it holds is kDataErr.
  Status Append(const void* data, uint64_t n);
  // kDataErr when fewer bytes came than the tensors need.
  Status Finish(uint64_t* size_out, std::string* checksum_out);

 private:
  SafetensorsWriter() = default;
  Status Write(const void* data, uint64_t n);
  void Abandon();

  std::string path_, real_path_, tmp_;  // real_path_: path_ with its links followed
  int fd_ = -1;
  bool through_ = false;  // stdout, a device or a pipe: no temporary, fsync or rename
  bool own_fd_ = true;    // false for stdout
  std::vector<SafetensorsEntry> tensors_;
  uint64_t data_bytes_ = 0, appended_ = 0, written_ = 0;
  void* hash_ = nullptr;  // XXH3_state_t*, kept out of this header
};

// "xxh3:<16 hex>" of `n` bytes, the checksum the writers above compute.
std::string Checksum(const void* data, size_t n);

}  // namespace ob::ckpt
