// GPT-2's byte-level BPE (data/bpe.h) and ob-data's file work
// (data/tokenize.h) on small hand-made vocabularies. The comparison with an
// independent implementation on GPT-2's real vocabulary is
// tests/cli/data_bpe.sh.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "ob/data/bpe.h"
#include "ob/data/tokenize.h"
#include "ob/io/file.h"
#include "ob/io/json.h"

namespace {

using ob::data::Bpe;

struct TempDir {
  std::string path;
  TempDir() {
    char t[] = "/tmp/ob-bpe-test.XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() { (void)std::system(("rm -rf '" + path + "'").c_str()); }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

void Write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// GPT-2's published byte alphabet: printable Latin-1 bytes stand for
// themselves, the others for 256, 257, ... in byte order.
std::string Spell(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) {
    uint32_t cp = b, next = 256;
    for (uint32_t c = 0; c < b; ++c) {
      const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
      if (!printable) ++next;
    }
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    if (!printable) cp = next;
    ob::io::AppendUtf8(&out, cp);
  }
  return out;
}

// A vocabulary of the 256 bytes (ids 0..255, in byte order), then the
// results of `merges` in order, then <|endoftext|>; and its merges.txt.
struct Vocab {
  std::string vocab, merges;
  std::map<std::string, uint32_t> id;
};
Vocab MakeVocab(const TempDir& dir, const std::vector<std::pair<std::string, std::string>>& merges) {
  Vocab v;
  v.vocab = dir / "vocab.json";
  v.merges = dir / "merges.txt";
  std::string json = "{";
  auto add = [&](const std::string& bytes) {
    if (v.id.count(bytes)) return;
    const uint32_t id = static_cast<uint32_t>(v.id.size());
    v.id[bytes] = id;
    if (json.size() > 1) json += ", ";
    ob::io::AppendJsonString(&json, Spell(bytes));
    json += ": " + std::to_string(id);
  };
  for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)));
  std::string lines = "#version: 0.2\n";
  for (const auto& [a, b] : merges) {
    add(a + b);
    lines += Spell(a) + " " + Spell(b) + "\n";
  }
  add("<|endoftext|>");
  Write(v.vocab, json + "}");
  Write(v.merges, lines);
  return v;
}

