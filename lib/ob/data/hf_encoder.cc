// HfEncoder (hf_tokenizer.h): added tokens, NFC, the Split regex and BPE,
// streamed. Each stage passes on only what the bytes after it cannot
// change, so the ids are those of the document encoded whole.
#include <utf8proc.h>

#include <cstdlib>

#include "ob/data/hf_tokenizer.h"

namespace ob::data {
namespace {

// The length of the UTF-8 character at s[i] (1 to 4), 0 when the bytes there
// are not one (invalid, or cut by the end of s).
size_t Utf8Length(std::string_view s, size_t i, uint32_t* cp) {
  const auto c0 = static_cast<unsigned char>(s[i]);
  if (c0 < 0x80) {
    *cp = c0;
    return 1;
  }
  const size_t len = c0 >= 0xF0 && c0 <= 0xF4 ? 4 : c0 >= 0xE0 ? 3 : c0 >= 0xC2 && c0 <= 0xDF ? 2 : 0;
  if (len == 0 || i + len > s.size()) return 0;
  uint32_t v = c0 & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < len; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c & 0xC0) != 0x80) return 0;
    v = (v << 6) | (c & 0x3F);
  }
  if ((len == 3 && (v < 0x800 || (v >= 0xD800 && v <= 0xDFFF))) || (len == 4 && (v < 0x10000 || v > 0x10FFFF))) {
    return 0;
  }
  *cp = v;
  return len;
}

// Whether NFC cannot reach back over a cut just before `cp`: a starter
// (combining class 0) that takes part in no composition (as first or
// second: utf8proc's comb_index; Hangul jamo compose by rule instead) and
// has no decomposition. Every ASCII character qualifies as far as the text
// before it is concerned: none is the second of a composition.
bool NfcBoundaryBefore(uint32_t cp) {
  if (cp < 0x80) return true;
  if (cp >= 0x1100 && cp <= 0x11FF) return false;
  const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
  return p->combining_class == 0 && p->comb_index == UINT16_MAX && p->decomp_seqindex == UINT16_MAX;
}

// The last cut in s before which NFC is final (0: none yet).
size_t LastNfcBoundary(std::string_view s) {
  for (size_t q = s.size(); q-- > 0;) {
    const auto b = static_cast<unsigned char>(s[q]);
    if ((b & 0xC0) == 0x80) continue;  // inside a character
    uint32_t cp = 0;
    if (Utf8Length(s, q, &cp) > 0 && NfcBoundaryBefore(cp)) return q;
  }
  return 0;
}

// Appends NFC(s) to out. Runs of valid UTF-8 are normalized; bytes that are
// not UTF-8 are copied as they are. Text below U+0300 is already NFC (no
// composition's second character is below it): copied without a call.
void AppendNfc(std::string_view s, std::string* out) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    bool plain = true;
    uint32_t cp = 0;
    for (size_t len; j < s.size() && (len = Utf8Length(s, j, &cp)) > 0; j += len) plain = plain && cp < 0x300;
    if (plain) {
      out->append(s.data() + i, j - i);
    } else {
      utf8proc_uint8_t* nfc = nullptr;
      const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                              static_cast<utf8proc_ssize_t>(j - i), &nfc,
                                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
      if (n >= 0) {
        out->append(reinterpret_cast<const char*>(nfc), static_cast<size_t>(n));
      } else {  // out of memory: left as it is
        out->append(s.data() + i, j - i);
      }
      std::free(nfc);
    }
    if (j < s.size()) out->push_back(s[j++]);  // a byte that is not UTF-8
    i = j;
  }
}

}  // namespace

HfEncoder::HfEncoder(const HfTokenizer& tokenizer, bool split_special_tokens, size_t cache_words)
    : tok_(tokenizer), cache_(cache_words) {
  trie_.emplace_back();
  for (const HfTokenizer::AddedToken& a : tok_.added_) {
    if (a.special && split_special_tokens) continue;
    uint32_t node = 0;
    for (char ch : a.content) {
      const auto b = static_cast<unsigned char>(ch);
      uint32_t child = 0;
      for (const auto& [byte, to] : trie_[node].next) {
        if (byte == b) child = to;
      }
      if (child == 0) {
        child = static_cast<uint32_t>(trie_.size());
        trie_[node].next.emplace_back(b, child);
        trie_.emplace_back();
      }
      node = child;
    }
    trie_[node].id = a.id;
    starts_[static_cast<unsigned char>(a.content[0])] = true;
  }
  if (tok_.split_) matcher_ = std::make_unique<SplitRegex::Matcher>(*tok_.split_);
}

void HfEncoder::Add(std::string_view bytes) {
  if (!status_.ok()) return;
  raw_.append(bytes.data(), bytes.size());
  SplitAdded(false);
}

