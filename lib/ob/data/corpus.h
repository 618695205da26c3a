// The inputs of ob-data tokenize cut into units that tokenize apart
// (ob-data(1)): what lets -j N threads tokenize one corpus and still write,
// byte for byte, what one thread writes. Torch-free.
//
// Documents. A JSON Lines input (input.h) holds one document a line: the
// string `field` of a JSON object. Lines that are empty or only white
// space are skipped; any other line that is not such an object (malformed
// JSON, not an object, no such field, not a string, invalid UTF-8 or a
// lone surrogate in a string) is kDataErr "FILE:LINE: what", or, with
// skip_bad, skipped and counted. A text input is one document, checked
// as UTF-8 (input.h's TextCheck).
//
// Units. A unit holds whole documents, or a part of a long text document
// that ends at a pre-token boundary: just after a newline that is followed
// by an ASCII letter or digit (no pre-token of GPT-2's, Llama 3's or
// Qwen's pattern spans that point). Each unit holds about `unit_bytes` of
// text: documents are added until it holds that much; a text document is
// cut at the first such point past it. So a unit's ids do not depend on
// the units before it, and the cuts do not depend on the threads.
//
// The validation split (val_fraction): the document (JSON Lines) or line
// (text) in which the input bytes pass the split point ends the training
// part; everything after goes to validation. The split point is a byte
// offset over all inputs, as stored (compressed bytes for a compressed
// input, whose point is then the end of the piece that passes it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ob/data/input.h"
#include "ob/status.h"

namespace ob::data {

struct Unit {
  // A run of text in one document.
  struct Piece {
    size_t begin = 0, size = 0;  // in text
    bool starts_doc = false;     // the document's first bytes: its prefix (BOS) goes first
    bool ends_doc = false;       // its last: its end-of-text follows
  };
  uint64_t index = 0;  // 0, 1, ... in input order
  std::string text;
  std::vector<Piece> pieces;
  bool val = false;           // the validation output's
  uint64_t raw_done = 0;      // input bytes read when the unit was cut
};

struct CorpusOptions {
  std::vector<std::string> inputs;  // "-": stdin (text)
  std::string field = "text";       // JSON Lines: the document's string
  bool stdin_json_lines = false;    // "-" is JSON Lines, not text
  bool skip_bad = false;
  uint64_t split_at = UINT64_MAX;   // input byte where validation starts
  size_t unit_bytes = size_t{1} << 20;
};

class CorpusReader {
 public:
  explicit CorpusReader(CorpusOptions o);
  ~CorpusReader();
  // Fills *u with the next unit; false after the last. Errors as above, and
  // input.h's.
  Result<bool> Next(Unit* u);
  uint64_t skipped() const { return skipped_; }    // bad lines, with skip_bad
  uint64_t documents() const { return documents_; }
  uint64_t raw_done() const { return raw_before_ + (reader_ ? reader_->raw_bytes() : 0); }

 private:
  struct Json;
  Status Open();
  Result<bool> Fill();  // reads more of the current input into carry_; false at its end
  Result<bool> NextText(Unit* u);
  Result<bool> NextJson(Unit* u);
  void CloseInput();
  // Moves carry_[carry_off_, +n) to the unit as part of the open document.
  void Take(Unit* u, size_t n, bool ends_doc);
  // The input position of carry_[carry_off_ + k] (exact for an
  // uncompressed input; the end of its piece for a compressed one).
  uint64_t PositionOf(size_t k) const;

  CorpusOptions o_;
  size_t next_input_ = 0;
  std::unique_ptr<ByteReader> reader_;
  uint64_t raw_before_ = 0;   // raw bytes of the inputs before this one
  std::string carry_;         // read, not yet in a unit
  size_t carry_off_ = 0;
  uint64_t carry_pos_ = 0;    // input position of carry_[carry_off_] (exact inputs)
  bool doc_started_ = false;  // the current text document has bytes in a unit
  bool eof_ = false;          // the current input has no more bytes
  bool split_pending_ = false;  // text: cut at the next newline, then validation
  bool val_ = false;
  TextCheck check_;
  uint64_t line_ = 0;  // JSON Lines: lines taken from the current input
  uint64_t skipped_ = 0, documents_ = 0, units_ = 0;
  std::unique_ptr<Json> json_;
};

}  // namespace ob::data
