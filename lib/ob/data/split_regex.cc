#include "ob/data/split_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace ob::data {
namespace {

// Unicode's White_Space property (PropList.txt), Oniguruma's \s.
constexpr const char* kWhiteSpaceClass =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

bool IsHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// Oniguruma's syntax → PCRE2's, as the header says; "" or what is refused.
std::string Translate(const std::string& p, std::string* out) {
  const size_t n = p.size();
  bool in_class = false;
  size_t class_body = 0;  // where the class's first member starts (a ']' there is literal)
  for (size_t i = 0; i < n;) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= n) return "a '\\' at the end";
      const char d = p[i + 1];
      switch (d) {
        case 's':
          *out += in_class ? std::string(kWhiteSpaceClass) : "[" + std::string(kWhiteSpaceClass) + "]";
          i += 2;
          continue;
        case 'S':
          if (in_class) return "\\S inside a character class";
          *out += "[^" + std::string(kWhiteSpaceClass) + "]";
          i += 2;
          continue;
        case 'w': case 'W': case 'b': case 'B': case 'h': case 'H': case 'G': case 'A': case 'z': case 'Z':
          return std::string("\\") + d + " (its meaning differs between Oniguruma and PCRE2, or it anchors)";
        case 'u':  // Oniguruma's \uHHHH
          if (i + 6 <= n && IsHex(p[i + 2]) && IsHex(p[i + 3]) && IsHex(p[i + 4]) && IsHex(p[i + 5])) {
            *out += "\\x{" + p.substr(i + 2, 4) + "}";
            i += 6;
            continue;
          }
          return "a \\u escape that is not \\uHHHH";
        case 'p': case 'P': case 'x':
          if (i + 2 < n && p[i + 2] == '{') {
            const size_t close = p.find('}', i + 3);
            if (close == std::string::npos) return std::string("an unterminated \\") + d + "{";
            out->append(p, i, close + 1 - i);
            i = close + 1;
            continue;
          }
          break;
        default:
          break;
      }
      // Any other escape: the backslash and the (ASCII) character it
      // escapes; a non-ASCII one is copied byte by byte below.
      out->push_back('\\');
      ++i;
      if (static_cast<unsigned char>(d) < 0x80) {
        out->push_back(d);
        ++i;
      }
      continue;
    }
    if (in_class) {
      if (c == ']' && i != class_body) {
        in_class = false;
      } else if (c == '[') {
        if (i + 1 < n && p[i + 1] == ':') {  // a POSIX class: copied whole
          const size_t close = p.find(":]", i + 2);
          if (close == std::string::npos) return "an unterminated [:class:]";
          out->append(p, i, close + 2 - i);
          i = close + 2;
          continue;
        }
        return "a nested character class";
      }
      out->push_back(c);
      ++i;
      continue;
    }
    switch (c) {
      case '[':
        in_class = true;
        out->push_back(c);
        ++i;
        if (i < n && p[i] == '^') out->push_back(p[i++]);
        class_body = i;
        continue;
      case '^': case '$':
        return std::string("the anchor ") + c;
      default:
        out->push_back(c);
        ++i;
    }
  }
  if (in_class) return "an unterminated character class";
  return "";
}

}  // namespace

Result<SplitRegex> SplitRegex::Compile(const std::string& pattern, bool literal) {
  SplitRegex re;
  if (literal) {
    re.translated_ = pattern;
  } else if (std::string wrong = Translate(pattern, &re.translated_); !wrong.empty()) {
    return Status::DataErr("the pattern has " + wrong + ", which ob-data does not support");
  }
  int code = 0;
  PCRE2_SIZE offset = 0;
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : 0);
  pcre2_code* compiled = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(re.translated_.data()), re.translated_.size(),
                                       options, &code, &offset, nullptr);
  if (compiled == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(code, message, sizeof message);
    return Status::DataErr("the pattern does not compile (PCRE2: " + std::string(reinterpret_cast<char*>(message)) +
                           " at offset " + std::to_string(offset) + " of " + re.translated_ + ")");
  }
  re.code_.reset(compiled, pcre2_code_free);
  uint32_t min_length = 0, lookbehind = 0;
  pcre2_pattern_info(compiled, PCRE2_INFO_MINLENGTH, &min_length);
  pcre2_pattern_info(compiled, PCRE2_INFO_MAXLOOKBEHIND, &lookbehind);
  if (min_length == 0) return Status::DataErr("the pattern can match the empty string, which ob-data does not support");
  if (lookbehind > 0) return Status::DataErr("the pattern looks behind, which ob-data does not support");
  re.jit_ = pcre2_jit_compile(compiled, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD) == 0;
  return re;
}

SplitRegex::Matcher::Matcher(const SplitRegex& re) : re_(re) {
  data_ = pcre2_match_data_create_from_pattern(re.code_.get(), nullptr);
  if (re.jit_) {
    // The published patterns need little stack; a deep one may grow to 16 MiB.
    stack_ = pcre2_jit_stack_create(32 << 10, 16 << 20, nullptr);
    context_ = pcre2_match_context_create(nullptr);
    pcre2_jit_stack_assign(context_, nullptr, stack_);
  }
}

SplitRegex::Matcher::~Matcher() {
  pcre2_match_data_free(data_);
  if (context_ != nullptr) pcre2_match_context_free(context_);
  if (stack_ != nullptr) pcre2_jit_stack_free(stack_);
}

SplitRegex::Found SplitRegex::Matcher::Next(std::string_view text, size_t from, bool at_end, size_t* start,
                                            size_t* end) {
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const uint32_t options = at_end ? 0 : PCRE2_PARTIAL_HARD;
  const int rc = re_.jit_ ? pcre2_jit_match(re_.code_.get(), subject, text.size(), from, options, data_, context_)
                          : pcre2_match(re_.code_.get(), subject, text.size(), from, options, data_, nullptr);
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data_);
  if (rc >= 0) {
    *start = ovector[0];
    *end = ovector[1];
    return Found::kMatch;
  }
  if (rc == PCRE2_ERROR_NOMATCH) return Found::kNone;
  if (rc == PCRE2_ERROR_PARTIAL) {
    *start = ovector[0];
    return Found::kMore;
  }
  // A resource limit (match limit, JIT stack): the text at `from` cannot be
  // cut here. Reported as a failure by the caller.
  *start = from;
  return Found::kError;
}

}  // namespace ob::data
