#include "ob/data/json_reader.h"

#include <cmath>
#include <cstdlib>

#include "ob/io/json.h"

namespace ob::data {
namespace {
// Deeper nesting is refused rather than recursed into.
constexpr int kMaxDepth = 64;
}  // namespace

const JsonValue* JsonValue::Find(const std::string& key) const {
  for (const auto& [k, v] : members) {
    if (k == key) return &v;
  }
  return nullptr;
}

const char* JsonValue::KindName() const {
  switch (kind) {
    case Kind::kNull: return "null";
    case Kind::kBool: return "a boolean";
    case Kind::kNumber: return "a number";
    case Kind::kString: return "a string";
    case Kind::kArray: return "an array";
    case Kind::kObject: return "an object";
  }
  return "?";
}

bool JsonCursor::Fail(const std::string& what) {
  if (error_.empty()) error_ = what + " at byte " + std::to_string(at_);
  return false;
}

void JsonCursor::SkipSpace() {
  while (at_ < text_.size()) {
    const char c = text_[at_];
    if (c != ' ' && c != '\n' && c != '\r' && c != '\t') return;
    ++at_;
  }
}

char JsonCursor::Peek() {
  SkipSpace();
  return at_ < text_.size() ? text_[at_] : '\0';
}

bool JsonCursor::Expect(char c) {
  if (!ok()) return false;
  if (Peek() != c) return Fail(std::string("expected '") + c + "'");
  ++at_;
  return true;
}

bool JsonCursor::BeginObject() {
  if (!Expect('{')) return false;
  first_.push_back(true);
  return true;
}

bool JsonCursor::BeginArray() {
  if (!Expect('[')) return false;
  first_.push_back(true);
  return true;
}

bool JsonCursor::NextItem() {
  if (!ok() || first_.empty()) return false;
  const char c = Peek();
  if (c == ']') {
    ++at_;
    first_.pop_back();
    return false;
  }
  if (!first_.back()) {
    if (c != ',') return Fail("expected ',' or ']'");
    ++at_;
    if (Peek() == ']') return Fail("a trailing ','");
  }
  first_.back() = false;
  return true;
}

bool JsonCursor::NextMember(std::string* key) {
  if (!ok() || first_.empty()) return false;
  const char c = Peek();
  if (c == '}') {
    ++at_;
    first_.pop_back();
    return false;
  }
  if (!first_.back()) {
    if (c != ',') return Fail("expected ',' or '}'");
    ++at_;
  }
  first_.back() = false;
  if (Peek() != '"') return Fail("expected a member name");
  return String(key) && Expect(':');
}

bool JsonCursor::String(std::string* out) {
  if (!ok()) return false;
  if (Peek() != '"') return Fail("expected a string");
  out->clear();
  const std::string wrong = io::ReadJsonString(text_, &at_, out);
  return wrong.empty() || Fail(wrong);
}

bool JsonCursor::Literal(const char* word) {
  const std::string w(word);
  if (text_.compare(at_, w.size(), w) != 0) return Fail("not a JSON value");
  at_ += w.size();
  return true;
}

bool JsonCursor::Number(double* out) {
  // JSON's grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  const size_t start = at_;
  auto digits = [&] {
    const size_t from = at_;
    while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9') ++at_;
    return at_ > from;
  };
  if (at_ < text_.size() && text_[at_] == '-') ++at_;
  if (at_ < text_.size() && text_[at_] == '0') {
    ++at_;
  } else if (!digits()) {
    at_ = start;
    return Fail("not a JSON value");
  }
  if (at_ < text_.size() && text_[at_] == '.') {
    ++at_;
    if (!digits()) return Fail("a number with no digits after '.'");
  }
  if (at_ < text_.size() && (text_[at_] == 'e' || text_[at_] == 'E')) {
    ++at_;
    if (at_ < text_.size() && (text_[at_] == '+' || text_[at_] == '-')) ++at_;
    if (!digits()) return Fail("a number with no exponent digits");
  }
  *out = std::strtod(text_.substr(start, at_ - start).c_str(), nullptr);
  if (!std::isfinite(*out)) return Fail("a number out of range");
  return true;
}

bool JsonCursor::Uint(uint64_t* out) {
  if (!ok()) return false;
  SkipSpace();
  const size_t start = at_;
  uint64_t v = 0;
  while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9' && v < (uint64_t{1} << 59)) {
    v = v * 10 + static_cast<uint64_t>(text_[at_++] - '0');
  }
  const char next = at_ < text_.size() ? text_[at_] : '\0';
  if (at_ == start || (at_ - start > 1 && text_[start] == '0') || (next >= '0' && next <= '9') || next == '.' ||
      next == 'e' || next == 'E') {
    at_ = start;
    return Fail("expected a non-negative integer");
  }
  *out = v;
  return true;
}

bool JsonCursor::ValueAt(JsonValue* out, int depth) {
  if (!ok()) return false;
  if (depth > kMaxDepth) return Fail("nesting deeper than " + std::to_string(kMaxDepth));
  *out = JsonValue();
  switch (Peek()) {
    case '{': {
      out->kind = JsonValue::Kind::kObject;
      if (!BeginObject()) return false;
      std::string key;
      while (NextMember(&key)) {
        out->members.emplace_back(key, JsonValue());
        if (!ValueAt(&out->members.back().second, depth + 1)) return false;
      }
      return ok();
    }
    case '[': {
      out->kind = JsonValue::Kind::kArray;
      if (!BeginArray()) return false;
      while (NextItem()) {
        out->items.emplace_back();
        if (!ValueAt(&out->items.back(), depth + 1)) return false;
      }
      return ok();
    }
    case '"':
      out->kind = JsonValue::Kind::kString;
      return String(&out->text);
    case 't':
      out->kind = JsonValue::Kind::kBool;
      out->boolean = true;
      return Literal("true");
    case 'f':
      out->kind = JsonValue::Kind::kBool;
      return Literal("false");
    case 'n':
      return Literal("null");
    case '\0':
      return Fail("the text ends where a value should be");
    default:
      out->kind = JsonValue::Kind::kNumber;
      return Number(&out->number);
  }
}

bool JsonCursor::Value(JsonValue* out) { return ValueAt(out, static_cast<int>(first_.size())); }

bool JsonCursor::Skip() {
  JsonValue ignored;
  return Value(&ignored);
}

bool JsonCursor::End() {
  if (!ok()) return false;
  return Peek() == '\0' || Fail("text after the JSON value");
}

}  // namespace ob::data
