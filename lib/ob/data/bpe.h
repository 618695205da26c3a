// GPT-2's byte-level BPE tokenizer (Radford et al. 2019), written from its
// published description: text is cut into pre-tokens by GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// and each pre-token's UTF-8 bytes are merged pairwise, lowest merge rank
// first, into vocabulary ids. The vocabulary (vocab.json: {"token": id}) and
// the merges (merges.txt: "#version" line, then "a b" per line, in rank
// order) spell bytes in GPT-2's printable byte alphabet (byte b is code point
// b for '!'..'~', '¡'..'¬', '®'..'ÿ', and 256, 257, ... for the others, in
// byte order).
//
// Choices where implementations differ: \s is Unicode's White_Space (as
// HuggingFace's tokenizers; JavaScript's \s adds U+FEFF, Python's re adds
// U+001C..U+001F); \p{L}, \p{N} come from unicode_tables.inc (Unicode 14).
// Bytes that are not valid UTF-8 are pre-tokenized as "other" characters,
// one byte each, and encoded like any byte. "<|endoftext|>" in the text is
// ordinary text (Tokenizer::Id finds the special token's id).
//
// Torch-free, pure. Thread-safety: a loaded Bpe is read-only and shared;
// an Encoder belongs to one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ob/data/word_cache.h"
#include "ob/status.h"

namespace ob::data {

class Bpe {
 public:
  // Reads vocab.json and merges.txt. kNoInput for a file that cannot be
  // read; kDataErr naming the file (and line or byte) for malformed JSON,
  // a token outside the byte alphabet, a merge of unknown tokens or whose
  // result is not in the vocabulary, or a byte with no token of its own.
  static Result<Bpe> Load(const std::string& vocab_json, const std::string& merges_txt);
  // The same from the files' text; errors name them as `vocab_name` and
  // `merges_name`.
  static Result<Bpe> Parse(const std::string& vocab_text, const std::string& vocab_name,
                           const std::string& merges_text, const std::string& merges_name);
  // The same from tokens already read (a Hugging Face tokenizer.json's
  // "model"): `vocab` as (spelling, id), `merges` as (left, right) spellings
  // in rank order. Errors name `vocab_name` and merge i as merge_name(i).
  // A pair merged twice keeps its last rank, as GPT-2's encoder.py (a dict)
  // and HF's tokenizers (a hash map filled in order) do.
  static Result<Bpe> FromSpelled(const std::vector<std::pair<std::string, uint32_t>>& vocab,
                                 const std::vector<std::pair<std::string, std::string>>& merges,
                                 const std::string& vocab_name,
                                 const std::function<std::string(size_t)>& merge_name);

  // One past the largest id.
  uint32_t vocab_size() const { return vocab_size_; }
  // The id of a token given as bytes ("<|endoftext|>"), or -1.
  int64_t Id(const std::string& bytes) const;
  // The bytes of id (empty for an id the vocabulary does not have).
  const std::string& Bytes(uint32_t id) const;
  // The bytes of a token spelled in the byte alphabet; false if a character
  // is outside it.
  static bool SpellingToBytes(std::string_view spelled, std::string* out);

  // Appends the ids of one pre-token's bytes.
  void EncodeWord(std::string_view word, std::vector<uint32_t>* out) const;

 private:
  struct Merge {
    uint32_t rank;
    uint32_t result;
  };
  uint32_t vocab_size_ = 0;
  uint32_t byte_id_[256] = {};
  std::unordered_map<std::string, uint32_t> ids_;
  std::vector<std::string> bytes_;                // by id
  std::unordered_map<uint64_t, Merge> merges_;    // (left id << 32 | right id) → rank, result
};

// Cuts `text` into GPT-2 pre-tokens, calling emit(piece) for each one that
// the bytes after it cannot change, and returns how many bytes those cover
// (the caller keeps the rest and calls again with more). With at_end, the
// text is complete and every byte is covered.
template <typename Emit>
size_t PreTokenize(std::string_view text, bool at_end, Emit&& emit);

// Streams text to ids: Add() bytes as they come, End() at the end of a
// document (pre-tokens never span documents), take ids() as they fill.
// Words up to 64 bytes are cached (at most `cache_words` of them; the cache
// is emptied when full, so memory stays bounded on any input).
class Encoder {
 public:
  explicit Encoder(const Bpe& bpe, size_t cache_words = size_t{1} << 20);
  void Add(std::string_view bytes);
  void End();
  std::vector<uint32_t>& ids() { return ids_; }
  // Bytes held back, waiting for what follows them.
  size_t pending() const { return pending_.size(); }

 private:
  void Emit(std::string_view word);
  void Split(bool at_end);
  const Bpe& bpe_;
  std::string pending_;
  std::vector<uint32_t> ids_;
  WordCache cache_;
};

// --- implementation details of PreTokenize ----------------------------------
namespace internal {
enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };
// The class and byte length of the character at text[i]; length 0 when its
// UTF-8 sequence runs past the end (more bytes needed). Invalid bytes are
// kOther of length 1.
CharClass ClassAt(std::string_view text, size_t i, size_t* length);
// The pre-token that starts at text[i]: its end, or 0 when the bytes after
// text's end could change it (never with at_end).
size_t PreTokenEnd(std::string_view text, size_t i, bool at_end);
}  // namespace internal

template <typename Emit>
size_t PreTokenize(std::string_view text, bool at_end, Emit&& emit) {
  size_t i = 0;
  while (i < text.size()) {
    const size_t end = internal::PreTokenEnd(text, i, at_end);
    if (end == 0) break;
    emit(text.substr(i, end - i));
    i = end;
  }
  return i;
}

}  // namespace ob::data
