#include "ob/data/tokenize.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "ob/data/corpus.h"
#include "ob/data/megatron.h"
#include "ob/io/file.h"
#include "ob/model/data.h"

namespace ob::data {
namespace {

using Clock = std::chrono::steady_clock;

Status Errno(const std::string& what) { return Status::IoErr(what + ": " + std::strerror(errno)); }

// `ids` as little-endian integers of `width` (2 or 4) bytes, appended.
void AppendLe(const std::vector<uint32_t>& ids, int width, std::string* out) {
  const size_t at = out->size();
  out->resize(at + ids.size() * static_cast<size_t>(width));
  auto* p = reinterpret_cast<unsigned char*>(out->data() + at);
  for (uint32_t id : ids) {
    p[0] = static_cast<unsigned char>(id);
    p[1] = static_cast<unsigned char>(id >> 8);
    if (width == 4) {
      p[2] = static_cast<unsigned char>(id >> 16);
      p[3] = static_cast<unsigned char>(id >> 24);
    }
    p += width;
  }
}

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
    AppendLe(*ids, width_, &buffer_);
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
// `forced` (2 or 4; 0: by the name) for an output whose name says nothing,
// a pipe's.
Result<int> IdWidth(const std::string& path, uint32_t vocab_size, int forced) {
  const model::TokenFormat format = model::TokenFormatForPath(path);
  if (forced != 0) {
    const int named = format == model::TokenFormat::kU32 ? 4 : format == model::TokenFormat::kU16 ? 2 : 0;
    if (named != 0 && named != forced) {
      return Status::Usage(path + ": its name says uint" + std::to_string(8 * named) + " ids, --format uint" +
                           std::to_string(8 * forced));
    }
    if (forced == 2 && vocab_size > 65536) {
      return Status::Usage("--format u16: a vocabulary of " + std::to_string(vocab_size) + " ids does not fit uint16 ids");
    }
    return forced;
  }
  if (format == model::TokenFormat::kU32) return 4;
  if (format != model::TokenFormat::kU16) {
    return Status::Usage(path + ": name a token file *.bin (uint16 ids) or *.u32 (uint32 ids), or give "
                         "--format u16 or u32 (a pipe)");
  }
  if (vocab_size > 65536) {
    return Status::Usage(path + ": a vocabulary of " + std::to_string(vocab_size) +
                         " ids does not fit uint16 ids (*.bin); name it *.u32");
  }
  return 2;
}

Status EncoderStatus(const Encoder&) { return Status::Ok(); }
Status EncoderStatus(const HfEncoder& enc) { return enc.status(); }

// One output: flat ids (TokenWriter) or a Megatron pair.
class Output {
 public:
  static Result<std::unique_ptr<Output>> Open(const std::string& path, uint32_t vocab_size, bool megatron,
                                              int width) {
    auto out = std::make_unique<Output>();
    if (megatron) {
      std::string prefix = path;
      for (const char* suffix : {".bin", ".idx"}) {
        if (prefix.size() > 4 && prefix.compare(prefix.size() - 4, 4, suffix) == 0) prefix.resize(prefix.size() - 4);
      }
      OB_ASSIGN_OR_RETURN(out->megatron_, MegatronWriter::Open(prefix, vocab_size));
    } else {
      OB_ASSIGN_OR_RETURN(const int bytes, IdWidth(path, vocab_size, width));
      OB_ASSIGN_OR_RETURN(out->flat_, TokenWriter::Open(path, bytes));
    }
    return out;
  }
  Status Write(std::vector<uint32_t>* ids, const std::vector<size_t>& ends) {
    return megatron_ ? megatron_->Write(ids, ends) : flat_->Write(ids);
  }
  Status Commit() { return megatron_ ? megatron_->Commit() : flat_->Commit(); }
  uint64_t count() const { return megatron_ ? megatron_->tokens() : flat_->count(); }

