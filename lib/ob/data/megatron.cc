#include "ob/data/megatron.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ob/io/file.h"
#include "ob/io/text.h"

namespace ob::data {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

bool IsRegular(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool HasMagic(const std::string& idx) {
  const int fd = ::open(idx.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char head[9];
  const bool ok = ::read(fd, head, 9) == 9 && std::memcmp(head, kMagic, 9) == 0;
  ::close(fd);
  return ok;
}

template <typename T>
T Le(const unsigned char* p) {
  T v = 0;
  for (size_t b = 0; b < sizeof(T); ++b) v |= static_cast<T>(static_cast<T>(p[b]) << (8 * b));
  return v;
}

template <typename T>
void PutLe(std::string* out, T v) {
  for (size_t b = 0; b < sizeof(T); ++b) out->push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * b)) & 0xFF));
}

// Reads exactly n bytes (fewer only at the end of the file).
Result<size_t> ReadFull(int fd, char* buf, size_t n, const std::string& name) {
  size_t at = 0;
  while (at < n) {
    const ssize_t r = ::read(fd, buf + at, n - at);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::NoInput(name + ": cannot read: " + std::strerror(errno));
    if (r == 0) break;
    at += static_cast<size_t>(r);
  }
  return at;
}

}  // namespace

std::string MegatronPrefix(const std::string& spec) {
  if (IsRegular(spec + ".idx") && IsRegular(spec + ".bin")) return spec;
  for (const char* suffix : {".bin", ".idx"}) {
    if (!io::EndsWith(spec, suffix)) continue;
    const std::string prefix = spec.substr(0, spec.size() - 4);
    if (IsRegular(prefix + ".bin") && HasMagic(prefix + ".idx")) return prefix;
  }
  return "";
}

