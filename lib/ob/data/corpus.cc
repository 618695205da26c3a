#include "ob/data/corpus.h"

#include <simdjson.h>

#include <cctype>
#include <utility>

namespace ob::data {
namespace {

constexpr size_t kReadBytes = size_t{1} << 20;

bool Blank(std::string_view s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\r') return false;
  return true;
}

bool Alnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

const char* TypeName(simdjson::dom::element_type t) {
  switch (t) {
    case simdjson::dom::element_type::ARRAY: return "an array";
    case simdjson::dom::element_type::OBJECT: return "an object";
    case simdjson::dom::element_type::INT64:
    case simdjson::dom::element_type::UINT64:
    case simdjson::dom::element_type::DOUBLE: return "a number";
    case simdjson::dom::element_type::STRING: return "a string";
    case simdjson::dom::element_type::BOOL: return "a boolean";
    case simdjson::dom::element_type::NULL_VALUE: return "null";
  }
  return "a value";
}

}  // namespace

struct CorpusReader::Json {
  simdjson::dom::parser parser;
  std::vector<char> line;  // the line, padded as simdjson reads it
};

CorpusReader::CorpusReader(CorpusOptions o) : o_(std::move(o)), json_(std::make_unique<Json>()) {}
CorpusReader::~CorpusReader() = default;

Status CorpusReader::Open() {
  const std::string& path = o_.inputs[next_input_++];
  OB_ASSIGN_OR_RETURN(reader_, ByteReader::Open(path, o_.stdin_json_lines));
  carry_.clear();
  carry_off_ = 0;
  carry_pos_ = raw_before_;
  doc_started_ = false;
  eof_ = false;
  check_ = TextCheck();
  line_ = 0;
  return Status::Ok();
}

void CorpusReader::CloseInput() {
  raw_before_ += reader_->raw_bytes();
  reader_.reset();
  carry_.clear();
  carry_off_ = 0;
}

Result<bool> CorpusReader::Fill() {
  if (eof_) return false;
  if (carry_off_ > 0) {
    carry_.erase(0, carry_off_);
    carry_off_ = 0;
  }
  const size_t old = carry_.size();
  carry_.resize(old + kReadBytes);
  auto got = reader_->Read(carry_.data() + old, kReadBytes);
  if (!got.ok()) {
    carry_.resize(old);
    return got.status();
  }
  carry_.resize(old + *got);
  const bool json = reader_->kind().json_lines;
  if (*got == 0) {
    eof_ = true;
    if (!json) OB_RETURN_IF_ERROR(check_.End(reader_->name()));
    return false;
  }
  if (!json) OB_RETURN_IF_ERROR(check_.Add(std::string_view(carry_.data() + old, *got), reader_->name()));
  return true;
}

uint64_t CorpusReader::PositionOf(size_t k) const {
  if (reader_->kind().compression == Compression::kNone) return carry_pos_ + k;
  return raw_before_ + reader_->raw_bytes();
}

void CorpusReader::Take(Unit* u, size_t n, bool ends_doc) {
  const size_t begin = u->text.size();
  u->text.append(carry_, carry_off_, n);
  carry_off_ += n;
  carry_pos_ += n;
  if (!u->pieces.empty() && doc_started_ && !u->pieces.back().ends_doc) {
    Unit::Piece& last = u->pieces.back();  // the same document, contiguous
    last.size += n;
    last.ends_doc = ends_doc;
  } else {
    u->pieces.push_back({begin, n, !doc_started_, ends_doc});
  }
  doc_started_ = !ends_doc;
}

Result<bool> CorpusReader::NextText(Unit* u) {
  for (;;) {
    if (carry_off_ == carry_.size()) {
      OB_ASSIGN_OR_RETURN(bool more, Fill());
      if (!more) {
        Take(u, 0, true);  // the document ends (an empty input is an empty one)
        doc_started_ = false;
        CloseInput();
        if (split_pending_) {  // no newline after the split point in this input
          split_pending_ = false;
          val_ = true;
          return true;
        }
        return false;
      }
    }
    const size_t avail = carry_.size() - carry_off_;
    const std::string_view data(carry_.data() + carry_off_, avail);
    if (!val_ && !split_pending_ && o_.split_at != UINT64_MAX && PositionOf(avail) > o_.split_at) {
      split_pending_ = true;
    }
    if (split_pending_) {
      const size_t from = PositionOf(0) < o_.split_at && reader_->kind().compression == Compression::kNone
                              ? static_cast<size_t>(o_.split_at - PositionOf(0))
                              : 0;
      const size_t nl = data.find('\n', from);
      if (nl == std::string_view::npos) {
        Take(u, avail, false);
        continue;
      }
      Take(u, nl + 1, false);
      split_pending_ = false;
      val_ = true;
      return true;
    }
    if (u->text.size() + avail >= o_.unit_bytes) {
      // The first cut point at or past the unit's size: just after a
      // newline followed by a letter or digit.
      size_t k = o_.unit_bytes > u->text.size() ? o_.unit_bytes - u->text.size() : 0;
      for (; k < avail; ++k) {
        const bool after_newline = k == 0 ? !u->text.empty() && u->text.back() == '\n' : data[k - 1] == '\n';
        if (after_newline && Alnum(data[k]) && (k > 0 || doc_started_)) break;
      }
      if (k < avail) {
        Take(u, k, false);
        return true;
      }
    }
    Take(u, avail, false);
  }
}

Result<bool> CorpusReader::NextJson(Unit* u) {
  for (;;) {
    size_t scanned = 0, nl;
    for (;;) {
      nl = carry_.find('\n', carry_off_ + scanned);
      if (nl != std::string::npos || eof_) break;
      scanned = carry_.size() - carry_off_;
      OB_RETURN_IF_ERROR(Fill().status());
    }
    const size_t end = nl == std::string::npos ? carry_.size() : nl;
    if (end == carry_off_ && nl == std::string::npos) {
      CloseInput();
      return false;
    }
    const std::string_view line(carry_.data() + carry_off_, end - carry_off_);
    ++line_;
    const size_t consumed = line.size() + (nl == std::string::npos ? 0 : 1);
    const uint64_t line_end = PositionOf(consumed);
    std::string what;
    if (!Blank(line)) {
      Json& j = *json_;
      j.line.assign(line.begin(), line.end());
      j.line.resize(line.size() + simdjson::SIMDJSON_PADDING);
      simdjson::dom::element doc, value;
      std::string_view text;
      simdjson::error_code err = j.parser.parse(j.line.data(), line.size(), false).get(doc);
      if (err == simdjson::UTF8_ERROR) {
        what = "not valid UTF-8";
      } else if (err == simdjson::STRING_ERROR) {
        what = "a bad string (a lone surrogate or a bad escape)";
      } else if (err) {
        what = std::string("malformed JSON (") + simdjson::error_message(err) + ")";
      } else if (doc.type() != simdjson::dom::element_type::OBJECT) {
        what = std::string("not a JSON object but ") + TypeName(doc.type());
      } else if (doc.get_object().at_key(o_.field).get(value)) {
        what = "no \"" + o_.field + "\" field";
      } else if (value.get_string().get(text)) {
        what = "\"" + o_.field + "\" is " + TypeName(value.type()) + ", not a string";
      } else {
        u->pieces.push_back({u->text.size(), text.size(), true, true});
        u->text.append(text);
        ++documents_;
      }
    }
    carry_off_ += consumed;
    carry_pos_ += consumed;
    if (!what.empty()) {
      if (!o_.skip_bad) {
        return Status::DataErr(reader_->name() + ":" + std::to_string(line_) + ": " + what +
                               " (--skip-bad skips such lines)");
      }
      ++skipped_;
    }
    if (!val_ && o_.split_at != UINT64_MAX && line_end > o_.split_at) {
      val_ = true;
      return true;
    }
    if (u->text.size() >= o_.unit_bytes) return true;
  }
}

Result<bool> CorpusReader::Next(Unit* u) {
  u->index = units_;
  u->text.clear();
  u->pieces.clear();
  u->val = val_;
  for (;;) {
    if (!reader_) {
      if (next_input_ == o_.inputs.size()) break;
      OB_RETURN_IF_ERROR(Open());
    }
    OB_ASSIGN_OR_RETURN(bool cut, reader_->kind().json_lines ? NextJson(u) : NextText(u));
    if (!cut) continue;  // the input ended: on with the next one
    if (!u->pieces.empty()) break;
    u->val = val_;  // a split before anything was taken
  }
  if (u->pieces.empty()) return false;
  u->raw_done = raw_done();
  ++units_;
  return true;
}

}  // namespace ob::data