std::vector<std::string> Pieces(const std::string& text) {
  std::vector<std::string> out;
  ob::data::PreTokenize(text, true, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

using Strings = std::vector<std::string>;

}  // namespace

TEST_CASE("pre-tokens follow GPT-2's pattern") {
  CHECK(Pieces("I'll go") == Strings{"I", "'ll", " go"});
  CHECK(Pieces("we've they're it's 'd 'x") == Strings{"we", "'ve", " they", "'re", " it", "'s", " '", "d", " '", "x"});
  CHECK(Pieces("a   b") == Strings{"a", "  ", " b"});
  CHECK(Pieces("x\n\ny") == Strings{"x", "\n", "\n", "y"});
  CHECK(Pieces(" 123abc 4.5") == Strings{" 123", "abc", " 4", ".", "5"});
  CHECK(Pieces("hello!!! world?!") == Strings{"hello", "!!!", " world", "?!"});
  CHECK(Pieces("end  ") == Strings{"end", "  "});
  CHECK(Pieces("Straße café") == Strings{"Straße", " café"});
  CHECK(Pieces("नमस्ते") == Strings{"नमस", "्", "त", "े"});  // vowel signs are marks, not letters
  CHECK(Pieces("\xff\xfe ok") == Strings{"\xff\xfe", " ok"});  // invalid UTF-8: "other" bytes
}

TEST_CASE("pre-tokens do not depend on where the text is cut") {
  const std::string text = "I'll  be\n\n\t back at 10:30, ça va? 🚀🚀 'll'   \n end";
  const Strings whole = Pieces(text);
  for (size_t cut = 1; cut < 4; ++cut) {
    // Feed `cut` bytes at a time, keeping what PreTokenize leaves.
    Strings got;
    std::string pending;
    for (size_t i = 0; i < text.size(); i += cut) {
      pending += text.substr(i, cut);
      const size_t used = ob::data::PreTokenize(pending, false, [&](std::string_view p) { got.emplace_back(p); });
      pending.erase(0, used);
    }
    ob::data::PreTokenize(pending, true, [&](std::string_view p) { got.emplace_back(p); });
    INFO("cut " << cut);
    CHECK(got == whole);
  }
}

TEST_CASE("merges apply lowest rank first, every occurrence left to right") {
  TempDir dir;
  auto v = MakeVocab(dir, {{"l", "l"}, {"h", "e"}, {"he", "ll"}, {"hell", "o"}, {"a", "a"}, {"aa", "a"}});
  auto bpe = Bpe::Load(v.vocab, v.merges);
  REQUIRE(bpe.ok());
  std::vector<uint32_t> ids;
  bpe->EncodeWord("hello", &ids);
  CHECK(ids == std::vector<uint32_t>{v.id["hello"]});
  ids.clear();
  bpe->EncodeWord("aaaaa", &ids);  // aa aa a, then (aa a) at the end only
  CHECK(ids == std::vector<uint32_t>{v.id["aa"], v.id["aaa"]});
  ids.clear();
  bpe->EncodeWord("xyz", &ids);
  CHECK(ids == std::vector<uint32_t>{'x', 'y', 'z'});
  CHECK(bpe->Id("<|endoftext|>") == static_cast<int64_t>(v.id["<|endoftext|>"]));
  CHECK(bpe->Bytes(v.id["hello"]) == "hello");

  // The streaming encoder gives the same ids however the bytes come.
  const std::string text = "hello  hello\nhellohello aaa 'll\n";
  ob::data::Encoder whole(*bpe);
  whole.Add(text);
  whole.End();
  ob::data::Encoder bytewise(*bpe, /*cache_words=*/2);
  for (char c : text) bytewise.Add(std::string_view(&c, 1));
  bytewise.End();
  CHECK(bytewise.ids() == whole.ids());
  CHECK(bytewise.pending() == 0);
}

TEST_CASE("ob-data tokenize: token files, the split at a line, nothing left by a failure") {
  TempDir dir;
  auto v = MakeVocab(dir, {{"h", "e"}, {"l", "l"}});
  auto bpe = Bpe::Load(v.vocab, v.merges);
  REQUIRE(bpe.ok());
  std::string a, b;
  for (int i = 0; i < 50; ++i) a += "line " + std::to_string(i) + " hello\n";
  for (int i = 0; i < 50; ++i) b += "more " + std::to_string(i) + "\n";
  Write(dir / "a.txt", a);
  Write(dir / "b.txt", b);
  ob::data::TokenizeOptions o;
  o.inputs = {dir / "a.txt", dir / "b.txt"};
  o.output = dir / "train.bin";
  o.val_output = dir / "val.u32";
  o.val_fraction = 0.1;
  o.chunk_bytes = 7;  // pre-tokens and the split cross chunks
  auto s = ob::data::Tokenize(*bpe, o);
  REQUIRE(s.ok());
  CHECK(s->bytes == a.size() + b.size());
  std::string train, val;
  REQUIRE(ob::data::Detokenize(*bpe, dir / "train.bin", &train).ok());
  REQUIRE(ob::data::Detokenize(*bpe, dir / "val.u32", &val).ok());
  CHECK(train + val == a + b);
  CHECK(train.back() == '\n');  // cut at the end of a line
  CHECK(val.size() <= (a.size() + b.size()) / 10);
  CHECK(val.size() + 10 > (a.size() + b.size()) / 10);
  CHECK(s->train_tokens * 2 == ob::io::ReadFile(dir / "train.bin")->size());
  CHECK(s->val_tokens * 4 == ob::io::ReadFile(dir / "val.u32")->size());

  // --eot: each input ends with <|endoftext|>.
  o.val_fraction = 0;
  o.val_output.clear();
  o.eot = true;
  o.output = dir / "eot.bin";
  REQUIRE(ob::data::Tokenize(*bpe, o).ok());
  std::string with_eot;
  REQUIRE(ob::data::Detokenize(*bpe, dir / "eot.bin", &with_eot).ok());
  CHECK(with_eot == a + "<|endoftext|>" + b + "<|endoftext|>");

  // An unreadable input after a good one: an error naming it, and no
  // output file (not even the temporary one).
  o.inputs = {dir / "a.txt", dir / "missing.txt"};
  o.output = dir / "failed.bin";
  auto failed = ob::data::Tokenize(*bpe, o);
  CHECK(failed.status().code() == ob::Code::kNoInput);
  CHECK_THAT(failed.status().message(), Catch::Contains("missing.txt"));
  CHECK(access((dir / "failed.bin").c_str(), F_OK) != 0);
  CHECK(std::system(("test -z \"$(ls '" + dir.path + "' | grep partial)\"").c_str()) == 0);

  // Option mistakes, before anything is written.
  o.inputs = {dir / "a.txt"};
  o.output = dir / "tokens.txt";
  CHECK(ob::data::Tokenize(*bpe, o).status().code() == ob::Code::kUsage);
  o.output = dir / "x.bin";
  o.inputs = {"-"};
  o.val_fraction = 0.5;
  o.val_output = dir / "v.bin";
  auto piped = ob::data::Tokenize(*bpe, o);
  CHECK(piped.status().code() == ob::Code::kUsage);
  CHECK_THAT(piped.status().message(), Catch::Contains("stdin"));
}

TEST_CASE("a vocabulary or merges file that is not GPT-2's is refused, naming the file and place") {
  TempDir dir;
  auto v = MakeVocab(dir, {{"h", "e"}});
  Write(dir / "bad.json", "{\"a\": 1,");
  auto bad = Bpe::Load(dir / "bad.json", v.merges);
  CHECK(bad.status().code() == ob::Code::kDataErr);
  CHECK_THAT(bad.status().message(), Catch::Contains("bad.json") && Catch::Contains("not a vocabulary"));
  Write(dir / "few.json", "{\"a\": 0, \"b\": 1}");
  auto few = Bpe::Load(dir / "few.json", v.merges);
  CHECK_THAT(few.status().message(), Catch::Contains("has no token of its own"));
  Write(dir / "m.txt", "#version: 0.2\nh e\nq z\n");
  auto unknown = Bpe::Load(v.vocab, dir / "m.txt");
  CHECK(unknown.status().code() == ob::Code::kDataErr);
  CHECK_THAT(unknown.status().message(), Catch::Contains("m.txt:3") && Catch::Contains("into a token"));
  Write(dir / "m2.txt", "h e x\n");
  CHECK_THAT(Bpe::Load(v.vocab, dir / "m2.txt").status().message(), Catch::Contains("m2.txt:1"));
  CHECK(Bpe::Load(dir / "none.json", v.merges).status().code() == ob::Code::kNoInput);
}

// --- Hugging Face tokenizer.json (data/hf_tokenizer.h) -----------------------
// The comparison with an independent implementation on Llama 3's and Qwen3's
// real files is tests/cli/data_hf_tokenizer.sh.

namespace {

using ob::data::HfEncoder;
using ob::data::HfTokenizer;
using Ids = std::vector<uint32_t>;

// A tokenizer.json: the 256 bytes (ids 0..255 in byte order), then `extra`
// tokens (ids from 256), `merges` as "a b" strings or [a, b] pairs, and the
// added tokens <s> (256 + extra, special), <x> and <xy> (non-special). The
// other parts are JSON given as they are.
struct HfSpec {
  std::vector<std::string> extra;
  std::vector<std::pair<std::string, std::string>> merges;
  bool pairs = false;
  bool ignore_merges = false;
  std::string normalizer = "null";
  std::string pre_tokenizer =
      R"({"type": "Sequence", "pretokenizers": [)"
      R"({"type": "Split", "pattern": {"Regex": "\\p{N}+|\\s+"}, "behavior": "Isolated", "invert": false},)"
      R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]})";
  std::string post_processor = "null";
  std::string added_flags = R"("single_word": false, "lstrip": false, "rstrip": false, "normalized": false)";
};

