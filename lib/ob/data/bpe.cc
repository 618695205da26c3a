#include "ob/data/bpe.h"

#include <algorithm>
#include <queue>
#include <sstream>

#include "ob/io/file.h"
#include "ob/io/json.h"

namespace ob::data {
namespace {

struct CodeRange {
  uint32_t first, last;
};
#include "ob/data/unicode_tables.inc"

template <size_t N>
bool InRanges(const CodeRange (&ranges)[N], uint32_t cp) {
  const CodeRange* end = ranges + N;
  const CodeRange* r = std::upper_bound(ranges, end, cp, [](uint32_t c, const CodeRange& x) { return c < x.first; });
  return r != ranges && cp <= (r - 1)->last;
}

using internal::CharClass;

CharClass ClassOf(uint32_t cp) {
  if (InRanges(kLetters, cp)) return CharClass::kLetter;
  if (InRanges(kNumbers, cp)) return CharClass::kNumber;
  if (InRanges(kWhiteSpace, cp)) return CharClass::kSpace;
  return CharClass::kOther;
}

// ASCII's classes, looked up without a search.
struct AsciiClasses {
  CharClass c[128];
  AsciiClasses() {
    for (uint32_t i = 0; i < 128; ++i) c[i] = ClassOf(i);
  }
};
const AsciiClasses kAscii;

// GPT-2's byte alphabet: byte → code point, and back (-1: none).
struct ByteAlphabet {
  uint32_t code[256];
  int byte_of[512];
  ByteAlphabet() {
    std::fill(std::begin(byte_of), std::end(byte_of), -1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      code[b] = printable ? b : next++;
      byte_of[code[b]] = static_cast<int>(b);
    }
  }
};
const ByteAlphabet kAlphabet;

// A token as spelled in vocab.json / merges.txt → its bytes; false if a
// character is outside the alphabet or the UTF-8 is broken.
bool AlphabetToBytes(std::string_view spelled, std::string* out) {
  out->clear();
  size_t i = 0;
  while (i < spelled.size()) {
    size_t len = 0;
    const auto c0 = static_cast<unsigned char>(spelled[i]);
    uint32_t cp;
    if (c0 < 0x80) {
      cp = c0;
      len = 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < spelled.size()) {
      cp = ((c0 & 0x1Fu) << 6) | (static_cast<unsigned char>(spelled[i + 1]) & 0x3Fu);
      len = 2;
    } else {
      return false;  // the alphabet ends below U+0800: two bytes at most
    }
    if (cp >= 512 || kAlphabet.byte_of[cp] < 0) return false;
    out->push_back(static_cast<char>(kAlphabet.byte_of[cp]));
    i += len;
  }
  return !out->empty();
}

// {"token": id, ...}: the one shape vocab.json takes.
Status ParseVocab(const std::string& path, const std::string& text,
                  std::vector<std::pair<std::string, uint32_t>>* out) {
  size_t i = 0;
  auto ws = [&] {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\n' || text[i] == '\r' || text[i] == '\t')) ++i;
  };
  auto fail = [&](const std::string& what) {
    return Status::DataErr(path + ": not a vocabulary (" + what + " at byte " + std::to_string(i) +
                           "); expected {\"token\": id, ...}");
  };
  ws();
  if (i >= text.size() || text[i++] != '{') return fail("no '{'");
  ws();
  if (i < text.size() && text[i] == '}') return fail("empty");
  for (;;) {
    ws();
    std::string key;
    if (std::string wrong = io::ReadJsonString(text, &i, &key); !wrong.empty()) return fail(wrong);
    ws();
    if (i >= text.size() || text[i++] != ':') return fail("no ':'");
    ws();
    uint64_t v = 0;
    const size_t start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9' && v <= UINT32_MAX) v = v * 10 + (text[i++] - '0');
    if (i == start || v >= (uint64_t{1} << 31)) return fail("an id that is not an integer below 2^31");
    out->emplace_back(std::move(key), static_cast<uint32_t>(v));
    ws();
    if (i < text.size() && text[i] == ',') {
      ++i;
      continue;
    }
    if (i < text.size() && text[i] == '}') {
      ++i;
      ws();
      if (i != text.size()) return fail("text after the object");
      return Status::Ok();
    }
    return fail("no ',' or '}'");
  }
}

}  // namespace

namespace internal {

CharClass ClassAt(std::string_view t, size_t i, size_t* length) {
  const auto c0 = static_cast<unsigned char>(t[i]);
  if (c0 < 0x80) {
    *length = 1;
    return kAscii.c[c0];
  }
  size_t len = c0 >= 0xF0 && c0 <= 0xF4 ? 4 : c0 >= 0xE0 ? 3 : c0 >= 0xC2 && c0 <= 0xDF ? 2 : 0;
  if (len == 0) {  // a continuation byte or an impossible lead byte
    *length = 1;
    return CharClass::kOther;
  }
  if (i + len > t.size()) {  // cut at the end: wait for more, unless what is there is already wrong
    for (size_t k = i + 1; k < t.size(); ++k) {
      if ((static_cast<unsigned char>(t[k]) & 0xC0) != 0x80) {
        *length = 1;
        return CharClass::kOther;
      }
    }
    *length = 0;
    return CharClass::kOther;
  }
  uint32_t cp = c0 & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < len; ++k) {
    const auto c = static_cast<unsigned char>(t[i + k]);
    if ((c & 0xC0) != 0x80) {
      *length = 1;
      return CharClass::kOther;
    }
    cp = (cp << 6) | (c & 0x3F);
  }
  // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8.
  if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
    *length = 1;
    return CharClass::kOther;
  }
  *length = len;
  return ClassOf(cp);
}

