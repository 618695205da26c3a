// The regular expression of a Hugging Face "Split" pre-tokenizer, run by
// PCRE2 (UTF-8, Unicode properties, JIT where the library has it) with
// Oniguruma's meaning where the two engines differ, and a matcher that
// streams: it says when the bytes after the text could still change a match.
//
// HF's tokenizers compile these patterns with Oniguruma. PCRE2 (with
// PCRE2_UCP) agrees on \p{..}, (?i:...), look-ahead and the quantifiers
// the published patterns use; it differs on \s, which Oniguruma takes to be
// Unicode's White_Space and PCRE2 widens by U+180E: \s and \S are rewritten
// into White_Space's explicit list. Constructs whose meaning differs and
// that no published byte-level pattern uses are refused: \w \W \b \B \h \H
// \G, the anchors ^ and $, nested classes, \S inside a class, look-behind
// (the matcher restarts at a pre-token's end and cannot see before it),
// and a pattern that can match the empty string.
//
// Torch-free. A compiled SplitRegex is read-only and shared between threads;
// a SplitRegex::Matcher belongs to one thread.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "ob/status.h"

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_jit_stack_8;
struct pcre2_real_match_context_8;

namespace ob::data {

class SplitRegex {
 public:
  // `pattern` is a {"Regex": ...} pattern in Oniguruma's syntax, or with
  // `literal` a {"String": ...} one matched as it is. kDataErr saying what
  // is wrong (the caller names the file and field).
  static Result<SplitRegex> Compile(const std::string& pattern, bool literal);

  enum class Found {
    kMatch,  // [*start, *end) is a match, final whatever follows the text
    kNone,   // no match starts at or after `from`, whatever follows
    kMore,   // a match may start at *start, but its end depends on bytes not yet given
    kError,  // PCRE2 gave up (a match or JIT stack limit)
  };

  // Per-thread state (PCRE2's match data and JIT stack).
  class Matcher {
   public:
    explicit Matcher(const SplitRegex& re);
    ~Matcher();
    Matcher(const Matcher&) = delete;
    Matcher& operator=(const Matcher&) = delete;
    // The first match in text at or after `from`. With at_end the text is
    // complete (kMore never comes back). Bytes that are not UTF-8 match
    // nothing.
    Found Next(std::string_view text, size_t from, bool at_end, size_t* start, size_t* end);

   private:
    const SplitRegex& re_;
    pcre2_real_match_data_8* data_ = nullptr;
    pcre2_real_jit_stack_8* stack_ = nullptr;
    pcre2_real_match_context_8* context_ = nullptr;
  };

  // The pattern as PCRE2 runs it (after the rewriting above).
  const std::string& translated() const { return translated_; }
  bool jit() const { return jit_; }

 private:
  std::shared_ptr<pcre2_real_code_8> code_;
  std::string translated_;
  bool jit_ = false;
};

}  // namespace ob::data
