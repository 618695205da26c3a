// Status and Result<T>: errors as values at library boundaries.
//
// Every failure carries a code that maps one-to-one onto the exit status a
// tool returns (sysexits(3), design.md), and a one-line message that says what
// failed first and names the file or field. Broken invariants are assertions,
// not Status values. Thread-safety: values; no shared state.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace ob {

enum class Code : int {
  kOk = 0,
  kNo = 1,            // an expected "no" (e.g. verify found damage)
  kUsage = 64,        // EX_USAGE
  kDataErr = 65,      // EX_DATAERR: malformed input data
  kNoInput = 66,      // EX_NOINPUT: missing or unreadable input
  kUnavailable = 69,  // EX_UNAVAILABLE: a host or service is unavailable
  kSoftware = 70,     // EX_SOFTWARE: internal error
  kIoErr = 74,        // EX_IOERR
  kTempFail = 75,     // EX_TEMPFAIL: try again (e.g. more failures than planned for)
  kConfig = 78,       // EX_CONFIG: bad configuration
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  static Status Usage(std::string m) { return {Code::kUsage, std::move(m)}; }
  static Status DataErr(std::string m) { return {Code::kDataErr, std::move(m)}; }
  static Status NoInput(std::string m) { return {Code::kNoInput, std::move(m)}; }
  static Status Unavailable(std::string m) { return {Code::kUnavailable, std::move(m)}; }
  static Status Internal(std::string m) { return {Code::kSoftware, std::move(m)}; }
  static Status IoErr(std::string m) { return {Code::kIoErr, std::move(m)}; }
  static Status TempFail(std::string m) { return {Code::kTempFail, std::move(m)}; }
  static Status Config(std::string m) { return {Code::kConfig, std::move(m)}; }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  int exit_code() const { return static_cast<int>(code_); }
  const std::string& message() const { return message_; }

  // Prefixes the message with context: "profile.pb: " + "truncated ...".
  Status WithContext(const std::string& what) const {
    return ok() ? *this : Status(code_, what + ": " + message_);
  }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

// Either a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                 // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {           // NOLINT
    assert(!std::get<Status>(v_).ok() && "Result from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { assert(ok()); return std::get<T>(v_); }
  const T& value() const& { assert(ok()); return std::get<T>(v_); }
  T&& value() && { assert(ok()); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

// The first line of `text`: LibTorch and Gloo append backtraces to what(),
// and ob's messages are one line.
inline std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

// Returns early from a function returning Status or Result<T>.
#define OB_RETURN_IF_ERROR(expr)          \
  do {                                    \
    ::ob::Status ob_status_ = (expr);     \
    if (!ob_status_.ok()) return ob_status_; \
  } while (0)

#define OB_CONCAT_INNER(a, b) a##b
#define OB_CONCAT(a, b) OB_CONCAT_INNER(a, b)
// OB_ASSIGN_OR_RETURN(auto x, MakeX()); declares x from a Result or returns its Status.
#define OB_ASSIGN_OR_RETURN(decl, expr) \
  OB_ASSIGN_OR_RETURN_IMPL(OB_CONCAT(ob_result_, __LINE__), decl, expr)
#define OB_ASSIGN_OR_RETURN_IMPL(tmp, decl, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  decl = std::move(tmp).value()

}  // namespace ob
