#include "ob/data/tokenize.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>

#include "ob/io/file.h"
#include "ob/model/data.h"

namespace ob::data {
namespace {

using Clock = std::chrono::steady_clock;

Status Errno(const std::string& what) { return Status::IoErr(what + ": " + std::strerror(errno)); }

// Little-endian ids of 2 or 4 bytes into a file, replaced atomically (or a
// device or pipe written through, as io::ResolveOutput says) on Commit.
class TokenWriter {
 public:
  static Result<std::unique_ptr<TokenWriter>> Open(const std::string& path, int width) {
    std::unique_ptr<TokenWriter> w(new TokenWriter());
    w->name_ = path;
    w->width_ = width;
    OB_ASSIGN_OR_RETURN(io::OutputTarget target, io::ResolveOutput(path));
    w->target_ = target.path;
    if (target.replace) {
      OB_ASSIGN_OR_RETURN(w->fd_, io::CreateTemporary(target.path, path, &w->temp_));
    } else {
      OB_ASSIGN_OR_RETURN(w->fd_, io::OpenWriteThrough(target.path));
    }
    return w;
  }

  ~TokenWriter() {
    if (fd_ >= 0) ::close(fd_);
    if (!temp_.empty() && !committed_) ::unlink(temp_.c_str());
    if (!temp_.empty()) io::ForgetTemporary(temp_);
  }

  Status Write(std::vector<uint32_t>* ids) {
    for (uint32_t id : *ids) {
      for (int b = 0; b < width_; ++b) buffer_.push_back(static_cast<char>((id >> (8 * b)) & 0xFF));
    }
    count_ += ids->size();
    ids->clear();
    return buffer_.size() >= (size_t{4} << 20) ? Flush() : Status::Ok();
  }

  Status Commit() {
    OB_RETURN_IF_ERROR(Flush());
    if (!temp_.empty() && ::fsync(fd_) != 0) return Errno(name_ + ": cannot write");
    if (::close(fd_) != 0) {
      fd_ = -1;
      return Errno(name_ + ": cannot write");
    }
    fd_ = -1;
    if (!temp_.empty()) {
      if (::rename(temp_.c_str(), target_.c_str()) != 0) return Errno(name_ + ": cannot replace");
      committed_ = true;
    }
    return Status::Ok();
  }

  uint64_t count() const { return count_; }