std::string Json(const std::string& s) {
  std::string out;
  ob::io::AppendJsonString(&out, s);
  return out;
}

std::string HfJson(const HfSpec& s) {
  std::string vocab;
  uint32_t id = 0;
  auto token = [&](const std::string& bytes) {
    if (id > 0) vocab += ", ";
    vocab += Json(Spell(bytes)) + ": " + std::to_string(id);
    ++id;
  };
  for (int b = 0; b < 256; ++b) token(std::string(1, static_cast<char>(b)));
  for (const std::string& t : s.extra) token(t);
  std::string merges;
  for (const auto& [a, b] : s.merges) {
    if (!merges.empty()) merges += ", ";
    merges += s.pairs ? "[" + Json(Spell(a)) + ", " + Json(Spell(b)) + "]" : Json(Spell(a) + " " + Spell(b));
  }
  std::string added;
  for (const char* t : {"<s>", "<x>", "<xy>"}) {
    if (!added.empty()) added += ", ";
    added += R"({"id": )" + std::to_string(id++) + R"(, "content": )" + Json(t) + ", " + s.added_flags +
             R"(, "special": )" + (std::string(t) == "<s>" ? "true" : "false") + "}";
  }
  return R"({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [)" + added +
         R"(], "normalizer": )" + s.normalizer + R"(, "pre_tokenizer": )" + s.pre_tokenizer +
         R"(, "post_processor": )" + s.post_processor +
         R"(, "decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", "dropout": null, "unk_token": null,)"
         R"( "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false,)"
         R"( "ignore_merges": )" + (s.ignore_merges ? "true" : "false") + R"(, "vocab": {)" + vocab +
         R"(}, "merges": [)" + merges + "]}}";
}

