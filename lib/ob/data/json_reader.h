// A strict JSON reader for large files read once, such as a Hugging Face
// tokenizer.json (Llama 3's: 9 MB, 128,000 vocabulary entries and 280,000
// merges): a cursor the caller steers through the big arrays and objects,
// building nothing it does not ask for, and a small tree (JsonValue) for the
// parts that are small. RFC 8259: no comments, no trailing commas, strings
// of UTF-8 with their escapes decoded (io::ReadJsonString).
//
// Torch-free, pure. A cursor reads one text, which must outlive it; it is
// not shared between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ob::data {

// A JSON value as a tree. Numbers are kept as doubles (exact for integers
// up to 2^53).
struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string text;                                     // kString
  std::vector<JsonValue> items;                         // kArray
  std::vector<std::pair<std::string, JsonValue>> members;  // kObject, in order

  // The member named `key` of an object, or null (also for a non-object).
  const JsonValue* Find(const std::string& key) const;
  bool is_null() const { return kind == Kind::kNull; }
  // "null", "a boolean", "a number", "a string", "an array", "an object".
  const char* KindName() const;
};

// Steps through one JSON text. Each method returns false when the text is
// not what it expects; error() then says what and where ("expected ':' at
// byte 812"), and every later call returns false too. Objects and arrays
// are entered with Begin…() and their members or items walked with
// Next…(), which returns false at the closing bracket (ok() stays true).
class JsonCursor {
 public:
  explicit JsonCursor(const std::string& text) : text_(text) {}

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  // The first character of the next value ('{', '[', '"', 'n', ...), or
  // '\0' at the end of the text.
  char Peek();
  bool BeginObject();
  // Reads the next member's key and ':'; false at '}' or on an error.
  bool NextMember(std::string* key);
  bool BeginArray();
  // Moves to the next item; false at ']' or on an error.
  bool NextItem();

  bool String(std::string* out);
  // A non-negative integer without sign, fraction or exponent (up to
  // about 5.7e18; larger ones fail).
  bool Uint(uint64_t* out);
  bool Value(JsonValue* out);
  bool Skip();
  // Only white space is left.
  bool End();

 private:
  // Sets error() to `what` at the current byte (the first error stays) and
  // returns false.
  bool Fail(const std::string& what);
  void SkipSpace();
  bool Expect(char c);
  bool Literal(const char* word);
  bool Number(double* out);
  bool ValueAt(JsonValue* out, int depth);

  const std::string& text_;
  size_t at_ = 0;
  std::string error_;
  // Per open object or array: whether its first member or item is still to come.
  std::vector<bool> first_;
};

}  // namespace ob::data
