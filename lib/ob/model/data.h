// TokenSource: the training data, a read-only sequence of token ids sampled
// deterministically (design/data.md). Torch-free.
//
// Formats:
//   kU16       flat little-endian uint16 ids (nanoGPT's train.bin), or llm.c's
//              .bin: a 256 x int32 header (magic 20240520, version 1 = uint16,
//              version 2 = uint32, token count) followed by the ids.
//   kU32       flat little-endian uint32 ids.
//   kText      any file, read as bytes (vocabulary 256).
//   kSynthetic no file: token p is a hash of (seed, p) in [0, vocab).
//   kAuto      a Megatron-LM indexed dataset (PREFIX.bin + PREFIX.idx,
//              data/megatron.h: its uint16 or int32 tokens, by the index's
//              dtype; the documents are back to back, as Megatron's
//              GPTDataset concatenates them, windows may span them),
//              else kU16 for ".bin", kU32 for ".u32", kText otherwise.
//
// Sampling: sample i of global step k starts at an offset chosen by a 64-bit
// mix of (seed, k, i) alone, so the same sample is drawn whatever the number
// of pipelines, micro-batch split or restarts.
//
// Blends: "W1:PATH1,W2:PATH2,..." (ParseBlend) samples from several files in
// the proportions of the weights (normalized; Megatron's --data-path W1 P1
// W2 P2). Which file sample (k, i) comes from is a function of (seed, k, i)
// alone too: the fractional part of γ(seed) + a1·i + a2·k, with (a1, a2) the
// R2 low-discrepancy sequence's constants, falls in the file's share of
// [0, 1). So every layout, recovery and resume draws the same files, and
// the shares over a run are the weights to within a few samples (not to
// within the noise of independent draws); the window within the file is
// then drawn as above.
//
// Ownership: the file is mmapped read-only; copies of a TokenSource share the
// mapping, which is released with the last copy. Thread-safety: const methods
// may be called concurrently. Failure: Open returns kNoInput for a missing or
// unreadable file and kDataErr (naming the file) for an empty, truncated or
// malformed one.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ob/model/scan_cache.h"
#include "ob/status.h"

namespace ob::model {

enum class TokenFormat { kAuto, kU16, kU32, kText, kSynthetic };

// "auto", "u16", "u32", "text", "synthetic".
const char* TokenFormatName(TokenFormat f);
// Parses the names above; kUsage on anything else.
Result<TokenFormat> ParseTokenFormat(const std::string& name);
// What kAuto reads a file as, by its name: kU16 for "*.bin", kU32 for
// "*.u32", kText otherwise (ob-data writes by the same rule).
TokenFormat TokenFormatForPath(const std::string& path);

// The file a --data spec reads tokens from: PREFIX.bin for a Megatron-LM
// indexed dataset (data/megatron.h: the spec is PREFIX, PREFIX.bin or
// PREFIX.idx, with Megatron's header in PREFIX.idx), else the spec itself.
std::string DataFile(const std::string& spec);

// What identifies a data spec across runs: "synthetic", or "bytes=N
// xxh3=<16 hex>" over the file's size and its first and last MiB (cheap on
// a multi-GB file; catches another file, a regenerated one, a truncation).
// "" when `spec` cannot be read here (it may exist only on the hosts).
std::string DataFingerprint(const std::string& spec);

// One file of a blend and its weight.
struct BlendPart {
  double weight = 0;
  std::string path;
};
// The parts of a blended --data spec ("0.3:a.bin,0.7:b.bin"): empty when
// `spec` is one file (or "synthetic", or names an existing file whatever
// its name). kUsage naming the spec for a blend that is malformed: a part
// without "W:", a weight that is not a finite number > 0, an empty path, a
// path given twice, fewer than two parts.
Result<std::vector<BlendPart>> ParseBlend(const std::string& spec);
// The files a --data spec reads: DataFile(spec), or each part's of a blend.
std::vector<std::string> DataFiles(const std::string& spec);

// "xxh3=<16 hex>" over every byte of the file at `path`, read in chunks
// (io::HashFile): what TokenSource::content_sum gives for it. Adds the
// bytes read to *done as it goes (may be null); stops early, kUnavailable,
// once *stop is true. kNoInput when it cannot be opened, kIoErr on a read
// error, kDataErr when it is not a regular file or changes size meanwhile.
// A file `cache` has read before, unchanged since, is not read again
// (scan_cache.h); one read whole is remembered there.
Result<std::string> FileContentSum(const std::string& path, const std::atomic<bool>* stop = nullptr,
                                   std::atomic<uint64_t>* done = nullptr,
                                   const ScanCache* cache = &ScanCache::Default());

// "DEV:INODE:BYTES:MTIME_NS:CTIME_NS" of the file at `path`: another value
// after any write, rename over it or change of its metadata (ctime cannot
// be set back). "" when it cannot be stat'ed.
std::string FileIdentity(const std::string& path);

// What opening a token file learned that costs a pass over the whole file
// to learn again: its largest token id (seconds for a file of GBs). The
// ob-launch master opens the data once and hands these facts to every
// worker it starts, so that a restarted worker's start-up does not grow
// with the data set: a worker whose file has the same size and
// modification time takes the facts instead of scanning.
struct TokenFileFacts {
  uint64_t bytes = 0;
  int64_t mtime_ns = 0;
  int max_token = -1;
  std::string Encode() const;  // "BYTES:MTIME_NS:MAX_TOKEN"
  // kUsage naming the text when it is not what Encode writes.
  static Result<TokenFileFacts> Decode(const std::string& text);
};

class TokenSource {
 public:
  // Maps `path`. kUsage for format kSynthetic (use Synthetic below). With
  // `known` facts of a file of the same size and modification time, the
  // largest id is taken from them rather than scanned for.
  // Without `known` facts, the largest id and the content sum come from
  // `cache` when it read this very file before (scan_cache.h), and a pass
  // over the file is remembered there.
  static Result<TokenSource> Open(const std::string& path,
                                  TokenFormat format = TokenFormat::kAuto,
                                  const TokenFileFacts* known = nullptr,
                                  const ScanCache* cache = &ScanCache::Default());
  // A blend of `parts` (each opened: not blends themselves) with `weights`
  // (> 0, as many), named `spec`.
  static TokenSource Blended(std::vector<TokenSource> parts, const std::vector<double>& weights,
                             const std::string& spec);
  // A file-less source of `size` pseudo-random tokens in [0, vocab_size).
  // REQUIRES: vocab_size > 0, size >= 2.
  static TokenSource Synthetic(int vocab_size, uint64_t seed,
                               size_t size = size_t{1} << 30);