HfTokenizer Hf(const HfSpec& s, const std::string& config = "") {
  auto t = HfTokenizer::Parse(HfJson(s), "tokenizer.json", config, "tokenizer_config.json");
  INFO(t.status().message());
  REQUIRE(t.ok());
  return std::move(*t);
}

// The ids of `text` as one document; also fed a byte at a time, which must
// give the same ids.
Ids Encode(const HfTokenizer& t, const std::string& text, bool split_special = false) {
  HfEncoder whole(t, split_special);
  whole.Add(text);
  whole.End();
  HfEncoder bytewise(t, split_special, /*cache_words=*/3);
  for (char c : text) bytewise.Add(std::string_view(&c, 1));
  bytewise.End();
  CHECK(bytewise.ids() == whole.ids());
  CHECK(bytewise.pending() == 0);
  return whole.ids();
}

Ids Bytes(const std::string& s) {
  Ids out;
  for (unsigned char c : s) out.push_back(c);
  return out;
}

}  // namespace

TEST_CASE("tokenizer.json: ignore_merges emits a pre-token in the vocabulary whole") {
  HfSpec s;
  s.extra = {"ab", "abc"};  // "abc" is in the vocabulary, but no merge makes it
  s.merges = {{"a", "b"}};
  const HfTokenizer plain = Hf(s);
  CHECK(Encode(plain, "abc") == Ids{256, 'c'});
  s.ignore_merges = true;
  const HfTokenizer ignoring = Hf(s);
  CHECK(Encode(ignoring, "abc") == Ids{257});
  CHECK(Encode(ignoring, "abcd") == Ids{256, 'c', 'd'});  // not in the vocabulary: merged as usual
}

TEST_CASE("tokenizer.json: merges as strings and as pairs are the same merges") {
  HfSpec s;
  s.extra = {"he", "ll", "hell", "hello"};
  s.merges = {{"l", "l"}, {"h", "e"}, {"he", "ll"}, {"hell", "o"}};
  const Ids strings = Encode(Hf(s), "hello hell");
  s.pairs = true;
  CHECK(Encode(Hf(s), "hello hell") == strings);
  CHECK(strings == Ids{259, ' ', 258});
}

TEST_CASE("tokenizer.json: Split's Isolated makes the gaps between matches pre-tokens too") {
  HfSpec s;
  s.extra = {"b1", "ab", "2c"};
  s.merges = {{"b", "1"}, {"a", "b"}, {"2", "c"}};  // b1 and 2c would cross a pre-token's edge
  const HfTokenizer t = Hf(s);
  // Pre-tokens "ab", "12", "cd", " ", "x": no merge across them.
  CHECK(Encode(t, "ab12cd x") == Ids{257, '1', '2', 'c', 'd', ' ', 'x'});
  s.pre_tokenizer.replace(s.pre_tokenizer.find("Isolated"), 8, "Removed");
  CHECK(Encode(Hf(s), "ab12cd x") == Ids{257, 'c', 'd', 'x'});
}

