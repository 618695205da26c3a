#include "ob/ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <set>

#include "ob/io/file.h"
#include "ob/io/json.h"
#include "ob/io/text.h"

namespace ob::ckpt {
namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kF64, "F64", 8}, {DType::kF32, "F32", 4}, {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2}, {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2}, {DType::kI8, "I8", 1}, {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1}};

// The reference implementation refuses larger headers; so does ob, before
// allocating what a hostile length asks for.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// The data section starts at a multiple of this (the JSON is space-padded).
constexpr uint64_t kDataAlign = 8;
// Largest single write(2)/pread(2); Linux moves at most ~2 GiB per call.
constexpr size_t kMaxIo = size_t{1} << 30;

using io::Errno;
using io::Quote;

std::string ShapeText(DType dtype, const std::vector<int64_t>& shape) {
  std::string out = std::string(DTypeName(dtype)) + "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// dtype × shape in bytes; false for a negative dimension or overflow.
bool TensorBytes(DType dtype, const std::vector<int64_t>& shape, uint64_t* out) {
  uint64_t n = DTypeSize(dtype);
  for (int64_t d : shape) {
    if (d < 0) return false;
    const auto u = static_cast<uint64_t>(d);
    if (u != 0 && n > UINT64_MAX / u) return false;
    n *= u;
  }
  *out = n;
  return true;
}

// Index of the first byte that breaks UTF-8, or npos.
size_t InvalidUtf8At(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (len == 0 || i + len > s.size()) return i;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3f);
    }
    const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += len;
  }
  return std::string::npos;
}


std::string BuildHeader(const std::vector<SafetensorsEntry>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::string j = "{";
  if (!metadata.empty()) {
    j += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) j += ',';
      first = false;
      io::AppendJsonString(&j, k);
      j += ':';
      io::AppendJsonString(&j, v);
    }
    j += '}';
  }
  for (const auto& t : tensors) {
    if (j.size() > 1) j += ',';
    io::AppendJsonString(&j, t.name);
    j += ":{\"dtype\":\"";
    j += DTypeName(t.dtype);
    j += "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) j += (i ? "," : "") + std::to_string(t.shape[i]);
    j += "],\"data_offsets\":[" + std::to_string(t.begin) + "," + std::to_string(t.end) + "]}";
  }
  j += '}';
  j.append((kDataAlign - (8 + j.size()) % kDataAlign) % kDataAlign, ' ');
  return j;
}

std::string HashText(XXH64_hash_t h) { return io::HashText("xxh3:", h); }

// Reads up to n bytes at `offset`; returns how many (short only at end of
// file), or -1 with errno set.
int64_t PreadAll(int fd, void* into, uint64_t n, uint64_t offset) {
  uint64_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, static_cast<char*>(into) + got, std::min<uint64_t>(n - got, kMaxIo),
                      static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    got += static_cast<uint64_t>(r);
  }
  return static_cast<int64_t>(got);
}

