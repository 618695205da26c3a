#include "ob/io/records.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ob::io {
namespace {

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

}  // namespace

void AppendRecord(const google::protobuf::MessageLite& msg, std::string* out) {
  PutVarint(msg.ByteSizeLong(), out);
  msg.AppendToString(out);
}

Status RecordWriter::Write(const google::protobuf::MessageLite& msg) {
  std::string frame;
  AppendRecord(msg, &frame);
  size_t off = 0;
  while (off < frame.size()) {
    ssize_t n = write(fd_, frame.data() + off, frame.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::IoErr(name_ + ": write failed: " + std::strerror(errno));
    off += static_cast<size_t>(n);
  }
  ++records_;
  return Status::Ok();
}

RecordReader RecordReader::FromString(std::string data, std::string name) {
  RecordReader r(-1, std::move(name));
  r.buf_ = std::move(data);
  r.eof_ = true;
  return r;
}

Result<bool> RecordReader::Fill(size_t n) {
  while (buf_.size() - pos_ < n && !eof_) {
    if (pos_ > (1u << 20)) {  // drop consumed bytes now and then
      buf_.erase(0, pos_);
      pos_ = 0;
    }
    char tmp[1 << 16];
    ssize_t got = read(fd_, tmp, sizeof tmp);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return Status::IoErr(name_ + ": read failed: " + std::strerror(errno));
    if (got == 0) eof_ = true;
    buf_.append(tmp, static_cast<size_t>(got));
  }
  return buf_.size() - pos_ >= n;
}

Result<bool> RecordReader::Next(google::protobuf::MessageLite* msg) {
  const uint64_t start = offset_;
  const std::string where =
      name_ + ": record " + std::to_string(records_ + 1) + " at byte " + std::to_string(start);
  // Size prefix: up to 10 varint bytes.
  uint64_t size = 0;
  size_t i = 0;
  for (;; ++i) {
    OB_ASSIGN_OR_RETURN(bool have, Fill(i + 1));
    if (!have) {
      if (i == 0) return false;  // clean end between records
      return Status::DataErr(where + ": truncated inside the size prefix");
    }
    auto byte = static_cast<uint8_t>(buf_[pos_ + i]);
    if (i == 9 && byte > 1) return Status::DataErr(where + ": corrupt size prefix");
    size |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
    if (!(byte & 0x80)) break;
  }
  const size_t prefix = i + 1;
  if (size > kMaxRecordBytes)
    return Status::DataErr(where + ": corrupt: size prefix says " + std::to_string(size) +
                           " bytes (limit " + std::to_string(kMaxRecordBytes) + ")");
  OB_ASSIGN_OR_RETURN(bool have, Fill(prefix + size));
  if (!have) {
    size_t remain = buf_.size() - pos_ - prefix;
    return Status::DataErr(where + ": truncated: record of " + std::to_string(size) +
                           " bytes, stream ends after " + std::to_string(remain));
  }
  if (!msg->ParseFromArray(buf_.data() + pos_ + prefix, static_cast<int>(size)))
    return Status::DataErr(where + ": corrupt: not a valid " + msg->GetTypeName());
  pos_ += prefix + size;
  offset_ += prefix + size;
  ++records_;
  return true;
}

}  // namespace ob::io
