// Megatron-LM's indexed dataset (ob-formats(5)), as its published
// description states it: PREFIX.bin holds the tokens of every sequence
// back to back, little-endian, of one dtype; PREFIX.idx says where each
// sequence is and which sequences make each document:
//
//   9 bytes  "MMIDIDX\0\0"
//   u64      version, 1
//   u8       dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
//            6 float64, 7 float32, 8 uint16
//   u64      S, the number of sequences
//   u64      D, the number of document indices (documents + 1)
//   i32[S]   each sequence's length in tokens
//   i64[S]   each sequence's byte offset in PREFIX.bin
//   i64[D]   document boundaries: document d is sequences
//            [doc[d], doc[d+1]); doc[0] = 0, doc[D-1] = S
//   (i8[S]   a multimodal dataset's sequence modes; ob neither reads nor
//            writes them)
//
// All integers little-endian. ob writes one sequence a document (what
// Megatron's preprocessing writes without sentence splitting), uint16
// where the vocabulary has fewer than 65,500 ids, as Megatron chooses,
// else int32. Torch-free.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ob/status.h"

namespace ob::data {

struct MegatronIndex {
  int dtype_code = 0;
  int token_bytes = 0;       // 2 (uint16) or 4 (int32): what ob trains on
  uint64_t sequences = 0;
  uint64_t documents = 0;
  uint64_t tokens = 0;       // Σ sequence lengths: the .bin holds this many
};

// PREFIX for a --data spec naming a Megatron dataset: the spec itself when
// SPEC.idx and SPEC.bin exist, or the spec without its ".bin" or ".idx"
// when the .idx beside it starts with Megatron's header; "" otherwise (a
// nanoGPT-style *.bin with no index is not one).
std::string MegatronPrefix(const std::string& spec);

// Reads and checks PREFIX.idx against PREFIX.bin (`bin_bytes`): the header,
// a dtype ob trains on (uint16, int32), sequences that tile the .bin in
// order with no gap, document boundaries that ascend from 0 to S. kDataErr
// naming the file and the first thing wrong; kNoInput when it cannot be
// read.
Result<MegatronIndex> ReadMegatronIndex(const std::string& prefix, uint64_t bin_bytes);

// Writes PREFIX.bin and PREFIX.idx, each to a temporary beside it renamed
// into place by Commit (the .bin first), so a failed or interrupted run
// leaves no pair that looks complete.
class MegatronWriter {
 public:
  // `vocab_size` picks the dtype (above). kIoErr naming a file that cannot
  // be created.
  static Result<std::unique_ptr<MegatronWriter>> Open(const std::string& prefix, uint32_t vocab_size);
  ~MegatronWriter();
  MegatronWriter(const MegatronWriter&) = delete;
  MegatronWriter& operator=(const MegatronWriter&) = delete;
  // Appends `ids` (cleared) to the document being written; each entry of
  // `ends` (ascending, <= ids.size()) ends a document after that many of
  // them. Documents of no tokens are left out.
  Status Write(std::vector<uint32_t>* ids, const std::vector<size_t>& ends);
  // Ends an open document, writes the index, renames both into place.
  Status Commit();
  uint64_t tokens() const { return tokens_; }
  uint64_t documents() const { return documents_; }

 private:
  MegatronWriter() = default;
  Status EndDocument();
  Status FlushBin(bool all);
  Status FlushSizes(bool all);
  std::string prefix_, bin_temp_, idx_temp_, sizes_temp_;
  std::string bin_target_, idx_target_;
  int bin_fd_ = -1, idx_fd_ = -1, sizes_fd_ = -1;
  int width_ = 2;
  bool committed_ = false;
  uint64_t tokens_ = 0, documents_ = 0, open_tokens_ = 0;
  std::string bin_buf_, sizes_buf_;
};

}  // namespace ob::data