size_t PreTokenEnd(std::string_view t, size_t i, bool at_end) {
  const size_t n = t.size();
  size_t len = 0;
  // 's 't 're 've 'm 'll 'd
  if (t[i] == '\'') {
    if (!at_end && i + 3 > n) return 0;
    if (i + 1 < n) {
      const char a = t[i + 1];
      if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
      if (i + 2 < n) {
        const char b = t[i + 2];
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
      }
    }
  }
  // A run of one class: its end, or 0 when it reaches the end of the text.
  auto run = [&](size_t j, CharClass cls) -> size_t {
    for (;;) {
      if (j >= n) return at_end ? n : 0;
      const CharClass c = ClassAt(t, j, &len);
      if (len == 0) return at_end ? n : 0;
      if (c != cls) return j;
      j += len;
    }
  };
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+'
  const size_t j = t[i] == ' ' ? i + 1 : i;
  if (j >= n && !at_end) return 0;
  if (j < n) {
    const CharClass c = ClassAt(t, j, &len);
    if (len == 0 && !at_end) return 0;
    if (len == 0) return n;  // a cut sequence at the very end: its bytes, as "other"
    if (c != CharClass::kSpace) return run(j + len, c);
  }
  // '\s+(?!\S)', '\s+': t[i] is white space.
  size_t k = i, last = i;
  for (;;) {
    if (k >= n) return at_end ? n : 0;
    const CharClass c = ClassAt(t, k, &len);
    if (len == 0) return at_end ? n : 0;
    if (c != CharClass::kSpace) break;
    last = k;
    k += len;
  }
  // Followed by a non-space: all but the last space character, which goes
  // with what follows; a single one stands alone.
  return last > i ? last : k;
}

}  // namespace internal

Result<Bpe> Bpe::Load(const std::string& vocab_json, const std::string& merges_txt) {
  OB_ASSIGN_OR_RETURN(std::string vtext, io::ReadFile(vocab_json));
  OB_ASSIGN_OR_RETURN(std::string mtext, io::ReadFile(merges_txt));
  return Parse(vtext, vocab_json, mtext, merges_txt);
}

