#include "ob/data/word_cache.h"

#include <xxhash.h>

#include <cstring>

namespace ob::data {

uint64_t WordCache::Hash(std::string_view word) { return XXH3_64bits(word.data(), word.size()); }

bool WordCache::Append(std::string_view word, std::vector<uint32_t>* out) const {
  if (slots_.empty() || word.size() > kLongest) return false;
  const uint64_t h = Hash(word);
  const size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const uint64_t s = slots_[i];
    if (s == 0) return false;
    if ((s >> 32) != (h >> 32)) continue;
    const uint32_t* e = arena_.data() + ((s & 0xFFFFFFFFu) - 1);
    const uint32_t len = e[0] & 0xFFFF, n = e[0] >> 16;
    if (len != word.size() || std::memcmp(e + 1, word.data(), len) != 0) continue;
    const uint32_t* ids = e + 1 + (len + 3) / 4;
    out->insert(out->end(), ids, ids + n);
    return true;
  }
}

void WordCache::Place(uint64_t hash, uint32_t entry) {
  const size_t mask = slots_.size() - 1;
  size_t i = hash & mask;
  while (slots_[i] != 0) i = (i + 1) & mask;
  slots_[i] = (hash >> 32 << 32) | (static_cast<uint64_t>(entry) + 1);
}

void WordCache::Grow() {
  std::vector<uint64_t> old = std::move(slots_);
  slots_.assign(old.empty() ? 4096 : 2 * old.size(), 0);
  for (uint64_t s : old) {
    if (s == 0) continue;
    const uint32_t entry = static_cast<uint32_t>((s & 0xFFFFFFFFu) - 1);
    const uint32_t* e = arena_.data() + entry;
    Place(Hash(std::string_view(reinterpret_cast<const char*>(e + 1), e[0] & 0xFFFF)), entry);
  }
}

void WordCache::Insert(std::string_view word, const uint32_t* ids, size_t n) {
  if (max_words_ == 0 || word.size() > kLongest || n > 0xFFFF) return;
  if (words_ >= max_words_) {  // start again: memory stays bounded
    words_ = 0;
    arena_.clear();
    slots_.assign(slots_.size(), 0);
  }
  if (2 * (words_ + 1) > slots_.size()) Grow();
  const uint32_t entry = static_cast<uint32_t>(arena_.size());
  const size_t key_words = (word.size() + 3) / 4;
  arena_.resize(arena_.size() + 1 + key_words + n, 0);
  uint32_t* e = arena_.data() + entry;
  e[0] = static_cast<uint32_t>(word.size()) | static_cast<uint32_t>(n) << 16;
  std::memcpy(e + 1, word.data(), word.size());
  std::memcpy(e + 1 + key_words, ids, n * sizeof(uint32_t));
  Place(Hash(word), entry);
  ++words_;
}

}  // namespace ob::data