void HfEncoder::End() {
  if (!status_.ok()) return;
  SplitAdded(true);
}

// Stage 1: cut added tokens out of raw_, leftmost and then longest. A
// possible token that runs into the end of raw_ waits for more bytes.
void HfEncoder::SplitAdded(bool at_end) {
  const size_t n = raw_.size();
  size_t i = 0, segment = 0, stop = n;
  while (i < n) {
    if (!starts_[static_cast<unsigned char>(raw_[i])]) {
      ++i;
      continue;
    }
    uint32_t node = 0;
    size_t j = i, best_end = 0;
    int64_t best = -1;
    bool open = false;
    for (;;) {
      if (j == n) {
        open = !trie_[node].next.empty();
        break;
      }
      uint32_t child = 0;
      for (const auto& [byte, to] : trie_[node].next) {
        if (byte == static_cast<unsigned char>(raw_[j])) child = to;
      }
      if (child == 0) break;
      node = child;
      ++j;
      if (trie_[node].id >= 0) {
        best = trie_[node].id;
        best_end = j;
      }
    }
    if (open && !at_end) {
      stop = i;
      break;
    }
    if (best < 0) {
      ++i;
      continue;
    }
    Text(std::string_view(raw_).substr(segment, i - segment), true);
    ids_.push_back(static_cast<uint32_t>(best));
    i = segment = best_end;
  }
  if (!at_end && stop == n) {
    // Not into the middle of a character: its last bytes may be still to come.
    for (size_t back = 1; back <= 3 && back <= n - segment; ++back) {
      const auto b = static_cast<unsigned char>(raw_[n - back]);
      if ((b & 0xC0) == 0x80) continue;
      const size_t len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
      if (len > back) stop = n - back;
      break;
    }
  }
  Text(std::string_view(raw_).substr(segment, stop - segment), at_end);
  raw_.erase(0, stop);
}

// Stage 2: the normalizer, up to the last point it cannot reach back over.
void HfEncoder::Text(std::string_view piece, bool segment_end) {
  if (tok_.normalizer_ == HfTokenizer::Normalizer::kNone) {
    text_.append(piece.data(), piece.size());
  } else {
    unnormalized_.append(piece.data(), piece.size());
    const size_t cut = segment_end ? unnormalized_.size() : LastNfcBoundary(unnormalized_);
    if (cut > 0) {
      AppendNfc(std::string_view(unnormalized_).substr(0, cut), &text_);
      unnormalized_.erase(0, cut);
    }
  }
  PreTokenize(segment_end);
}

// Stage 3: the Split regex; a match is passed on once it is complete, a gap
// once the match after it is.
void HfEncoder::PreTokenize(bool segment_end) {
  if (!status_.ok()) return;
  if (!matcher_) {  // ByteLevel alone, with GPT-2's pattern
    const size_t used = data::PreTokenize(text_, segment_end, [this](std::string_view w) { Word(w); });
    text_.erase(0, used);
    return;
  }
  const bool isolated = tok_.behavior_ == HfTokenizer::Behavior::kIsolated;
  const std::string_view text(text_);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t start = 0, end = 0;
    const SplitRegex::Found found = matcher_->Next(text, pos, segment_end, &start, &end);
    if (found == SplitRegex::Found::kMatch) {
      if (start > pos) Piece(text.substr(pos, start - pos));
      if (isolated) Piece(text.substr(start, end - start));
      pos = end;
    } else if (found == SplitRegex::Found::kNone) {
      if (segment_end) {
        Piece(text.substr(pos));
        pos = text.size();
      }
      break;
    } else if (found == SplitRegex::Found::kMore) {
      break;
    } else {
      status_ = Status::DataErr("the pre-tokenizer's pattern gave up (a PCRE2 limit) on the text \"" +
                                std::string(text.substr(pos, 40)) + "...\"");
      break;
    }
  }
  text_.erase(0, pos);
}

void HfEncoder::Piece(std::string_view piece) {
  if (tok_.byte_level_regex_) {
    data::PreTokenize(piece, true, [this](std::string_view w) { Word(w); });
  } else {
    Word(piece);
  }
}

// Stage 4: BPE, through the cache.
void HfEncoder::Word(std::string_view word) {
  auto encode = [this](std::string_view w, std::vector<uint32_t>* out) {
    if (tok_.ignore_merges_) {
      key_.assign(w.data(), w.size());
      const int64_t whole = tok_.bpe_.Id(key_);
      if (whole >= 0) {
        out->push_back(static_cast<uint32_t>(whole));
        return;
      }
    }
    tok_.bpe_.EncodeWord(w, out);
  };
  if (cache_.Append(word, &ids_)) return;
  const size_t before = ids_.size();
  encode(word, &ids_);
  cache_.Insert(word, ids_.data() + before, ids_.size() - before);
}

}  // namespace ob::data