 private:
  std::unique_ptr<TokenWriter> flat_;
  std::unique_ptr<MegatronWriter> megatron_;
};

// A unit's ids, and where in them each document it ends ends.
struct Encoded {
  std::vector<uint32_t> ids;
  std::vector<size_t> ends;
  Status status;
};

// Unit `u` through `enc`: each document `prefix` first, its ids, then
// `eot` (when >= 0). The encoder ends the unit empty, so the next unit's
// ids do not depend on this one's.
template <typename Enc>
void EncodeUnit(Enc& enc, const Unit& u, const std::vector<uint32_t>& prefix, int64_t eot, Encoded* out) {
  out->ids.clear();
  out->ends.clear();
  auto flush = [&] {
    out->ids.insert(out->ids.end(), enc.ids().begin(), enc.ids().end());
    enc.ids().clear();
  };
  const std::string_view text = u.text;
  for (const Unit::Piece& p : u.pieces) {
    if (p.starts_doc) {
      flush();
      out->ids.insert(out->ids.end(), prefix.begin(), prefix.end());
    }
    enc.Add(text.substr(p.begin, p.size));
    if (p.ends_doc) {
      enc.End();
      flush();
      if (eot >= 0) out->ids.push_back(static_cast<uint32_t>(eot));
      out->ends.push_back(out->ids.size());
    }
  }
  enc.End();
  flush();
  out->status = EncoderStatus(enc);
}

// Units from `reader` through encoders from `make`, on `jobs` threads,
// handed to `write` in order. Up to 2·jobs + 2 units are in memory at
// once. The first error (reading, encoding or writing) stops everything.
template <typename MakeEnc, typename Write>
Status Pipeline(CorpusReader& reader, int jobs, MakeEnc&& make, const std::vector<uint32_t>& prefix, int64_t eot,
                Write&& write) {
  if (jobs <= 1) {
    auto enc = make();
    Unit u;
    Encoded e;
    for (;;) {
      OB_ASSIGN_OR_RETURN(bool more, reader.Next(&u));
      if (!more) return Status::Ok();
      EncodeUnit(*enc, u, prefix, eot, &e);
      OB_RETURN_IF_ERROR(write(u, e));
    }
  }
  enum State { kFree, kRead, kTaken, kDone };
  struct Slot {
    Unit unit;
    Encoded encoded;
    State state = kFree;
  };
  const size_t window = 2 * static_cast<size_t>(jobs) + 2;
  std::vector<Slot> slots(window);
  std::mutex mu;
  std::condition_variable cv;
  uint64_t next_read = 0, next_encode = 0, next_write = 0;
  bool read_done = false, stop = false;
  Status read_error;
  std::thread read_thread([&] {
    for (;;) {
      Slot* slot;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || slots[next_read % window].state == kFree; });
        if (stop) return;
        slot = &slots[next_read % window];
      }
      Result<bool> more = reader.Next(&slot->unit);  // a free slot is the reader's alone
      std::lock_guard<std::mutex> lock(mu);
      if (!more.ok() || !*more) {
        if (!more.ok()) read_error = more.status();
        read_done = true;
        cv.notify_all();
        return;
      }
      slot->state = kRead;
      ++next_read;
      cv.notify_all();
    }
  });
  std::vector<std::thread> workers;
  for (int j = 0; j < jobs; ++j) {
    workers.emplace_back([&] {
      auto enc = make();
      for (;;) {
        Slot* slot;
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stop || next_encode < next_read || read_done; });
          if (stop || next_encode == next_read) return;  // read_done: nothing left to encode
          slot = &slots[next_encode % window];
          slot->state = kTaken;
          ++next_encode;
        }
        EncodeUnit(*enc, slot->unit, prefix, eot, &slot->encoded);
        std::lock_guard<std::mutex> lock(mu);
        slot->state = kDone;
        cv.notify_all();
      }
    });
  }
  Status status;
  for (;;) {
    Slot* slot;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] {
        return slots[next_write % window].state == kDone || (read_done && next_write == next_read);
      });
      if (slots[next_write % window].state != kDone) break;
      slot = &slots[next_write % window];
    }
    status = write(slot->unit, slot->encoded);
    std::lock_guard<std::mutex> lock(mu);
    if (!status.ok()) {
      stop = true;
      cv.notify_all();
      break;
    }
    slot->state = kFree;
    ++next_write;
    cv.notify_all();
  }
  read_thread.join();
  for (std::thread& t : workers) t.join();
  if (!status.ok()) return status;
  return read_error;
}