  // Checks that windows of seq_len + 1 tokens fit and that every id is below
  // vocab_size: kDataErr naming the file otherwise.
  Status Check(int seq_len, int vocab_size) const;

  // Whether the file mapped is still as it was opened (its size and
  // modification time, through the descriptor kept open): kDataErr naming
  // it and both when it was rewritten in place, since the mapping then
  // reads the new bytes. A file replaced by a rename is another file and
  // leaves the one mapped as it was: Ok. Ok for synthetic data.
  Status Unchanged() const;
  // The file's identity (FileIdentity) when its ctime moved since it was
  // opened or since the last call, "" otherwise (and for synthetic data):
  // with Unchanged's size and time the same, a change of metadata only (a
  // chmod, a link, a rename of the file or over it) or a rewrite that set
  // its time back (`touch -r`), which only its bytes tell apart. Thread-
  // safe; copies (Window) share what it last saw.
  std::string Touched() const;
  // A path that reads the very file mapped, even renamed or unlinked since
  // (/proc/self/fd/N); `path()` for synthetic data.
  std::string ReadPath() const;

  // Writes x = tokens[off, off+seq_len) and y = tokens[off+1, off+seq_len+1),
  // off = a hash of (seed, step, sample_index). REQUIRES: seq_len + 1 <= size().
  void Sample(uint64_t seed, uint64_t step, uint64_t sample_index, int seq_len,
              int64_t* x, int64_t* y) const;

  // The window start Sample uses (exposed for tests and data-position logs);
  // in a blend, within the part Part() chose.
  size_t Offset(uint64_t seed, uint64_t step, uint64_t sample_index, int seq_len) const;
  // A blend: how many files, which one sample (step, sample_index) comes
  // from, and the files. 1 and 0 for a source that is not a blend.
  int parts() const;
  int Part(uint64_t seed, uint64_t step, uint64_t sample_index) const;
  const TokenSource& part(int i) const;
  double weight(int i) const;  // part i's weight, as given

  // Token at position p. REQUIRES: p < size(); not a blend.
  int64_t at(size_t p) const;

  // The tokens [first, first + count) as a source of their own (sharing the
  // mapping): a held-out evaluation part and the training part of one
  // file never overlap. REQUIRES: first + count <= size(); not a blend.
  TokenSource Window(size_t first, size_t count) const;

  size_t size() const { return size_; }
  // Largest id present (computed once at open); vocab_size - 1 for synthetic.
  int max_token() const { return max_token_; }
  TokenFormat format() const { return format_; }
  // The file, or "synthetic".
  const std::string& path() const { return path_; }
  // For Open's `known` (bytes 0 for synthetic data).
  TokenFileFacts facts() const { return {file_bytes_, mtime_ns_, max_token_}; }
  // "xxh3=<16 hex>" over every byte of the file, from the pass that finds
  // the largest id (which reads them all anyway): what tells one file from
  // another of the same size that differs anywhere (DataFingerprint reads
  // only its ends). "" when that pass was skipped (`known` facts) and for
  // synthetic data.
  const std::string& content_sum() const { return content_sum_; }

 private:
  struct Mapping;
  struct Blend;
  TokenSource() = default;
  std::shared_ptr<const Blend> blend_;  // a blend's parts; null otherwise

  std::shared_ptr<const Mapping> map_;
  const unsigned char* tokens_ = nullptr;  // first token, inside map_
  size_t size_ = 0;                         // number of tokens
  int max_token_ = 0;
  std::string content_sum_;
  uint64_t file_bytes_ = 0;
  int64_t mtime_ns_ = 0;
  TokenFormat format_ = TokenFormat::kText;
  std::string path_;
  uint64_t synthetic_seed_ = 0;
  int synthetic_vocab_ = 0;
  size_t synthetic_base_ = 0;  // position of token 0 in the synthetic stream
};

// Holds out the last `fraction` (0 < fraction < 1) of `all`'s tokens (of
// each file's, in a blend: the parts blended again) for evaluation: *train the tokens before, *eval those after, disjoint by
// construction. kDataErr naming the file when either part is shorter than
// one window of seq_len + 1 tokens; kUsage for a fraction outside (0, 1).
Status SplitForEval(const TokenSource& all, double fraction, int seq_len, TokenSource* train,
                    TokenSource* eval);

// A strong 64-bit mix of up to three values (splitmix64 chained); used for
// data offsets and per-layer initialisation seeds.
uint64_t Mix64(uint64_t a, uint64_t b = 0, uint64_t c = 0);

}  // namespace ob::model