 private:
  TokenWriter() = default;
  Status Flush() {
    size_t at = 0;
    while (at < buffer_.size()) {
      const ssize_t n = ::write(fd_, buffer_.data() + at, buffer_.size() - at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Errno(name_ + ": cannot write");
      at += static_cast<size_t>(n);
    }
    buffer_.clear();
    return Status::Ok();
  }
  std::string name_, target_, temp_;
  int fd_ = -1;
  int width_ = 2;
  bool committed_ = false;
  uint64_t count_ = 0;
  std::string buffer_;
};

// The bytes of an id in the token file `path`, as ob-launch will read it.
Result<int> IdWidth(const std::string& path, uint32_t vocab_size) {
  const model::TokenFormat format = model::TokenFormatForPath(path);
  if (format == model::TokenFormat::kU32) return 4;
  if (format != model::TokenFormat::kU16) {
    return Status::Usage(path + ": name a token file *.bin (uint16 ids) or *.u32 (uint32 ids)");
  }
  if (vocab_size > 65536) {
    return Status::Usage(path + ": a vocabulary of " + std::to_string(vocab_size) +
                         " ids does not fit uint16 ids (*.bin); name it *.u32");
  }
  return 2;
}

Status EncoderStatus(const Encoder&) { return Status::Ok(); }
Status EncoderStatus(const HfEncoder& enc) { return enc.status(); }

// The inputs through `enc`, each input a document: `prefix` before it, its
// ids, then `eot` (when >= 0).
template <typename Enc>
Result<TokenizeStats> Run(Enc& enc, uint32_t vocab_size, const std::vector<uint32_t>& prefix, int64_t eot,
                          const TokenizeOptions& o) {
  const auto t0 = Clock::now();
  if (o.inputs.empty()) return Status::Usage("no input: give text files, or - for stdin");
  if (o.val_fraction < 0 || o.val_fraction >= 1) return Status::Usage("--val-fraction must be in [0, 1)");
  const bool split = o.val_fraction > 0;
  if (split && o.val_output.empty()) return Status::Usage("--val-fraction needs --val-output FILE");
  if (!split && !o.val_output.empty()) return Status::Usage("--val-output needs --val-fraction F");
  OB_ASSIGN_OR_RETURN(int width, IdWidth(o.output, vocab_size));
  int val_width = width;
  if (split) {
    OB_ASSIGN_OR_RETURN(val_width, IdWidth(o.val_output, vocab_size));
  }

  // Sizes, for the split and the progress line.
  uint64_t total = 0;
  bool sized = true;
  for (const std::string& in : o.inputs) {
    struct stat st {};
    if (in == "-" || ::stat(in.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      sized = false;
      continue;
    }
    total += static_cast<uint64_t>(st.st_size);
  }
  if (split && !sized) {
    return Status::Usage("--val-fraction splits at a fraction of the inputs' size: give regular files, not stdin or a pipe");
  }
  const uint64_t split_at = split ? static_cast<uint64_t>(static_cast<double>(total) * (1 - o.val_fraction)) : UINT64_MAX;

  OB_ASSIGN_OR_RETURN(auto train, TokenWriter::Open(o.output, width));
  std::unique_ptr<TokenWriter> val;
  if (split) {
    OB_ASSIGN_OR_RETURN(val, TokenWriter::Open(o.val_output, val_width));
  }
  TokenWriter* out = train.get();
  // 0: before the split point; 1: past it, looking for the end of its line; 2: split.
  int phase = split ? 0 : 2;
  uint64_t done = 0;
  std::string chunk(o.chunk_bytes, '\0');

  auto to_val = [&]() -> Status {
    enc.End();
    OB_RETURN_IF_ERROR(EncoderStatus(enc));
    OB_RETURN_IF_ERROR(out->Write(&enc.ids()));
    out = val.get();
    phase = 2;
    return Status::Ok();
  };
  for (const std::string& in : o.inputs) {
    const std::string name = io::DisplayName(in);
    int fd = in == "-" ? STDIN_FILENO : ::open(in.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::NoInput(in + ": cannot read: " + std::strerror(errno));
    struct Closer {
      int fd;
      ~Closer() {
        if (fd != STDIN_FILENO) ::close(fd);
      }
    } closer{fd};
    enc.ids().insert(enc.ids().end(), prefix.begin(), prefix.end());
    for (;;) {
      ssize_t n = ::read(fd, chunk.data(), chunk.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Status::NoInput(name + ": cannot read: " + std::strerror(errno));
      if (n == 0) break;
      std::string_view data(chunk.data(), static_cast<size_t>(n));
      if (phase == 0 && done + data.size() > split_at) phase = 1;
      if (phase == 1) {
        const size_t from = split_at > done ? static_cast<size_t>(split_at - done) : 0;
        const size_t nl = data.find('\n', from);
        if (nl != std::string_view::npos) {
          enc.Add(data.substr(0, nl + 1));
          OB_RETURN_IF_ERROR(to_val());
          data.remove_prefix(nl + 1);
        }
      }
      enc.Add(data);
      OB_RETURN_IF_ERROR(EncoderStatus(enc).WithContext(name));
      OB_RETURN_IF_ERROR(out->Write(&enc.ids()));
      done += static_cast<uint64_t>(n);
      if (o.progress) o.progress(done, sized ? total : 0, train->count() + (val ? val->count() : 0));
    }
    enc.End();
    OB_RETURN_IF_ERROR(EncoderStatus(enc).WithContext(name));
    if (eot >= 0) enc.ids().push_back(static_cast<uint32_t>(eot));
    OB_RETURN_IF_ERROR(out->Write(&enc.ids()));
    if (phase == 1) OB_RETURN_IF_ERROR(to_val());  // no newline after the split point in this input
  }
  if (split && phase != 2) OB_RETURN_IF_ERROR(to_val());
  OB_RETURN_IF_ERROR(train->Commit());
  if (val) OB_RETURN_IF_ERROR(val->Commit());
  TokenizeStats s;
  s.bytes = done;
  s.train_tokens = train->count();
  s.val_tokens = val ? val->count() : 0;
  s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return s;
}

// The bytes of each id in the token file `path`, by `bytes` (empty: none).
template <typename Bytes>
Status DetokenizeWith(const Bytes& bytes, const std::string& path, std::string* out) {
  const int width = model::TokenFormatForPath(path) == model::TokenFormat::kU32 ? 4 : 2;
  OB_ASSIGN_OR_RETURN(std::string data, io::ReadFile(path));
  if (data.size() % width != 0) {
    return Status::DataErr(path + ": " + std::to_string(data.size()) + " bytes is not a whole number of " +
                           std::to_string(width) + "-byte ids");
  }
  for (size_t i = 0; i < data.size(); i += width) {
    uint32_t id = 0;
    for (int b = 0; b < width; ++b) id |= static_cast<uint32_t>(static_cast<unsigned char>(data[i + b])) << (8 * b);
    const std::string& text = bytes(id);
    if (text.empty()) {
      return Status::DataErr(path + ": id " + std::to_string(id) + " at position " + std::to_string(i / width) +
                             " is not in the vocabulary");
    }
    out->append(text);
  }
  return Status::Ok();
}

}  // namespace

Result<TokenizeStats> Tokenize(const Bpe& bpe, const TokenizeOptions& o) {
  const std::string eot_token = o.eot_token.empty() ? "<|endoftext|>" : o.eot_token;
  const int64_t eot = o.eot ? bpe.Id(eot_token) : -1;
  if (o.eot && eot < 0) return Status::Usage("--eot: the vocabulary has no " + eot_token);
  if (o.bos > 0) return Status::Usage("--bos: GPT-2's vocabulary has no BOS token (give --tokenizer for one that has)");
  if (o.split_special_tokens) {
    return Status::Usage("--split-special-tokens: GPT-2's files have no added tokens; their text is always text");
  }
  Encoder enc(bpe);
  return Run(enc, bpe.vocab_size(), {}, eot, o);
}

Result<TokenizeStats> Tokenize(const HfTokenizer& tok, const TokenizeOptions& o) {
  int64_t eot = -1;
  if (o.eot) {
    eot = o.eot_token.empty() ? tok.eos_id() : tok.Id(o.eot_token);
    if (eot < 0 && o.eot_token.empty()) {
      return Status::Usage("--eot: no tokenizer_config.json beside the tokenizer names an eos_token: "
                           "name the token with --eot-token TOKEN");
    }
    if (eot < 0) return Status::Usage("--eot-token: " + o.eot_token + " is not a token of the tokenizer");
  }
  std::vector<uint32_t> prefix = o.bos == 0 ? std::vector<uint32_t>() : tok.prefix();
  if (o.bos > 0 && prefix.empty()) {
    if (tok.bos_id() < 0) {
      return Status::Usage("--bos: the tokenizer names no BOS token (no template adds one, and no "
                           "tokenizer_config.json beside it names a bos_token)");
    }
    prefix.push_back(static_cast<uint32_t>(tok.bos_id()));
  }
  HfEncoder enc(tok, o.split_special_tokens);
  return Run(enc, tok.vocab_size(), prefix, eot, o);
}

Status Detokenize(const Bpe& bpe, const std::string& path, std::string* out) {
  return DetokenizeWith([&](uint32_t id) -> const std::string& { return bpe.Bytes(id); }, path, out);
}

Status Detokenize(const HfTokenizer& tok, const std::string& path, std::string* out) {
  return DetokenizeWith([&](uint32_t id) -> const std::string& { return tok.Bytes(id); }, path, out);
}

}  // namespace ob::data