// A strict reader of the one JSON shape a safetensors header may take.
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& name) : s_(text), name_(name) {}

  Status Parse(SafetensorsHeader* h) {
    if (size_t bad = InvalidUtf8At(s_); bad != std::string::npos)
      return Status::DataErr(name_ + ": header is not valid UTF-8 (byte " +
                             std::to_string(8 + bad) + ")");
    SkipWs();
    if (!Eat('{')) return Fail("expected '{' to open the header object");
    std::set<std::string> names;
    bool have_metadata = false;
    OB_RETURN_IF_ERROR(Members("", [&](const std::string& key) -> Status {
      if (key == "__metadata__") {
        if (have_metadata) return Status::DataErr(name_ + ": __metadata__ given twice");
        have_metadata = true;
        return Metadata(&h->metadata);
      }
      if (!names.insert(key).second)
        return Status::DataErr(name_ + ": duplicate tensor name " + Quote(key));
      SafetensorsEntry e;
      e.name = key;
      OB_RETURN_IF_ERROR(Tensor(&e));
      h->tensors.push_back(std::move(e));
      return Status::Ok();
    }));
    SkipWs();
    if (i_ != s_.size()) return Fail("unexpected text after the header object");
    return Status::Ok();
  }

 private:
  Status Fail(const std::string& what) const {
    if (i_ >= s_.size())
      return Status::DataErr(name_ + ": malformed header JSON: " + what + ", found the end");
    return Status::DataErr(name_ + ": malformed header JSON at byte " + std::to_string(8 + i_) +
                           ": " + what);
  }
  void SkipWs() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r'))
      ++i_;
  }
  bool Eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }

  Status String(std::string* out) {
    const std::string wrong = io::ReadJsonString(s_, &i_, out);
    return wrong.empty() ? Status::Ok() : Fail(wrong);
  }

  // A JSON number that is a non-negative integer fitting in int64.
  Status Count(const std::string& what, uint64_t* out) {
    const size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') return Fail(what + " must not be negative");
    uint64_t v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      const uint64_t d = static_cast<uint64_t>(s_[i_] - '0');
      if (v > (static_cast<uint64_t>(INT64_MAX) - d) / 10) return Fail(what + " is too large");
      v = v * 10 + d;
      ++i_;
    }
    if (i_ == start) return Fail("expected an integer for " + what);
    if (s_[start] == '0' && i_ - start > 1) {
      i_ = start;
      return Fail("leading zero in " + what);
    }
    if (i_ < s_.size() && (s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E'))
      return Fail(what + " must be an integer");
    *out = v;
    return Status::Ok();
  }

  // [n, n, ...] of non-negative integers.
  Status Counts(const std::string& what, std::vector<uint64_t>* out) {
    if (!Eat('[')) return Fail("expected '[' for " + what);
    SkipWs();
    if (Eat(']')) return Status::Ok();
    for (;;) {
      uint64_t v;
      SkipWs();
      OB_RETURN_IF_ERROR(Count(what, &v));
      out->push_back(v);
      SkipWs();
      if (Eat(',')) continue;
      if (Eat(']')) return Status::Ok();
      return Fail("expected ',' or ']' in " + what);
    }
  }

  // The members of an object whose '{' was just read: `member` parses each
  // value, after "key": and whitespace. `in` names the object in the error
  // for a missing ',' or '}' ("" for the header object itself).
  Status Members(const std::string& in, const std::function<Status(const std::string& key)>& member) {
    SkipWs();
    if (Eat('}')) return Status::Ok();
    for (;;) {
      std::string key;
      SkipWs();
      OB_RETURN_IF_ERROR(String(&key));
      SkipWs();
      if (!Eat(':')) return Fail("expected ':' after " + Quote(key));
      SkipWs();
      OB_RETURN_IF_ERROR(member(key));
      SkipWs();
      if (Eat(',')) continue;
      if (Eat('}')) return Status::Ok();
      return Fail(in.empty() ? std::string("expected ',' or '}'") : "expected ',' or '}' in " + in);
    }
  }

  Status Metadata(std::map<std::string, std::string>* out) {
    if (!Eat('{')) return Fail("__metadata__ must be an object of strings");
    return Members("__metadata__", [&](const std::string& k) -> Status {
      if (i_ >= s_.size() || s_[i_] != '"')
        return Fail("__metadata__ value of " + Quote(k) + " is not a string");
      std::string v;
      OB_RETURN_IF_ERROR(String(&v));
      if (!out->emplace(k, v).second)
        return Status::DataErr(name_ + ": duplicate __metadata__ key " + Quote(k));
      return Status::Ok();
    });
  }

  Status Tensor(SafetensorsEntry* e) {
    const std::string who = "tensor " + Quote(e->name);
    if (!Eat('{')) return Fail(who + " must be an object");
    bool have_dtype = false, have_shape = false, have_offsets = false;
    OB_RETURN_IF_ERROR(Members(who, [&](const std::string& key) -> Status {
      if (key == "dtype") {
        if (have_dtype) return Status::DataErr(name_ + ": " + who + ": dtype given twice");
        have_dtype = true;
        std::string d;
        OB_RETURN_IF_ERROR(String(&d));
        auto dt = ParseDType(d);
        if (!dt.ok()) return Status::DataErr(name_ + ": " + who + ": " + dt.status().message());
        e->dtype = *dt;
      } else if (key == "shape") {
        if (have_shape) return Status::DataErr(name_ + ": " + who + ": shape given twice");
        have_shape = true;
        std::vector<uint64_t> dims;
        OB_RETURN_IF_ERROR(Counts(who + " shape", &dims));
        e->shape.assign(dims.begin(), dims.end());
      } else if (key == "data_offsets") {
        if (have_offsets) return Status::DataErr(name_ + ": " + who + ": data_offsets given twice");
        have_offsets = true;
        std::vector<uint64_t> off;
        OB_RETURN_IF_ERROR(Counts(who + " data_offsets", &off));
        if (off.size() != 2)
          return Status::DataErr(name_ + ": " + who + ": data_offsets must be [begin, end]");
        e->begin = off[0];
        e->end = off[1];
      } else {
        return Status::DataErr(name_ + ": " + who + ": unknown field " + Quote(key));
      }
      return Status::Ok();
    }));
    const char* missing = !have_dtype ? "dtype" : !have_shape ? "shape" : !have_offsets ? "data_offsets" : nullptr;
    if (missing) return Status::DataErr(name_ + ": " + who + ": no " + missing);
    return Status::Ok();
  }

  const std::string& s_;
  const std::string& name_;
  size_t i_ = 0;
};

}  // namespace

