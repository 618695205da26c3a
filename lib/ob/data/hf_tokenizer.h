// Hugging Face's byte-level BPE as its `tokenizers` library runs it, from a
// tokenizer.json (Llama 3's, Qwen2's and Qwen3's, GPT-2's), written from
// the library's documented behaviour. Text goes through, in order:
//
//   1. added tokens: the added_tokens' contents are cut out of the text
//      first, leftmost and then longest match, and become their ids (with
//      split_special_tokens, as HF's encode_special_tokens, those marked
//      "special" are left in the text as ordinary characters);
//   2. the normalizer: none, or NFC (utf8proc), on each piece between them;
//   3. the pre-tokenizer: a "Split" regex (split_regex.h) whose matches, and
//      the gaps between them ("Isolated"), or only the gaps ("Removed"), are
//      the pre-tokens, then "ByteLevel" (with use_regex, GPT-2's pattern of
//      bpe.h inside each piece); or "ByteLevel" alone with use_regex;
//   4. the model: BPE over each pre-token's bytes (bpe.h); with
//      ignore_merges a pre-token that is itself in the vocabulary is its id.
//
// What a tokenizer.json may hold beyond that is refused, one line naming the
// file and the field: another model, normalizer or pre-tokenizer;
// byte_fallback, dropout, a subword prefix or suffix; an added token with
// single_word, lstrip or rstrip, or a "normalized" one under a normalizer; a
// post-processor other than ByteLevel, TemplateProcessing (tokens before $A
// only) or a Sequence of those.
//
// Choices where implementations differ: bytes that are not UTF-8 are kept
// (not replaced by U+FFFD): they match no regex, are left out of NFC, and
// are encoded as bytes, so decode gives every byte back. NFC follows
// utf8proc's Unicode version, the regex PCRE2's.
//
// Torch-free. A loaded HfTokenizer is read-only and shared; an HfEncoder
// belongs to one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ob/data/bpe.h"
#include "ob/data/split_regex.h"
#include "ob/status.h"

namespace ob::data {

class HfTokenizer {
 public:
  // Reads tokenizer.json and the tokenizer_config.json beside it, if there
  // is one (bos_token, eos_token, add_bos_token). kNoInput for a file that
  // cannot be read; kDataErr naming the file and field for one that is
  // malformed or asks for what is not supported.
  static Result<HfTokenizer> Load(const std::string& tokenizer_json);
  // The same from the files' text; `config_text` may be empty (no config).
  static Result<HfTokenizer> Parse(const std::string& text, const std::string& name, const std::string& config_text,
                                   const std::string& config_name);

  // One past the largest id, added tokens included.
  uint32_t vocab_size() const { return vocab_size_; }
  // The id of an added token by its content, else of a vocabulary token by
  // its bytes; -1 if neither.
  int64_t Id(const std::string& content) const;
  // What decoding id gives: an added token's content, a vocabulary token's
  // bytes; empty for an id that has neither.
  const std::string& Bytes(uint32_t id) const;

  // The ids HF's encode(text) puts before each text (add_special_tokens):
  // the post-processor template's, or with add_bos_token the config's
  // bos_token. Empty when it adds none.
  const std::vector<uint32_t>& prefix() const { return prefix_; }
  // tokenizer_config.json's bos_token and eos_token, -1 where it names none.
  int64_t bos_id() const { return bos_id_; }
  int64_t eos_id() const { return eos_id_; }

 private:
  friend class HfEncoder;
  struct AddedToken {
    std::string content;
    uint32_t id;
    bool special;
  };
  enum class Normalizer { kNone, kNfc };
  enum class Behavior { kIsolated, kRemoved };

  Bpe bpe_;
  bool ignore_merges_ = false;
  Normalizer normalizer_ = Normalizer::kNone;
  std::shared_ptr<const SplitRegex> split_;  // null: no Split
  Behavior behavior_ = Behavior::kIsolated;
  bool byte_level_regex_ = false;            // ByteLevel's use_regex
  std::vector<AddedToken> added_;
  std::unordered_map<uint32_t, std::string> added_content_;  // id → content
  std::unordered_map<std::string, uint32_t> added_id_;       // content → id
  uint32_t vocab_size_ = 0;
  std::vector<uint32_t> prefix_;
  int64_t bos_id_ = -1, eos_id_ = -1;
};

// Streams text to ids through an HfTokenizer: Add() bytes as they come,
// End() at the end of a document (HF's encode of the document whole gives
// the same ids; nothing spans documents), take ids() as they fill. It holds
// back only what the bytes after it could change: the start of a possible
// added token, text up to the last point where NFC cannot reach back, and
// the pre-token the regex is still inside (PCRE2's hard partial match);
// so memory is bounded by the longest pre-token, not by the document.
// Pre-tokens of up to 64 bytes are cached as Encoder's (bpe.h).
class HfEncoder {
 public:
  // With split_special_tokens, special added tokens are ordinary text.
  explicit HfEncoder(const HfTokenizer& tokenizer, bool split_special_tokens = false,
                     size_t cache_words = size_t{1} << 20);
  void Add(std::string_view bytes);
  void End();
  std::vector<uint32_t>& ids() { return ids_; }
  // Bytes held back, waiting for what follows them.
  size_t pending() const { return raw_.size() + unnormalized_.size() + text_.size(); }
  // kDataErr when PCRE2 gave up on the text (a resource limit); nothing
  // after that point was encoded.
  const Status& status() const { return status_; }

 private:
  struct TrieNode {
    std::vector<std::pair<unsigned char, uint32_t>> next;  // byte → node
    int64_t id = -1;                                       // an added token ends here
  };
  void SplitAdded(bool at_end);
  void Text(std::string_view piece, bool segment_end);
  void PreTokenize(bool segment_end);
  void Piece(std::string_view piece);
  void Word(std::string_view word);

  const HfTokenizer& tok_;
  std::vector<TrieNode> trie_;  // added tokens; node 0 is the root
  bool starts_[256] = {};       // bytes an added token starts with
  std::unique_ptr<SplitRegex::Matcher> matcher_;
  std::string raw_;           // not yet searched for added tokens
  std::string unnormalized_;  // waiting for a point NFC cannot reach back over
  std::string text_;          // normalized, waiting for the regex
  std::string key_;
  std::vector<uint32_t> ids_;
  WordCache cache_;
  Status status_;
};

}  // namespace ob::data
