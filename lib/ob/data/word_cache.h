// The ids of words the encoders have seen (bpe.h's Encoder, hf_tokenizer.h's
// HfEncoder): most of a corpus is a few hundred thousand words, and a
// cached word is a hash probe instead of BPE merges. Flat: words and ids
// live in one array, the table holds a tag of each word's hash and where
// its entry is, so a hit costs about two memory accesses (a node-based map
// cost four, and was 40% of tokenizing's time). Bounded: past `max_words`
// it starts again, empty, so memory stays bounded on any input. Only words
// of up to kLongest bytes are cached. Not thread-safe: one an encoder.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace ob::data {

class WordCache {
 public:
  static constexpr size_t kLongest = 64;
  explicit WordCache(size_t max_words) : max_words_(max_words) {}
  // Appends the cached ids of `word` to *out: false when it is not cached.
  bool Append(std::string_view word, std::vector<uint32_t>* out) const;
  // Caches ids[0, n) for `word` (not cached yet; at most kLongest bytes and
  // 65,535 ids). A no-op when max_words is 0.
  void Insert(std::string_view word, const uint32_t* ids, size_t n);
  size_t size() const { return words_; }

 private:
  static uint64_t Hash(std::string_view word);
  void Place(uint64_t hash, uint32_t entry);
  void Grow();
  size_t max_words_;
  size_t words_ = 0;
  std::vector<uint64_t> slots_;  // 0: empty; else hash's high 32 bits << 32 | (entry + 1)
  // Entries: a word (length | ids << 16), its bytes in whole words, its ids.
  std::vector<uint32_t> arena_;
};

}  // namespace ob::data