const char* DTypeName(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.name;
  assert(false && "every DType is in kDTypes");
  return "?";
}

Result<DType> ParseDType(const std::string& name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.dtype;
  return Status::DataErr("unknown dtype " + Quote(name));
}

size_t DTypeSize(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.size;
  assert(false && "every DType is in kDTypes");
  return 0;
}

std::string Checksum(const void* data, size_t n) { return HashText(XXH3_64bits(data, n)); }

// --- writing ----------------------------------------------------------------

Result<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Open(
    const std::string& path, std::vector<SafetensorsEntry> tensors,
    const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  uint64_t offset = 0;
  for (auto& t : tensors) {
    if (t.name == "__metadata__")
      return Status::DataErr(path + ": tensor name __metadata__ is reserved");
    if (!names.insert(t.name).second)
      return Status::DataErr(path + ": duplicate tensor name " + Quote(t.name));
    if (InvalidUtf8At(t.name) != std::string::npos)
      return Status::DataErr(path + ": tensor name " + Quote(t.name) + " is not valid UTF-8");
    uint64_t n = 0;
    if (!TensorBytes(t.dtype, t.shape, &n) || offset + n < offset)
      return Status::DataErr(path + ": tensor " + Quote(t.name) + ": bad shape " +
                             ShapeText(t.dtype, t.shape));
    t.begin = offset;
    t.end = offset += n;
  }
  for (const auto& [k, v] : metadata)
    if (InvalidUtf8At(k) != std::string::npos || InvalidUtf8At(v) != std::string::npos)
      return Status::DataErr(path + ": metadata " + Quote(k) + " is not valid UTF-8");

  const std::string header = BuildHeader(tensors, metadata);
  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter());
  w->path_ = path;
  w->tensors_ = std::move(tensors);
  w->data_bytes_ = offset;
  auto* state = XXH3_createState();
  assert(state && "xxh3 state allocation");
  XXH3_64bits_reset(state);
  w->hash_ = state;
  if (path == "-") {
    w->fd_ = STDOUT_FILENO;
    w->through_ = true;
    w->own_fd_ = false;
  } else {
    OB_ASSIGN_OR_RETURN(io::OutputTarget out, io::ResolveOutput(path));
    if (!out.replace) {  // a device or pipe: written through, never renamed over
      OB_ASSIGN_OR_RETURN(w->fd_, io::OpenWriteThrough(out.path));
      w->through_ = true;
    } else {
      w->real_path_ = out.path;
      OB_ASSIGN_OR_RETURN(w->fd_, io::CreateTemporary(out.path, path, &w->tmp_));
    }
  }
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(header.size() >> (8 * i));
  OB_RETURN_IF_ERROR(w->Write(len, sizeof len));
  OB_RETURN_IF_ERROR(w->Write(header.data(), header.size()));
  return w;
}