TEST_CASE("tokenizer.json: added tokens are cut out first, longest first, before the normalizer and the regex") {
  HfSpec s;
  s.normalizer = R"({"type": "NFC"})";
  const HfTokenizer t = Hf(s);
  const uint32_t bos = 256, x = 257, xy = 258;
  CHECK(Encode(t, "a<s>b") == Ids{'a', bos, 'b'});
  CHECK(Encode(t, "<xy><x><x") == (Ids{xy, x, '<', 'x'}));
  CHECK(Encode(t, "<<s>>") == Ids{'<', bos, '>'});
  CHECK(Encode(t, "1<s>2") == Ids{'1', bos, '2'});  // the regex's "\p{N}+" does not see "12"
  // split_special_tokens: <s> (special) is text, <x> (not special) is still cut out.
  Ids text = Bytes("a<s>");
  text.push_back(x);
  CHECK(Encode(t, "a<s><x>", /*split_special=*/true) == text);
  // NFC: "e" + U+0301 is "é"; the bytes of it, and nothing of the
  // decomposed form.
  CHECK(Encode(t, "e\xcc\x81 <s>e\xcc\x81") == (Ids{0xC3, 0xA9, ' ', bos, 0xC3, 0xA9}));
  CHECK(t.Bytes(bos) == "<s>");
  CHECK(t.Bytes('a') == "a");
  CHECK(t.vocab_size() == 259);
}

TEST_CASE("tokenizer.json: what is not supported is refused in one line naming the file and the field") {
  auto refused = [](const HfSpec& s) {
    auto t = HfTokenizer::Parse(HfJson(s), "dir/tokenizer.json", "", "");
    CHECK(t.status().code() == ob::Code::kDataErr);
    CHECK(t.status().message().find('\n') == std::string::npos);
    CHECK_THAT(t.status().message(), Catch::StartsWith("dir/tokenizer.json: "));
    return t.status().message();
  };
  HfSpec s;
  s.normalizer = R"({"type": "Lowercase"})";
  CHECK_THAT(refused(s), Catch::Contains("normalizer \"Lowercase\" is not supported"));
  s = HfSpec();
  s.added_flags = R"("single_word": false, "lstrip": true, "rstrip": false, "normalized": false)";
  CHECK_THAT(refused(s), Catch::Contains("added_tokens[0] (\"<s>\"): lstrip true is not supported"));
  s = HfSpec();
  s.pre_tokenizer.replace(s.pre_tokenizer.find("\\\\p{N}+"), 8, "\\\\w+");
  CHECK_THAT(refused(s), Catch::Contains("pre_tokenizer.pretokenizers[0].pattern") && Catch::Contains("\\w"));
  s = HfSpec();
  s.pre_tokenizer.replace(s.pre_tokenizer.find("Isolated"), 8, "MergedWithNext");
  CHECK_THAT(refused(s), Catch::Contains("behavior \"MergedWithNext\" is not supported"));
  s = HfSpec();
  s.post_processor = R"({"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}},)"
                     R"( {"SpecialToken": {"id": "<s>", "type_id": 0}}], "special_tokens": {}})";
  CHECK_THAT(refused(s), Catch::Contains("post_processor.single adds tokens after $A"));
  auto broken = HfTokenizer::Parse("{\"model\": {\"vocab\": {\"a\": 1,}}}", "t.json", "", "");
  CHECK_THAT(broken.status().message(), Catch::StartsWith("t.json: not JSON (") && Catch::Contains("at byte"));
  auto unigram = HfTokenizer::Parse(R"({"model": {"type": "Unigram", "vocab": []}})", "u.json", "", "");
  CHECK_THAT(unigram.status().message(), Catch::Contains("model.type \"Unigram\" is not supported"));
}

