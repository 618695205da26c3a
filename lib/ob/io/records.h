// Length-delimited record streams (design.md): each record is a protobuf
// message preceded by its size as a base-128 varint, the framing protobuf's
// delimited-message utilities use, so other tools can read our streams.
//
// RecordReader reads incrementally from a file descriptor (a file or a live
// pipe) and, when a stream is damaged, says where: the record number and the
// byte offset at which the damage starts, and whether the stream ends inside a
// record (truncated) or holds something that is not a record (corrupt).
// Neither class is thread-safe; neither owns its descriptor.
#pragma once

#include <cstdint>
#include <string>

#include <google/protobuf/message_lite.h>

#include "ob/status.h"

namespace ob::io {

// Records larger than this are taken as corruption, not allocated.
inline constexpr uint64_t kMaxRecordBytes = 64ull << 20;

class RecordWriter {
 public:
  RecordWriter(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}
  // Writes one record with a single write(2) per record; kIoErr on failure.
  Status Write(const google::protobuf::MessageLite& msg);
  uint64_t records() const { return records_; }

 private:
  int fd_;
  std::string name_;
  uint64_t records_ = 0;
};

// Appends one delimited record to `out` (for building streams in memory).
void AppendRecord(const google::protobuf::MessageLite& msg, std::string* out);

class RecordReader {
 public:
  // Reads from `fd` (not owned); `name` is used in messages.
  RecordReader(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}
  // Reads from memory.
  static RecordReader FromString(std::string data, std::string name);

  // Reads the next record into `msg`. Returns true for a record, false at a
  // clean end of stream, or kDataErr naming the stream, record and offset.
  Result<bool> Next(google::protobuf::MessageLite* msg);

  uint64_t records() const { return records_; }   // records read so far
  uint64_t offset() const { return offset_; }     // bytes consumed so far

 private:
  // Ensures `n` unconsumed bytes are buffered; false at end of stream.
  Result<bool> Fill(size_t n);

  int fd_ = -1;
  std::string name_;
  std::string buf_;
  size_t pos_ = 0;        // next unconsumed byte in buf_
  bool eof_ = false;
  uint64_t records_ = 0;
  uint64_t offset_ = 0;
};

}  // namespace ob::io