SafetensorsWriter::~SafetensorsWriter() {
  Abandon();
  XXH3_freeState(static_cast<XXH3_state_t*>(hash_));
}

void SafetensorsWriter::Abandon() {
  if (fd_ >= 0 && own_fd_) close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) {
    unlink(tmp_.c_str());
    io::ForgetTemporary(tmp_);
  }
  tmp_.clear();
}

Status SafetensorsWriter::Write(const void* data, uint64_t n) {
  if (fd_ < 0) return Status::IoErr(path_ + ": write after a failed write");
  XXH3_64bits_update(static_cast<XXH3_state_t*>(hash_), data, n);
  uint64_t off = 0;
  while (off < n) {
    ssize_t w = write(fd_, static_cast<const char*>(data) + off, std::min<uint64_t>(n - off, kMaxIo));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      std::string err = Errno();
      Abandon();  // no .tmp is left behind, even if the caller keeps the writer
      return Status::IoErr(path_ + ": write failed: " + err);
    }
    off += static_cast<uint64_t>(w);
  }
  written_ += n;
  return Status::Ok();
}

Status SafetensorsWriter::Append(const void* data, uint64_t n) {
  if (n > data_bytes_ - appended_)
    return Status::DataErr(path_ + ": more data than the tensors hold (" +
                           std::to_string(data_bytes_) + " bytes)");
  OB_RETURN_IF_ERROR(Write(data, n));
  appended_ += n;
  return Status::Ok();
}

Status SafetensorsWriter::Finish(uint64_t* size_out, std::string* checksum_out) {
  if (fd_ < 0) return Status::IoErr(path_ + ": finish after a failed write");
  if (appended_ != data_bytes_) {
    Abandon();
    return Status::DataErr(path_ + ": only " + std::to_string(appended_) + " of " +
                           std::to_string(data_bytes_) + " data bytes were given");
  }
  if (!through_) {
    Status s;
    if (fsync(fd_) != 0) s = Status::IoErr(path_ + ": fsync failed: " + Errno());
    if (close(fd_) != 0 && s.ok()) s = Status::IoErr(path_ + ": close failed: " + Errno());
    fd_ = -1;
    if (s.ok() && rename(tmp_.c_str(), real_path_.c_str()) != 0)
      s = Status::IoErr(path_ + ": rename failed: " + Errno());
    if (!s.ok()) {
      Abandon();
      return s;
    }
    io::ForgetTemporary(tmp_);
    tmp_.clear();
  } else if (own_fd_ && close(fd_) != 0) {
    const std::string err = Errno();
    fd_ = -1;
    return Status::IoErr(path_ + ": close failed: " + err);
  }
  fd_ = -1;
  if (size_out) *size_out = written_;
  if (checksum_out) *checksum_out = HashText(XXH3_64bits_digest(static_cast<XXH3_state_t*>(hash_)));
  return Status::Ok();
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata, uint64_t* size_out,
                        std::string* checksum_out) {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(tensors.size());
  for (const auto& t : tensors) {
    uint64_t need = 0;
    if (!TensorBytes(t.dtype, t.shape, &need))
      return Status::DataErr(path + ": tensor " + Quote(t.name) + ": bad shape " +
                             ShapeText(t.dtype, t.shape));
    if (t.bytes != need)
      return Status::DataErr(path + ": tensor " + Quote(t.name) + " has " +
                             std::to_string(t.bytes) + " bytes, " + ShapeText(t.dtype, t.shape) +
                             " needs " + std::to_string(need));
    if (t.bytes > 0 && t.data == nullptr)
      return Status::DataErr(path + ": tensor " + Quote(t.name) + " has no data");
    entries.push_back({t.name, t.dtype, t.shape, 0, 0});
  }
  OB_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::Open(path, std::move(entries), metadata));
  for (const auto& t : tensors) OB_RETURN_IF_ERROR(writer->Append(t.data, t.bytes));
  return writer->Finish(size_out, checksum_out);
}

// --- reading ----------------------------------------------------------------

