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
