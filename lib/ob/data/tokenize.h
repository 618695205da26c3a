// Text and JSON Lines → the token files ob-launch trains on (ob-data(1)):
// GPT-2's BPE (bpe.h) or a Hugging Face tokenizer.json (hf_tokenizer.h)
// over the inputs (input.h: text or JSON Lines, plain, gzip or zstd), cut
// into units (corpus.h) that `jobs` threads tokenize while one writes
// them in order: the output is byte for byte the same for any `jobs`, and
// memory is bounded by the units in flight, not by the input.
//
// Outputs: "*.bin" holds little-endian uint16 ids (nanoGPT's train.bin; the
// vocabulary must fit), "*.u32" uint32 ids; ob-launch's --data reads both by
// their suffix (model/data.h). With `megatron`, the output is a prefix and
// the pair PREFIX.bin + PREFIX.idx is Megatron-LM's indexed dataset
// (megatron.h), one sequence a document. Each output is written to a
// temporary file beside it and renamed over it only when everything
// succeeded, so a failed or interrupted run leaves no file that looks
// complete.
//
// The split: the last `val_fraction` of the input bytes (all inputs in
// order) goes to the validation output, from the end of the line (text) or
// document (JSON Lines) it falls in (corpus.h); the rest to the training
// output. Pre-tokens never span the split or an input's end.
//
// Documents: a text input is one; a JSON Lines input one a line. A Hugging
// Face tokenizer starts each with what its encode(text) adds
// (HfTokenizer::prefix(): Llama 3's <|begin_of_text|>, where its template
// or config says so; `bos` forces or drops it); with `eot`, each ends with
// the end-of-text token: GPT-2's "<|endoftext|>", a tokenizer.json's
// eos_token (tokenizer_config.json), or the token named by `eot_token`.
// A Megatron output records where each document ends.
//
// Torch-free. Failure: kUsage for an option mistake (an output suffix that
// is not .bin or .u32, a vocabulary too large for .bin, a split of stdin, a
// BOS or EOS the tokenizer does not have); kNoInput naming an unreadable
// input; kIoErr naming an output that cannot be written; kDataErr naming
// an input that is not what its name says, FILE:LINE of a bad line (unless
// `skip_bad`), or the input where PCRE2 gave up on its text.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ob/data/bpe.h"
#include "ob/data/hf_tokenizer.h"
#include "ob/status.h"

namespace ob::data {

struct TokenizeOptions {
  std::vector<std::string> inputs;  // files; "-" is stdin
  std::string output;               // training (or only) output
  std::string val_output;           // with val_fraction > 0
  double val_fraction = 0;          // in [0, 1)
  bool eot = false;                 // the end-of-text token after each input
  std::string eot_token;            // with eot: that token's content ("": the default above)
  int bos = -1;                     // the prefix: -1 as the tokenizer says, 0 none, 1 BOS at least
  bool split_special_tokens = false;  // special added tokens' text is text (HF's encode_special_tokens)
  std::string field = "text";       // JSON Lines: the document's string
  bool stdin_json_lines = false;    // "-" is JSON Lines (a decompressor's pipe), not text
  bool skip_bad = false;            // JSON Lines: skip (and count) bad lines
  bool megatron = false;            // outputs are Megatron prefixes
  int id_bytes = 0;                 // flat outputs: 2 or 4 bytes an id; 0: as the name says
  int jobs = 1;                     // tokenizing threads
  size_t chunk_bytes = size_t{1} << 20;  // text in a unit (corpus.h)
  // Called after every chunk (cli::ProgressLine decides what to show):
  // bytes read so far, bytes in all (0: not known), tokens written so far.
  std::function<void(uint64_t done, uint64_t total, uint64_t tokens)> progress;
};

struct TokenizeStats {
  uint64_t bytes = 0;
  uint64_t train_tokens = 0;
  uint64_t val_tokens = 0;
  uint64_t documents = 0;
  uint64_t skipped = 0;  // bad lines, with skip_bad
  double seconds = 0;
};

Result<TokenizeStats> Tokenize(const Bpe& bpe, const TokenizeOptions& o);
Result<TokenizeStats> Tokenize(const HfTokenizer& tokenizer, const TokenizeOptions& o);

// The text of a token file (*.bin or *.u32, as above, or a Megatron
// dataset's PREFIX, megatron.h): the bytes of its ids, appended to `out`. kDataErr naming the file for an id the vocabulary does
// not have (with its position) or a size that is not a whole number of ids.
Status Detokenize(const Bpe& bpe, const std::string& path, std::string* out);
// The same for a tokenizer.json: an added token's id gives its content.
Status Detokenize(const HfTokenizer& tokenizer, const std::string& path, std::string* out);

}  // namespace ob::data