Result<SafetensorsHeader> ParseSafetensorsHeader(const std::string& json, uint64_t file_size,
                                                 const std::string& name) {
  SafetensorsHeader h;
  h.file_size = file_size;
  h.data_offset = 8 + json.size();
  OB_RETURN_IF_ERROR(HeaderParser(json, name).Parse(&h));
  assert(h.data_offset <= file_size && "the caller checked the header length");
  const uint64_t data_size = file_size - h.data_offset;
  for (const auto& e : h.tensors) {
    const std::string who = name + ": tensor " + Quote(e.name) + ": data_offsets [" +
                            std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
    if (e.end < e.begin) return Status::DataErr(who + " end before they begin");
    uint64_t need = 0;
    if (!TensorBytes(e.dtype, e.shape, &need))
      return Status::DataErr(who + ": shape " + ShapeText(e.dtype, e.shape) + " is too large");
    if (e.end - e.begin != need)
      return Status::DataErr(who + " hold " + std::to_string(e.end - e.begin) + " bytes, " +
                             ShapeText(e.dtype, e.shape) + " needs " + std::to_string(need));
    if (e.end > data_size)
      return Status::DataErr(who + " lie beyond the end of the file (the data section holds " +
                             std::to_string(data_size) + " bytes)");
  }
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const auto& e : h.tensors) {
    if (e.begin < at)
      return Status::DataErr(name + ": tensors " + Quote(prev->name) + " and " + Quote(e.name) +
                             " overlap");
    if (e.begin > at)
      return Status::DataErr(name + ": " + std::to_string(e.begin - at) + " unused bytes before tensor " +
                             Quote(e.name));
    at = e.end;
    prev = &e;
  }
  if (at != data_size)
    return Status::DataErr(name + ": " + std::to_string(data_size - at) +
                           " bytes after the last tensor");
  return h;
}

Result<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::NoInput(path + ": cannot open: " + Errno());
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  struct stat st;
  if (fstat(fd, &st) != 0) return Status::IoErr(path + ": stat failed: " + Errno());
  if (S_ISDIR(st.st_mode)) return Status::NoInput(path + ": is a directory");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < 8)
    return Status::DataErr(path + ": too short for a safetensors file (" + std::to_string(size) +
                           " bytes)");
  unsigned char len[8];
  if (PreadAll(fd, len, 8, 0) != 8) return Status::IoErr(path + ": read failed: " + Errno());
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len[i]) << (8 * i);
  if (n > size - 8)
    return Status::DataErr(path + ": header length " + std::to_string(n) +
                           " is beyond the end of the file (" + std::to_string(size) + " bytes)");
  if (n > kMaxHeaderBytes)
    return Status::DataErr(path + ": header length " + std::to_string(n) + " exceeds the limit of " +
                           std::to_string(kMaxHeaderBytes) + " bytes");
  std::string json(n, '\0');
  int64_t got = PreadAll(fd, json.data(), n, 8);
  if (got < 0) return Status::IoErr(path + ": read failed: " + Errno());
  if (static_cast<uint64_t>(got) != n)
    return Status::DataErr(path + ": truncated while reading the header");
  return ParseSafetensorsHeader(json, size, path);
}

Status ReadTensor(const std::string& path, const SafetensorsHeader& h, const SafetensorsEntry& e,
                  void* into) {
  if (e.end < e.begin || h.data_offset + e.end > h.file_size)
    return Status::DataErr(path + ": tensor " + Quote(e.name) + " lies beyond the file");
  const uint64_t n = e.end - e.begin;
  if (n == 0) return Status::Ok();
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::NoInput(path + ": cannot open: " + Errno());
  int64_t got = PreadAll(fd, into, n, h.data_offset + e.begin);
  std::string err = got < 0 ? Errno() : "";
  close(fd);
  if (got < 0) return Status::IoErr(path + ": read failed: " + err);
  if (static_cast<uint64_t>(got) != n)
    return Status::DataErr(path + ": truncated: tensor " + Quote(e.name) + " ends at byte " +
                           std::to_string(h.data_offset + e.end) + ", the file at " +
                           std::to_string(h.data_offset + e.begin + got));
  return Status::Ok();
}

}  // namespace ob::ckpt