// The inputs through encoders from `make`, as the header says.
template <typename MakeEnc>
Result<TokenizeStats> Run(MakeEnc&& make, uint32_t vocab_size, const std::vector<uint32_t>& prefix, int64_t eot,
                          const TokenizeOptions& o) {
  const auto t0 = Clock::now();
  if (o.inputs.empty()) return Status::Usage("no input: give text or JSON Lines files, or - for stdin");
  if (o.val_fraction < 0 || o.val_fraction >= 1) return Status::Usage("--val-fraction must be in [0, 1)");
  if (o.jobs < 1) return Status::Usage("-j must be at least 1");
  const bool split = o.val_fraction > 0;
  if (split && o.val_output.empty()) return Status::Usage("--val-fraction needs --val-output FILE");
  if (!split && !o.val_output.empty()) return Status::Usage("--val-output needs --val-fraction F");

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
  OB_ASSIGN_OR_RETURN(auto train, Output::Open(o.output, vocab_size, o.megatron, o.id_bytes));
  std::unique_ptr<Output> val;
  if (split) {
    OB_ASSIGN_OR_RETURN(val, Output::Open(o.val_output, vocab_size, o.megatron, o.id_bytes));
  }
  CorpusOptions co;
  co.inputs = o.inputs;
  co.field = o.field;
  co.stdin_json_lines = o.stdin_json_lines;
  co.skip_bad = o.skip_bad;
  co.split_at = split ? static_cast<uint64_t>(static_cast<double>(total) * (1 - o.val_fraction)) : UINT64_MAX;
  co.unit_bytes = std::max<size_t>(o.chunk_bytes, 1);
  CorpusReader reader(co);
  TokenizeStats s;
  auto write = [&](const Unit& u, Encoded& e) -> Status {
    OB_RETURN_IF_ERROR(e.status);
    s.documents += e.ends.size();
    OB_RETURN_IF_ERROR((u.val ? val : train)->Write(&e.ids, e.ends));
    if (o.progress) o.progress(u.raw_done, sized ? total : 0, train->count() + (val ? val->count() : 0));
    return Status::Ok();
  };
  OB_RETURN_IF_ERROR(Pipeline(reader, o.jobs, make, prefix, eot, write));
  OB_RETURN_IF_ERROR(train->Commit());
  if (val) OB_RETURN_IF_ERROR(val->Commit());
  s.bytes = reader.raw_done();
  s.train_tokens = train->count();
  s.val_tokens = val ? val->count() : 0;
  s.skipped = reader.skipped();
  s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return s;
}

// The bytes of each id in the token file `path`, by `bytes` (empty: none).
template <typename Bytes>
Status DetokenizeWith(const Bytes& bytes, const std::string& path, std::string* out) {
  int width = model::TokenFormatForPath(path) == model::TokenFormat::kU32 ? 4 : 2;
  std::string file = path;
  if (const std::string prefix = MegatronPrefix(path); !prefix.empty()) {
    // A Megatron dataset: its .bin, ids as wide as its index says.
    file = prefix + ".bin";
    struct stat st {};
    if (::stat(file.c_str(), &st) != 0) return Status::NoInput(file + ": cannot read: " + std::strerror(errno));
    OB_ASSIGN_OR_RETURN(MegatronIndex ix, ReadMegatronIndex(prefix, static_cast<uint64_t>(st.st_size)));
    width = ix.token_bytes;
  }
  OB_ASSIGN_OR_RETURN(std::string data, io::ReadFile(file));
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
  return Run([&] { return std::make_unique<Encoder>(bpe); }, bpe.vocab_size(), {}, eot, o);
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
  return Run([&] { return std::make_unique<HfEncoder>(tok, o.split_special_tokens); }, tok.vocab_size(), prefix, eot,
             o);
}

Status Detokenize(const Bpe& bpe, const std::string& path, std::string* out) {
  return DetokenizeWith([&](uint32_t id) -> const std::string& { return bpe.Bytes(id); }, path, out);
}

Status Detokenize(const HfTokenizer& tok, const std::string& path, std::string* out) {
  return DetokenizeWith([&](uint32_t id) -> const std::string& { return tok.Bytes(id); }, path, out);
}

}  // namespace ob::data