Result<MegatronIndex> ReadMegatronIndex(const std::string& prefix, uint64_t bin_bytes) {
  const std::string name = prefix + ".idx";
  const int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::NoInput(name + ": cannot read: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return Status::DataErr(name + ": not a regular file");
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  unsigned char head[kHeaderBytes];
  OB_ASSIGN_OR_RETURN(size_t got, ReadFull(fd, reinterpret_cast<char*>(head), kHeaderBytes, name));
  if (got < 9 || std::memcmp(head, kMagic, 9) != 0) {
    return Status::DataErr(name + ": not a Megatron index (no MMIDIDX header)");
  }
  if (got < kHeaderBytes) return Status::DataErr(name + ": truncated header");
  const uint64_t version = Le<uint64_t>(head + 9);
  if (version != 1) return Status::DataErr(name + ": index version " + std::to_string(version) + ", ob reads 1");
  MegatronIndex ix;
  ix.dtype_code = head[17];
  switch (ix.dtype_code) {
    case 8: ix.token_bytes = 2; break;  // uint16
    case 4: ix.token_bytes = 4; break;  // int32
    default: {
      static const char* const kNames[] = {"?", "uint8", "int8", "int16", "int32", "int64", "float64", "float32", "uint16"};
      const char* dtype = ix.dtype_code >= 1 && ix.dtype_code <= 8 ? kNames[ix.dtype_code] : "unknown";
      return Status::DataErr(name + ": tokens of dtype " + dtype + " (code " + std::to_string(ix.dtype_code) +
                             "); ob trains on uint16 or int32 tokens");
    }
  }
  ix.sequences = Le<uint64_t>(head + 18);
  const uint64_t doc_entries = Le<uint64_t>(head + 26);
  // The arrays must fit the file (the multimodal modes may follow them).
  const uint64_t need = kHeaderBytes + ix.sequences * 12 + doc_entries * 8;
  if (ix.sequences > (file_bytes / 12) || doc_entries > file_bytes / 8 || need > file_bytes) {
    return Status::DataErr(name + ": " + std::to_string(ix.sequences) + " sequences and " +
                           std::to_string(doc_entries) + " document indices do not fit its " +
                           std::to_string(file_bytes) + " bytes (truncated?)");
  }
  if (doc_entries < 1) return Status::DataErr(name + ": no document indices (there must be at least the 0)");
  ix.documents = doc_entries - 1;
  // Sizes, then pointers: read both in step, in blocks.
  const int sizes_fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
  if (sizes_fd < 0) return Status::NoInput(name + ": cannot read: " + std::strerror(errno));
  Closer sizes_closer{sizes_fd};
  if (::lseek(sizes_fd, static_cast<off_t>(kHeaderBytes), SEEK_SET) < 0 ||
      ::lseek(fd, static_cast<off_t>(kHeaderBytes + ix.sequences * 4), SEEK_SET) < 0) {
    return Status::NoInput(name + ": cannot seek: " + std::strerror(errno));
  }
  constexpr uint64_t kBlock = 1 << 16;
  std::string sizes(kBlock * 4, '\0'), pointers(kBlock * 8, '\0');
  uint64_t expect = 0;  // the next sequence's offset when they tile the .bin
  for (uint64_t i = 0; i < ix.sequences; i += kBlock) {
    const uint64_t k = std::min(kBlock, ix.sequences - i);
    OB_ASSIGN_OR_RETURN(size_t a, ReadFull(sizes_fd, sizes.data(), k * 4, name));
    OB_ASSIGN_OR_RETURN(size_t b, ReadFull(fd, pointers.data(), k * 8, name));
    if (a != k * 4 || b != k * 8) return Status::DataErr(name + ": truncated");
    for (uint64_t j = 0; j < k; ++j) {
      const int32_t size = Le<int32_t>(reinterpret_cast<const unsigned char*>(sizes.data()) + 4 * j);
      const int64_t ptr = Le<int64_t>(reinterpret_cast<const unsigned char*>(pointers.data()) + 8 * j);
      if (size < 0) return Status::DataErr(name + ": sequence " + std::to_string(i + j) + " has a negative length");
      if (static_cast<uint64_t>(ptr) != expect) {
        return Status::DataErr(name + ": sequence " + std::to_string(i + j) + " starts at byte " +
                               std::to_string(ptr) + " of the .bin, not " + std::to_string(expect) +
                               " (ob reads sequences stored in order, back to back)");
      }
      expect += static_cast<uint64_t>(size) * static_cast<uint64_t>(ix.token_bytes);
      ix.tokens += static_cast<uint64_t>(size);
    }
  }
  if (expect != bin_bytes) {
    return Status::DataErr(name + ": its sequences hold " + std::to_string(expect) + " bytes, " + prefix +
                           ".bin has " + std::to_string(bin_bytes));
  }
  // Document boundaries: 0, ascending, ending at S.
  int64_t prev = -1;
  for (uint64_t i = 0; i < doc_entries; i += kBlock) {
    const uint64_t k = std::min(kBlock, doc_entries - i);
    OB_ASSIGN_OR_RETURN(size_t b, ReadFull(fd, pointers.data(), k * 8, name));
    if (b != k * 8) return Status::DataErr(name + ": truncated");
    for (uint64_t j = 0; j < k; ++j) {
      const int64_t d = Le<int64_t>(reinterpret_cast<const unsigned char*>(pointers.data()) + 8 * j);
      const bool first = i + j == 0, last = i + j + 1 == doc_entries;
      if ((first && d != 0) || (!first && d < prev) || (last && static_cast<uint64_t>(d) != ix.sequences)) {
        return Status::DataErr(name + ": document index " + std::to_string(i + j) + " is " + std::to_string(d) +
                               " (they ascend from 0 to the " + std::to_string(ix.sequences) + " sequences)");
      }
      prev = d;
    }
  }
  return ix;
}

Result<std::unique_ptr<MegatronWriter>> MegatronWriter::Open(const std::string& prefix, uint32_t vocab_size) {
  std::unique_ptr<MegatronWriter> w(new MegatronWriter());
  w->prefix_ = prefix;
  w->width_ = vocab_size < 65500 ? 2 : 4;
  for (auto [suffix, target, temp, fd] :
       {std::tuple{".bin", &w->bin_target_, &w->bin_temp_, &w->bin_fd_},
        std::tuple{".idx", &w->idx_target_, &w->idx_temp_, &w->idx_fd_}}) {
    const std::string path = prefix + suffix;
    OB_ASSIGN_OR_RETURN(io::OutputTarget t, io::ResolveOutput(path));
    if (!t.replace) return Status::Usage(path + ": a Megatron dataset is a pair of regular files, not a device or pipe");
    *target = t.path;
    OB_ASSIGN_OR_RETURN(*fd, io::CreateTemporary(t.path, path, temp));
  }
  OB_ASSIGN_OR_RETURN(w->sizes_fd_, io::CreateTemporary(w->idx_target_ + ".sizes", prefix + ".idx", &w->sizes_temp_));
  return w;
}

MegatronWriter::~MegatronWriter() {
  for (int fd : {bin_fd_, idx_fd_, sizes_fd_})
    if (fd >= 0) ::close(fd);
  for (const std::string* temp : {&bin_temp_, &idx_temp_, &sizes_temp_}) {
    if (temp->empty()) continue;
    if (!committed_ || temp == &sizes_temp_) ::unlink(temp->c_str());
    io::ForgetTemporary(*temp);
  }
}

Status MegatronWriter::FlushBin(bool all) {
  if (!all && bin_buf_.size() < (size_t{4} << 20)) return Status::Ok();
  OB_RETURN_IF_ERROR(io::WriteAll(bin_fd_, bin_buf_, prefix_ + ".bin"));
  bin_buf_.clear();
  return Status::Ok();
}

Status MegatronWriter::FlushSizes(bool all) {
  if (!all && sizes_buf_.size() < (size_t{1} << 20)) return Status::Ok();
  OB_RETURN_IF_ERROR(io::WriteAll(sizes_fd_, sizes_buf_, prefix_ + ".idx"));
  sizes_buf_.clear();
  return Status::Ok();
}

Status MegatronWriter::EndDocument() {
  if (open_tokens_ == 0) return Status::Ok();
  if (open_tokens_ > INT32_MAX) {
    return Status::DataErr(prefix_ + ".idx: a document of " + std::to_string(open_tokens_) +
                           " tokens; Megatron's index holds at most 2^31 - 1 a sequence");
  }
  PutLe(&sizes_buf_, static_cast<int32_t>(open_tokens_));
  ++documents_;
  open_tokens_ = 0;
  return FlushSizes(false);
}

Status MegatronWriter::Write(std::vector<uint32_t>* ids, const std::vector<size_t>& ends) {
  size_t e = 0;
  for (size_t i = 0; i <= ids->size(); ++i) {
    while (e < ends.size() && ends[e] == i) {
      OB_RETURN_IF_ERROR(EndDocument());
      ++e;
    }
    if (i == ids->size()) break;
    const uint32_t id = (*ids)[i];
    if (width_ == 2) {
      PutLe(&bin_buf_, static_cast<uint16_t>(id));
    } else {
      PutLe(&bin_buf_, static_cast<uint32_t>(id));
    }
    ++open_tokens_;
  }
  tokens_ += ids->size();
  ids->clear();
  return FlushBin(false);
}

Status MegatronWriter::Commit() {
  OB_RETURN_IF_ERROR(EndDocument());
  OB_RETURN_IF_ERROR(FlushBin(true));
  OB_RETURN_IF_ERROR(FlushSizes(true));
  const std::string idx_name = prefix_ + ".idx";
  std::string out(kMagic, 9);
  PutLe(&out, uint64_t{1});
  out.push_back(static_cast<char>(width_ == 2 ? 8 : 4));
  PutLe(&out, documents_);
  PutLe(&out, documents_ + 1);
  // Sizes as written, then each sequence's byte offset from them, then
  // the document boundaries 0..D (one sequence a document).
  const int sizes_in = ::open(sizes_temp_.c_str(), O_RDONLY | O_CLOEXEC);
  if (sizes_in < 0) return Status::IoErr(idx_name + ": cannot read back its sizes: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{sizes_in};
  for (int pass = 0; pass < 2; ++pass) {
    if (::lseek(sizes_in, 0, SEEK_SET) < 0) return Status::IoErr(idx_name + ": cannot seek: " + std::strerror(errno));
    std::string block(size_t{1} << 20, '\0');
    uint64_t offset = 0;
    for (;;) {
      OB_ASSIGN_OR_RETURN(size_t n, ReadFull(sizes_in, block.data(), block.size(), idx_name));
      if (n == 0) break;
      if (pass == 0) {
        out.append(block, 0, n);
      } else {
        for (size_t j = 0; j + 4 <= n; j += 4) {
          PutLe(&out, static_cast<int64_t>(offset));
          offset += static_cast<uint64_t>(Le<int32_t>(reinterpret_cast<const unsigned char*>(block.data()) + j)) *
                    static_cast<uint64_t>(width_);
        }
      }
      if (out.size() >= (size_t{4} << 20)) {
        OB_RETURN_IF_ERROR(io::WriteAll(idx_fd_, out, idx_name));
        out.clear();
      }
    }
  }
  for (uint64_t d = 0; d <= documents_; ++d) {
    PutLe(&out, static_cast<int64_t>(d));
    if (out.size() >= (size_t{4} << 20)) {
      OB_RETURN_IF_ERROR(io::WriteAll(idx_fd_, out, idx_name));
      out.clear();
    }
  }
  OB_RETURN_IF_ERROR(io::WriteAll(idx_fd_, out, idx_name));
  for (auto [fd, name] : {std::pair{&bin_fd_, prefix_ + ".bin"}, std::pair{&idx_fd_, idx_name}}) {
    const bool ok = ::fsync(*fd) == 0;
    const bool closed = ::close(*fd) == 0;
    *fd = -1;
    if (!ok || !closed) return Status::IoErr(name + ": cannot write: " + std::strerror(errno));
  }
  // The .bin first: a pair whose .idx is new is complete.
  if (::rename(bin_temp_.c_str(), bin_target_.c_str()) != 0) {
    return Status::IoErr(prefix_ + ".bin: cannot replace: " + std::strerror(errno));
  }
  committed_ = true;
  if (::rename(idx_temp_.c_str(), idx_target_.c_str()) != 0) {
    ::unlink(idx_temp_.c_str());
    return Status::IoErr(idx_name + ": cannot replace: " + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace ob::data
