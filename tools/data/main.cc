// ob-data: text → token files (GPT-2's BPE, or a Hugging Face
// tokenizer.json's byte-level BPE), and back.
#include <cstdio>
#include <optional>

#include "ob/cli/cli.h"
#include "ob/cli/progress.h"
#include "ob/data/tokenize.h"
#include "ob/io/file.h"
#include "ob/launch/agent/host.h"
#include "ob/log.h"

namespace {

struct Options {
  std::string vocab, merges, tokenizer;
  std::vector<std::string> inputs;
  std::string val_output;
  double val_fraction = 0;
  bool eot = false;
  std::string eot_token;
  bool bos = false, no_bos = false;
  bool split_special_tokens = false;
  std::string field = "text";
  bool skip_bad = false;
  int jobs = 0;  // 0: the cores this process may use
  std::string format = "flat";
  std::string stdin_kind = "text";
};

Options g;
CLI::App* g_tokenize = nullptr;
CLI::App* g_decode = nullptr;

std::string Mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

// The tokenizer the options name: GPT-2's two files or a tokenizer.json.
struct Loaded {
  std::optional<ob::data::Bpe> bpe;
  std::optional<ob::data::HfTokenizer> hf;
};
ob::Result<Loaded> LoadTokenizer() {
  Loaded t;
  const bool gpt2 = !g.vocab.empty() || !g.merges.empty();
  if (gpt2 == !g.tokenizer.empty()) {
    return ob::Status::Usage("give --tokenizer tokenizer.json, or --vocab FILE and --merges FILE (not both)");
  }
  if (gpt2 && (g.vocab.empty() || g.merges.empty())) {
    return ob::Status::Usage(g.vocab.empty() ? "--merges needs --vocab FILE" : "--vocab needs --merges FILE");
  }
  if (gpt2) {
    OB_ASSIGN_OR_RETURN(t.bpe, ob::data::Bpe::Load(g.vocab, g.merges));
  } else {
    OB_ASSIGN_OR_RETURN(t.hf, ob::data::HfTokenizer::Load(g.tokenizer));
  }
  return t;
}

ob::Status TokenizeCmd(const ob::cli::CommonOptions& common) {
  if (common.output == "-") {
    return ob::Status::Usage("tokenize writes a token file: give -o FILE.bin or -o FILE.u32 (--format megatron: -o PREFIX)");
  }
  OB_ASSIGN_OR_RETURN(Loaded tok, LoadTokenizer());
  ob::data::TokenizeOptions o;
  o.inputs = g.inputs;
  o.output = common.output;
  o.val_output = g.val_output;
  o.val_fraction = g.val_fraction;
  o.eot = g.eot || !g.eot_token.empty();
  o.eot_token = g.eot_token;
  o.bos = g.bos ? 1 : g.no_bos ? 0 : -1;
  o.split_special_tokens = g.split_special_tokens;
  o.field = g.field;
  o.stdin_json_lines = g.stdin_kind == "jsonl";
  o.skip_bad = g.skip_bad;
  o.megatron = g.format == "megatron";
  o.id_bytes = g.format == "u16" ? 2 : g.format == "u32" ? 4 : 0;
  o.jobs = g.jobs > 0 ? g.jobs : ob::launch::UsableCores();
  std::optional<ob::cli::ProgressLine> line;
  if (!common.quiet) {
    line.emplace("ob-data", common.quiet);
    o.progress = [&line](uint64_t done, uint64_t total, uint64_t tokens) {
      std::string what = Mib(done);
      if (total > 0) what += " of " + Mib(total);
      line->Update(static_cast<double>(done), static_cast<double>(total),
                   what + ", " + std::to_string(tokens) + " tokens");
    };
  }
  OB_ASSIGN_OR_RETURN(ob::data::TokenizeStats s,
                      tok.bpe ? ob::data::Tokenize(*tok.bpe, o) : ob::data::Tokenize(*tok.hf, o));
  line.reset();  // cleared from a terminal before the summary
  if (!common.quiet) {
    std::fprintf(stderr, "ob-data: %s, %llu documents → %llu tokens in %s", Mib(s.bytes).c_str(),
                 static_cast<unsigned long long>(s.documents), static_cast<unsigned long long>(s.train_tokens),
                 common.output.c_str());
    if (!g.val_output.empty()) {
      std::fprintf(stderr, ", %llu in %s", static_cast<unsigned long long>(s.val_tokens), g.val_output.c_str());
    }
    std::fprintf(stderr, " (%.1f s, %.1f MB/s, %d threads)\n", s.seconds,
                 s.seconds > 0 ? s.bytes / s.seconds / 1e6 : 0.0, o.jobs);
    if (s.skipped > 0) {
      std::fprintf(stderr, "ob-data: skipped %llu bad lines (--skip-bad)\n", static_cast<unsigned long long>(s.skipped));
    }
  }
  return ob::Status::Ok();
}

ob::Status DecodeCmd(const ob::cli::CommonOptions& common) {
  if (g.inputs.size() != 1) return ob::Status::Usage("decode takes one token file");
  OB_ASSIGN_OR_RETURN(Loaded tok, LoadTokenizer());
  std::string text;
  OB_RETURN_IF_ERROR(tok.bpe ? ob::data::Detokenize(*tok.bpe, g.inputs[0], &text)
                             : ob::data::Detokenize(*tok.hf, g.inputs[0], &text));
  return ob::io::WriteFile(common.output, text);
}

ob::Status Run(const ob::cli::CommonOptions& common) {
  if (g_tokenize->parsed()) return TokenizeCmd(common);
  if (g_decode->parsed()) return DecodeCmd(common);
  return ob::Status::Usage("no command: give tokenize or decode");
}

CLI::App* Command(CLI::App& app, const char* name, const char* what, const char* inputs) {
  CLI::App* sub = ob::cli::AddCommand(app, name, what);
  sub->add_option("--tokenizer", g.tokenizer,
                  "A Hugging Face tokenizer.json of byte-level BPE (Llama 3, Qwen3, GPT-2); "
                  "tokenizer_config.json beside it, if any, names BOS and EOS")
      ->option_text("FILE");
  sub->add_option("--vocab", g.vocab, "GPT-2's vocab.json (or encoder.json): {\"token\": id}")->option_text("FILE");
  sub->add_option("--merges", g.merges, "GPT-2's merges.txt (or vocab.bpe): one merge a line, in rank order")
      ->option_text("FILE");
  sub->add_option("FILE", g.inputs, inputs)->required()->option_text(" ");
  return sub;
}

void Setup(CLI::App& app) {
  app.require_subcommand(0, 1);
  g_tokenize = Command(app, "tokenize",
                       "Text or JSON Lines to a token file (-o FILE.bin: uint16 ids, FILE.u32: uint32; "
                       "--format megatron: -o PREFIX)",
                       "Inputs, in order: text, or JSON Lines (*.jsonl, *.json, *.ndjson), each plain, .gz or "
                       ".zst; - for stdin (text)");
  g_tokenize->add_option("--field", g.field, "JSON Lines: the field holding each document's text (default text)")
      ->option_text("NAME");
  g_tokenize->add_flag("--skip-bad", g.skip_bad,
                       "JSON Lines: skip lines that are not an object with a string --field, and count them "
                       "(default: stop at the first, exit 65)");
  g_tokenize->add_option("-j,--jobs", g.jobs,
                         "Tokenize on N threads (default: the cores this process may use); the output is the same "
                         "for any N")
      ->option_text("N")
      ->check(CLI::PositiveNumber);
  g_tokenize->add_option("--stdin", g.stdin_kind,
                         "What - (standard input) holds: text (the default) or jsonl, e.g. from a decompressor: "
                         "zstdcat x.jsonl.zst | ob-data tokenize --stdin jsonl - ...")
      ->option_text("text|jsonl")
      ->check(CLI::IsMember({"text", "jsonl"}));
  g_tokenize->add_option("--format", g.format,
                         "flat: the ids alone, their width by -o's name (FILE.bin: uint16, FILE.u32: uint32); "
                         "u16, u32: the ids alone, that wide, whatever -o's name (a pipe); megatron: Megatron-LM's "
                         "indexed dataset, PREFIX.bin + PREFIX.idx, one sequence a document")
      ->option_text("flat|u16|u32|megatron")
      ->check(CLI::IsMember({"flat", "u16", "u32", "megatron"}));
  g_tokenize->add_option("--val-fraction", g.val_fraction,
                         "Send the last F of the input bytes (from the end of the line it falls in) to --val-output")
      ->option_text("F")
      ->check(ob::cli::NonNegative())  // CLI::Range lets NaN through
      ->check(CLI::Range(0.0, 0.999999));
  g_tokenize->add_option("--val-output", g.val_output, "The validation split's token file")->option_text("FILE");
  g_tokenize->add_flag("--eot", g.eot,
                       "End each document (a text input, a JSON line) with the end-of-text token: GPT-2's <|endoftext|>, "
                       "tokenizer_config.json's eos_token");
  g_tokenize->add_option("--eot-token", g.eot_token, "--eot with this token instead (its text, e.g. '<|endoftext|>')")
      ->option_text("TOKEN");
  auto* bos = g_tokenize->add_flag("--bos", g.bos,
                                   "Start each document with the BOS token even where the tokenizer adds none "
                                   "(tokenizer_config.json's bos_token)");
  auto* no_bos = g_tokenize->add_flag("--no-bos", g.no_bos,
                                      "Start each document with no BOS, where the tokenizer's template or "
                                      "add_bos_token adds one");
  bos->excludes(no_bos);
  g_tokenize->add_flag("--split-special-tokens", g.split_special_tokens,
                       "Tokenize special tokens' text in the input as text (default: it becomes their ids, "
                       "as HF's encode)");
  g_decode = Command(app, "decode", "A token file back to text (-o FILE, or stdout)",
                     "A token file (*.bin or *.u32), or a Megatron dataset's PREFIX");
  app.footer(
      "Each command has its own --help, e.g. 'ob-data tokenize --help'.\n"
      "Examples:\n"
      "  ob-data tokenize --vocab vocab.json --merges merges.txt --eot \\\n"
      "      corpus/*.txt --val-fraction 0.01 --val-output val.bin -o train.bin\n"
      "  ob-launch --data train.bin ...\n"
      "  ob-data decode --vocab vocab.json --merges merges.txt val.bin | head\n"
      "  ob-data tokenize --tokenizer Llama-3.1-8B/tokenizer.json --eot corpus/*.txt -o train.u32\n"
      "  ob-data tokenize --tokenizer tokenizer.json --eot pile/*.jsonl.zst --format megatron -o pile_text");
}

}  // namespace

int main(int argc, char** argv) {
  return ob::cli::Main(
      argc, argv,
      {"data", "Turn text into token files with GPT-2's or a Hugging Face tokenizer's BPE, and back.", Setup, Run,
       nullptr,
       [] {
         std::vector<ob::cli::NamedFile> reads{
             {"--vocab", g.vocab}, {"--merges", g.merges}, {"--tokenizer", g.tokenizer}};
         for (const std::string& in : g.inputs) reads.push_back({"an input", in});
         return reads;
       },
       [] { return std::vector<ob::cli::NamedFile>{{"--val-output", g.val_output}}; }});
}