Result<Bpe> Bpe::Parse(const std::string& vtext, const std::string& vocab_json, const std::string& mtext,
                       const std::string& merges_txt) {
  std::vector<std::pair<std::string, uint32_t>> entries;
  OB_RETURN_IF_ERROR(ParseVocab(vocab_json, vtext, &entries));
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<size_t> line_of;  // merge → its line in merges.txt
  std::istringstream lines(mtext);
  std::string line;
  size_t number = 0;
  while (std::getline(lines, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (number == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      return Status::DataErr(merges_txt + ":" + std::to_string(number) +
                             ": expected two tokens separated by one space");
    }
    merges.emplace_back(line.substr(0, space), line.substr(space + 1));
    line_of.push_back(number);
  }
  return FromSpelled(entries, merges, vocab_json,
                     [&](size_t i) { return merges_txt + ":" + std::to_string(line_of[i]); });
}

Result<Bpe> Bpe::FromSpelled(const std::vector<std::pair<std::string, uint32_t>>& entries,
                             const std::vector<std::pair<std::string, std::string>>& merges,
                             const std::string& vocab_name, const std::function<std::string(size_t)>& merge_name) {
  Bpe bpe;
  std::string bytes;
  bpe.ids_.reserve(entries.size());
  for (const auto& [spelled, id] : entries) {
    if (!AlphabetToBytes(spelled, &bytes)) {
      return Status::DataErr(vocab_name + ": token " + std::to_string(id) + " is not spelled in GPT-2's byte alphabet");
    }
    if (id >= (uint32_t{1} << 31)) {
      return Status::DataErr(vocab_name + ": token id " + std::to_string(id) + " is not below 2^31");
    }
    if (!bpe.ids_.emplace(bytes, id).second) {
      return Status::DataErr(vocab_name + ": token " + std::to_string(id) + " is given twice");
    }
    bpe.vocab_size_ = std::max(bpe.vocab_size_, id + 1);
  }
  bpe.bytes_.assign(bpe.vocab_size_, std::string());
  for (const auto& [b, id] : bpe.ids_) {
    if (!bpe.bytes_[id].empty()) return Status::DataErr(vocab_name + ": id " + std::to_string(id) + " is given twice");
    bpe.bytes_[id] = b;
  }
  for (int b = 0; b < 256; ++b) {
    const int64_t id = bpe.Id(std::string(1, static_cast<char>(b)));
    if (id < 0) return Status::DataErr(vocab_name + ": byte " + std::to_string(b) + " has no token of its own");
    bpe.byte_id_[b] = static_cast<uint32_t>(id);
  }
  std::string left, right, both;
  bpe.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    if (!AlphabetToBytes(merges[rank].first, &left) || !AlphabetToBytes(merges[rank].second, &right)) {
      return Status::DataErr(merge_name(rank) + ": a token not spelled in GPT-2's byte alphabet");
    }
    both.assign(left).append(right);
    const int64_t a = bpe.Id(left), b = bpe.Id(right), m = bpe.Id(both);
    if (a < 0 || b < 0 || m < 0) {
      return Status::DataErr(merge_name(rank) + ": merges " + (a < 0 || b < 0 ? "a token" : "into a token") +
                             " that " + vocab_name + " does not have");
    }
    bpe.merges_[(static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b)] =
        Merge{static_cast<uint32_t>(rank), static_cast<uint32_t>(m)};
  }
  return bpe;
}

bool Bpe::SpellingToBytes(std::string_view spelled, std::string* out) { return AlphabetToBytes(spelled, out); }

int64_t Bpe::Id(const std::string& bytes) const {
  auto it = ids_.find(bytes);
  return it == ids_.end() ? -1 : static_cast<int64_t>(it->second);
}

const std::string& Bpe::Bytes(uint32_t id) const {
  static const std::string kNone;
  return id < bytes_.size() ? bytes_[id] : kNone;
}

void Bpe::EncodeWord(std::string_view word, std::vector<uint32_t>* out) const {
  const size_t n = word.size();
  if (n == 0) return;
  if (n == 1) {
    out->push_back(byte_id_[static_cast<unsigned char>(word[0])]);
    return;
  }
  // Symbols in a linked list; candidate merges in a heap, lowest rank and
  // then leftmost first (the order of merging every occurrence of the best
  // pair left to right, pair after pair). Entries made stale by a merge
  // next to them are skipped when they come up.
  std::vector<uint32_t> id(n);
  std::vector<int> prev(n), next(n);
  for (size_t i = 0; i < n; ++i) {
    id[i] = byte_id_[static_cast<unsigned char>(word[i])];
    prev[i] = static_cast<int>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int>(i + 1) : -1;
  }
  struct Candidate {
    uint32_t rank;
    int left;
    uint32_t left_id, right_id, result;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto offer = [&](int left) {
    const int right = next[left];
    if (right < 0) return;
    auto it = merges_.find((static_cast<uint64_t>(id[left]) << 32) | id[right]);
    if (it != merges_.end()) heap.push({it->second.rank, left, id[left], id[right], it->second.result});
  };
  for (size_t i = 0; i + 1 < n; ++i) offer(static_cast<int>(i));
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int right = next[c.left];
    if (id[c.left] != c.left_id || right < 0 || id[right] != c.right_id || prev[c.left] == -2) continue;
    id[c.left] = c.result;
    next[c.left] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.left;
    prev[right] = -2;  // gone
    id[right] = UINT32_MAX;
    if (prev[c.left] >= 0) offer(prev[c.left]);
    offer(c.left);
  }
  for (int i = 0; i >= 0; i = next[i]) out->push_back(id[i]);
}

Encoder::Encoder(const Bpe& bpe, size_t cache_words) : bpe_(bpe), cache_(cache_words) {}

void Encoder::Emit(std::string_view word) {
  if (cache_.Append(word, &ids_)) return;
  const size_t before = ids_.size();
  bpe_.EncodeWord(word, &ids_);
  cache_.Insert(word, ids_.data() + before, ids_.size() - before);
}

void Encoder::Split(bool at_end) {
  const size_t used = PreTokenize(pending_, at_end, [this](std::string_view w) { Emit(w); });
  pending_.erase(0, used);
}

void Encoder::Add(std::string_view bytes) {
  pending_.append(bytes.data(), bytes.size());
  Split(false);
}

void Encoder::End() { Split(true); }

}  // namespace ob::data