TEST_CASE("tokenizer.json: BOS from the template or the config, EOS from the config, in ob-data's token files") {
  HfSpec s;
  s.post_processor = R"({"type": "Sequence", "processors": [{"type": "ByteLevel"}, {"type": "TemplateProcessing",)"
                     R"( "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},)"
                     R"( {"Sequence": {"id": "A", "type_id": 0}}],)"
                     R"( "special_tokens": {"<s>": {"id": "<s>", "ids": [256], "tokens": ["<s>"]}}}]})";
  const HfTokenizer t = Hf(s, R"({"bos_token": "<s>", "eos_token": {"content": "<x>"}, "add_bos_token": false})");
  CHECK(t.prefix() == Ids{256});
  CHECK(t.bos_id() == 256);
  CHECK(t.eos_id() == 257);
  HfSpec plain;
  CHECK(Hf(plain, R"({"bos_token": "<s>", "add_bos_token": true})").prefix() == Ids{256});
  CHECK(Hf(plain, R"({"bos_token": "<s>"})").prefix().empty());
  auto unknown =
      HfTokenizer::Parse(HfJson(plain), "tokenizer.json", R"({"eos_token": "</s>"})", "dir/tokenizer_config.json");
  CHECK_THAT(unknown.status().message(),
             Catch::StartsWith("dir/tokenizer_config.json: eos_token \"</s>\" is not a token"));

  TempDir dir;
  Write(dir / "a.txt", "12 ab");
  Write(dir / "b.txt", "3");
  ob::data::TokenizeOptions o;
  o.inputs = {dir / "a.txt", dir / "b.txt"};
  o.output = dir / "t.bin";
  o.eot = true;
  o.chunk_bytes = 2;
  REQUIRE(ob::data::Tokenize(t, o).ok());
  std::string text;
  REQUIRE(ob::data::Detokenize(t, dir / "t.bin", &text).ok());
  CHECK(text == "<s>12 ab<x><s>3<x>");
  o.bos = 0;
  o.eot_token = "<xy>";
  REQUIRE(ob::data::Tokenize(t, o).ok());
  text.clear();
  REQUIRE(ob::data::Detokenize(t, dir / "t.bin", &text).ok());
  CHECK(text == "12 ab<xy>3<xy>");
  o.eot_token = "</s>";
  CHECK(ob::data::Tokenize(t, o).status().code() == ob::Code::kUsage);
}

TEST_CASE("the Split regex: white space as Oniguruma has it, streaming, refusals") {
  using ob::data::SplitRegex;
  auto re = SplitRegex::Compile("\\s+(?!\\S)|\\s+|(?i:'s|'ll)|\\p{N}{1,3}", false);
  REQUIRE(re.ok());
  SplitRegex::Matcher m(*re);
  size_t start = 0, end = 0;
  // U+180E is White_Space no more (PCRE2's \s keeps it); U+0085 is.
  CHECK(m.Next("a\xe1\xa0\x8e b", 0, true, &start, &end) == SplitRegex::Found::kMatch);
  CHECK(start == 4);
  CHECK(m.Next("a\xc2\x85", 0, true, &start, &end) == SplitRegex::Found::kMatch);
  CHECK(start == 1);
  CHECK(m.Next("x'LL", 0, true, &start, &end) == SplitRegex::Found::kMatch);
  CHECK(end == 4);
  // More bytes could lengthen "12" or the spaces: it waits; "123" is final.
  CHECK(m.Next("a12", 0, false, &start, &end) == SplitRegex::Found::kMore);
  CHECK(m.Next("a123", 0, false, &start, &end) == SplitRegex::Found::kMatch);
  CHECK(m.Next("a  ", 0, false, &start, &end) == SplitRegex::Found::kMore);
  CHECK(m.Next("abc", 0, false, &start, &end) == SplitRegex::Found::kNone);
  CHECK(m.Next("\xff 1", 0, true, &start, &end) == SplitRegex::Found::kMatch);  // not UTF-8: matches nothing
  CHECK(start == 1);
  for (const char* bad : {"\\w+", "^a", "(?<=a)b", "a*", "[[a]]", "[\\S]"}) {
    INFO(bad);
    CHECK(SplitRegex::Compile(bad, false).status().code() == ob::Code::kDataErr);
  }
}
