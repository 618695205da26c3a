// TokenSource: token file formats, deterministic sampling, bad files.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ob/io/file.h"
#include "ob/log.h"
#include "ob/model/data.h"
#include "ob/model/scan_cache.h"

using ob::Code;
using ob::model::TokenFormat;
using ob::model::ScanCache;
using ob::model::ScanEntry;
using ob::model::TokenSource;

namespace {

struct TempData {
  std::string path;
  TempData(const std::string& name, const void* bytes, size_t n) {
    path = "/tmp/ob_data_test_" + std::to_string(getpid()) + "_" + name;
    std::ofstream out(path, std::ios::binary);
    out.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
  }
  ~TempData() { std::remove(path.c_str()); }
};

struct CacheDir {
  std::string path;
  CacheDir() {
    char tmpl[] = "/tmp/ob_scan_cache_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~CacheDir() { ob::io::RemoveTree(path); }
};

struct stat Stat(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st;
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

template <typename T>
std::vector<T> Ramp(size_t n, T mod) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>((i * 7 + 3) % mod);
  return v;
}

// Every window must be a contiguous slice of the source, y shifted by one.
void CheckWindow(const TokenSource& src, uint64_t seed, uint64_t step, uint64_t i, int s) {
  std::vector<int64_t> x(s), y(s);
  src.Sample(seed, step, i, s, x.data(), y.data());
  const size_t off = src.Offset(seed, step, i, s);
  REQUIRE(off + s < src.size());
  for (int j = 0; j < s; ++j) {
    CHECK(x[j] == src.at(off + j));
    CHECK(y[j] == src.at(off + j + 1));
  }
}

}  // namespace

TEST_CASE("u16 u32 and text files round trip", "[data]") {
  auto u16 = Ramp<uint16_t>(1000, 50257);
  u16[500] = 50256;
  TempData f16("tokens.bin", u16.data(), u16.size() * 2);
  auto a = TokenSource::Open(f16.path);
  REQUIRE(a.ok());
  CHECK(a->format() == TokenFormat::kU16);
  REQUIRE(a->size() == 1000);
  for (size_t i = 0; i < u16.size(); ++i) REQUIRE(a->at(i) == u16[i]);
  CHECK(a->max_token() == 50256);
  CheckWindow(*a, 1, 2, 3, 16);

  auto u32 = Ramp<uint32_t>(300, 100000);
  TempData f32("tokens.u32", u32.data(), u32.size() * 4);
  auto b = TokenSource::Open(f32.path);
  REQUIRE(b.ok());
  CHECK(b->format() == TokenFormat::kU32);
  REQUIRE(b->size() == 300);
  for (size_t i = 0; i < u32.size(); ++i) REQUIRE(b->at(i) == u32[i]);
  CHECK(b->max_token() == 299 * 7 + 3);
  CheckWindow(*b, 9, 0, 0, 8);

  const std::string text = "the quick brown fox jumps over the lazy dog\n";
  TempData ft("notes.txt", text.data(), text.size());
  auto c = TokenSource::Open(ft.path);
  REQUIRE(c.ok());
  CHECK(c->format() == TokenFormat::kText);
  REQUIRE(c->size() == text.size());
  CHECK(c->at(4) == 'q');
  CHECK(c->max_token() == 'z');
  CheckWindow(*c, 0, 5, 1, 10);
  CHECK(c->Check(10, 256).ok());

  // A .bin can be forced to text: two bytes per uint16.
  auto d = TokenSource::Open(f16.path, TokenFormat::kText);
  REQUIRE(d.ok());
  CHECK(d->size() == 2000);
}

TEST_CASE("llm.c token files with a header are read", "[data]") {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = 100;
  auto toks = Ramp<uint16_t>(100, 1000);
  std::vector<char> bytes(1024 + 200);
  std::memcpy(bytes.data(), header.data(), 1024);
  std::memcpy(bytes.data() + 1024, toks.data(), 200);
  TempData f("llmc_train.bin", bytes.data(), bytes.size());
  auto s = TokenSource::Open(f.path);
  REQUIRE(s.ok());
  REQUIRE(s->size() == 100);
  for (size_t i = 0; i < toks.size(); ++i) REQUIRE(s->at(i) == toks[i]);

  // Declared count disagrees with the payload: truncated.
  TempData cut("llmc_cut.bin", bytes.data(), bytes.size() - 20);
  auto t = TokenSource::Open(cut.path);
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().code() == Code::kDataErr);
  CHECK(t.status().message().find(cut.path) != std::string::npos);
}

TEST_CASE("sampling depends only on seed and step and sample index", "[data]") {
  auto toks = Ramp<uint16_t>(5000, 65521);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>(i);  // unique ids
  TempData f("det.bin", toks.data(), toks.size() * 2);
  auto a = TokenSource::Open(f.path);
  auto b = TokenSource::Open(f.path);  // an independent open sees the same windows
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const int s = 32;
  std::vector<int64_t> x1(s), y1(s), x2(s), y2(s);
  a->Sample(7, 3, 5, s, x1.data(), y1.data());
  b->Sample(7, 3, 5, s, x2.data(), y2.data());
  CHECK(x1 == x2);
  CHECK(y1 == y2);

  // Changing any one of seed, step, index moves the window.
  std::set<size_t> offsets;
  for (uint64_t seed : {0, 1}) {
    for (uint64_t step : {0, 1, 2}) {
      for (uint64_t i : {0, 1, 2, 3}) offsets.insert(a->Offset(seed, step, i, s));
    }
  }
  CHECK(offsets.size() >= 23);  // 24 draws over 4968 windows: at most a rare collision

  // Windows stay in range for every start and cover the file.
  size_t lo = toks.size(), hi = 0;
  for (uint64_t i = 0; i < 2000; ++i) {
    const size_t off = a->Offset(1, 0, i, s);
    REQUIRE(off + s < a->size());
    lo = std::min(lo, off);
    hi = std::max(hi, off);
  }
  CHECK(lo < 100);
  CHECK(hi > toks.size() - s - 100);
}

TEST_CASE("a blend draws each file in its weight's share, by (seed, step, index) alone", "[data]") {
  // Three files whose tokens say which they are: 1s, 2s and 3s.
  std::vector<uint16_t> ones(3000, 1), twos(5000, 2), threes(700, 3);
  TempData a("blend_a.bin", ones.data(), ones.size() * 2);
  TempData b("blend_b.bin", twos.data(), twos.size() * 2);
  TempData c("blend_c.bin", threes.data(), threes.size() * 2);
  const std::string spec = "0.3:" + a.path + ",0.6:" + b.path + ",0.1:" + c.path;
  auto src = TokenSource::Open(spec, TokenFormat::kAuto, nullptr, nullptr);
  REQUIRE(src.ok());
  REQUIRE(src->parts() == 3);
  CHECK(src->max_token() == 3);
  CHECK(src->size() == 700);  // the smallest part's: every part must take a window
  CHECK(src->Check(16, 4).ok());
  CHECK(src->Check(701, 4).code() == Code::kDataErr);
  // 10^5 samples: 100 steps of 1,000.
  std::vector<int> count(3, 0);
  int64_t x[16], y[16];
  for (uint64_t step = 0; step < 100; ++step) {
    for (uint64_t i = 0; i < 1000; ++i) {
      const int k = src->Part(7, step, i);
      ++count[static_cast<size_t>(k)];
      if (i % 97 == 0) {  // the sample is the chosen file's
        src->Sample(7, step, i, 16, x, y);
        CHECK(x[0] == k + 1);
        CHECK(y[15] == k + 1);
      }
    }
  }
  const double want[] = {0.3, 0.6, 0.1};
  for (int k = 0; k < 3; ++k) {
    INFO("file " << k << ": " << count[static_cast<size_t>(k)] << " of 100000");
    CHECK(std::abs(count[static_cast<size_t>(k)] / 1e5 - want[k]) <= 0.01 * want[k]);
  }
  // The choice is (seed, step, index)'s alone: another opening, another
  // order of asking, another seed.
  auto again = TokenSource::Open(spec, TokenFormat::kAuto, nullptr, nullptr);
  REQUIRE(again.ok());
  int differ = 0;
  for (uint64_t i = 0; i < 500; ++i) {
    CHECK(again->Part(7, 42, 499 - i) == src->Part(7, 42, 499 - i));
    CHECK(again->Offset(7, 42, i, 16) == src->Offset(7, 42, i, 16));
    differ += again->Part(8, 42, i) != src->Part(7, 42, i);
  }
  CHECK(differ > 0);
  // The evaluation split holds out the end of each file, blended again.
  TokenSource train = *src, eval = *src;
  REQUIRE(ob::model::SplitForEval(*src, 0.1, 16, &train, &eval).ok());
  REQUIRE(eval.parts() == 3);
  CHECK(eval.part(0).size() == 300);
  CHECK(train.part(1).size() == 4500);
  CHECK(eval.Part(7, 3, 5) == src->Part(7, 3, 5));
}

TEST_CASE("blend specs parse, and a malformed one is refused naming it", "[data]") {
  using ob::model::ParseBlend;
  auto ok = ParseBlend("0.3:a.bin,0.7:/d/b.u32");
  REQUIRE(ok.ok());
  REQUIRE(ok->size() == 2);
  CHECK((*ok)[0].weight == 0.3);
  CHECK((*ok)[1].path == "/d/b.u32");
  for (const char* one : {"train.bin", "synthetic", "/data/x:y.bin", "a,b"}) {
    auto r = ParseBlend(one);
    REQUIRE(r.ok());
    CHECK(r->empty());
  }
  for (const char* bad : {"0.3:a.bin", "0.3:a.bin,b.bin", "0.3:a.bin,0:b.bin", "0.3:a.bin,-1:b.bin",
                          "0.3:a.bin,0.7:", "0.3:a.bin,0.7:a.bin", "1:a.bin,nan:b.bin", "1:a.bin,"}) {
    auto r = ParseBlend(bad);
    INFO(bad);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == Code::kUsage);
    CHECK(r.status().message().find(bad) != std::string::npos);
  }
  // A file whose name looks like a blend is a file (here, in the working
  // directory).
  const std::string odd = "0.5:ob_data_test_" + std::to_string(getpid()) + ".bin,0.5:y.bin";
  REQUIRE(!ParseBlend(odd)->empty());
  { std::ofstream(odd) << "x"; }
  auto r = ParseBlend(odd);
  std::remove(odd.c_str());
  REQUIRE(r.ok());
  CHECK(r->empty());
}

TEST_CASE("synthetic tokens are seeded and within the vocabulary", "[data]") {
  auto a = TokenSource::Synthetic(50, 11);
  auto b = TokenSource::Synthetic(50, 11);
  auto c = TokenSource::Synthetic(50, 12);
  CHECK(a.format() == TokenFormat::kSynthetic);
  CHECK(a.max_token() == 49);
  CHECK(a.Check(1024, 50).ok());
  const int s = 64;
  std::vector<int64_t> xa(s), ya(s), xb(s), yb(s), xc(s), yc(s);
  a.Sample(0, 4, 2, s, xa.data(), ya.data());
  b.Sample(0, 4, 2, s, xb.data(), yb.data());
  c.Sample(0, 4, 2, s, xc.data(), yc.data());
  CHECK(xa == xb);
  CHECK(xa != xc);
  std::set<int64_t> seen;
  for (int j = 0; j < s; ++j) {
    CHECK(xa[j] >= 0);
    CHECK(xa[j] < 50);
    if (j + 1 < s) CHECK(ya[j] == xa[j + 1]);
    seen.insert(xa[j]);
  }
  CHECK(seen.size() > 20);
}

TEST_CASE("missing or empty or odd or short data files are rejected naming the file", "[data]") {
  auto missing = TokenSource::Open("/nonexistent/train.bin");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == Code::kNoInput);
  CHECK(missing.status().message().find("/nonexistent/train.bin") != std::string::npos);

  TempData empty("empty.txt", "", 0);
  auto e = TokenSource::Open(empty.path);
  REQUIRE_FALSE(e.ok());
  CHECK(e.status().code() == Code::kDataErr);
  CHECK(e.status().message().find(empty.path) != std::string::npos);

  const char odd[] = {1, 0, 2, 0, 3};
  TempData o("odd.bin", odd, sizeof(odd));
  auto r = TokenSource::Open(o.path);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kDataErr);
  CHECK(r.status().message().find(o.path) != std::string::npos);

  const char six[] = {1, 0, 0, 0, 2, 0};
  TempData q("six.u32", six, sizeof(six));  // not a multiple of 4
  CHECK(TokenSource::Open(q.path).status().code() == Code::kDataErr);

  const std::string text = "short";
  TempData sh("short.txt", text.data(), text.size());
  auto s = TokenSource::Open(sh.path);
  REQUIRE(s.ok());
  CHECK(s->Check(4, 256).ok());
  const auto too_short = s->Check(5, 256);  // needs 6 tokens
  CHECK(too_short.code() == Code::kDataErr);
  CHECK(too_short.message().find(sh.path) != std::string::npos);
  // Vocabulary too small for the ids present.
  const auto small_vocab = s->Check(4, 100);  // 't' = 116
  CHECK(small_vocab.code() == Code::kDataErr);
  CHECK(small_vocab.message().find("116") != std::string::npos);
}

TEST_CASE("data format names parse", "[data]") {
  CHECK(*ob::model::ParseTokenFormat("u16") == TokenFormat::kU16);
  CHECK(*ob::model::ParseTokenFormat("synthetic") == TokenFormat::kSynthetic);
  CHECK(ob::model::ParseTokenFormat("utf8").status().code() == Code::kUsage);
}

TEST_CASE("known token-file facts spare the scan only for the same file", "[data]") {
  auto u16 = Ramp<uint16_t>(1000, 300);  // largest id 299
  TempData f("facts.bin", u16.data(), u16.size() * 2);
  auto scanned = TokenSource::Open(f.path);
  REQUIRE(scanned.ok());
  CHECK(scanned->max_token() == 299);
  const ob::model::TokenFileFacts facts = scanned->facts();
  CHECK(facts.bytes == 2000);
  auto decoded = ob::model::TokenFileFacts::Decode(facts.Encode());
  REQUIRE(decoded.ok());
  CHECK(decoded->Encode() == facts.Encode());

  // Facts of this very file (size and modification time) are taken as they
  // are: no pass over the tokens (a planted maximum shows it).
  ob::model::TokenFileFacts planted = facts;
  planted.max_token = 7;
  auto trusted = TokenSource::Open(f.path, TokenFormat::kAuto, &planted);
  REQUIRE(trusted.ok());
  CHECK(trusted->max_token() == 7);
  // Another modification time or size: scanned again.
  planted.mtime_ns += 1;
  CHECK(TokenSource::Open(f.path, TokenFormat::kAuto, &planted)->max_token() == 299);
  planted = facts;
  planted.bytes += 2;
  planted.max_token = 7;
  CHECK(TokenSource::Open(f.path, TokenFormat::kAuto, &planted)->max_token() == 299);

  for (const char* bad : {"", "1:2", "1:2:x", "1:2:3:4", "1:2:-1", "a:b:c"}) {
    CHECK(ob::model::TokenFileFacts::Decode(bad).status().code() == Code::kUsage);
  }
}

TEST_CASE("the content sum covers every byte: files of one size and the same ends differ by it", "[data]") {
  // 3 MiB of u32 tokens: DataFingerprint reads the first and last MiB, so a
  // change in the middle MiB leaves it as it was.
  auto ids = Ramp<uint32_t>(3u << 18, 50000);
  TempData a("sum_a.u32", ids.data(), ids.size() * 4);
  ids[ids.size() / 2] ^= 1;
  TempData b("sum_b.u32", ids.data(), ids.size() * 4);
  CHECK(ob::model::DataFingerprint(a.path) == ob::model::DataFingerprint(b.path));
  auto sa = TokenSource::Open(a.path);
  auto sb = TokenSource::Open(b.path);
  REQUIRE(sa.ok());
  REQUIRE(sb.ok());
  CHECK(sa->content_sum().rfind("xxh3=", 0) == 0);
  CHECK(sa->content_sum().size() == 5 + 16);
  CHECK(sa->content_sum() != sb->content_sum());
  CHECK(sa->max_token() == 49999);
  CHECK(TokenSource::Open(a.path)->content_sum() == sa->content_sum());
  // Known facts skip the pass, and with it the sum.
  const ob::model::TokenFileFacts facts = sa->facts();
  CHECK(TokenSource::Open(a.path, TokenFormat::kAuto, &facts)->content_sum().empty());
  // A file of one chunk and a bit, in every format: the largest id is found
  // in the last, short chunk too.
  std::vector<uint16_t> u16((1u << 19) + 3, 5);
  u16.back() = 4321;
  TempData c("sum_c.bin", u16.data(), u16.size() * 2);
  CHECK(TokenSource::Open(c.path)->max_token() == 4321);
  std::string text((1u << 20) + 1, 'a');
  text.back() = 'z';
  TempData t("sum_t.txt", text.data(), text.size());
  CHECK(TokenSource::Open(t.path)->max_token() == 'z');
}

TEST_CASE("a FIFO as data is refused at once, not waited on", "[data]") {
  const std::string fifo = "/tmp/ob_data_test_" + std::to_string(getpid()) + "_fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto r = TokenSource::Open(fifo);  // blocked forever before the fix: no writer
  std::remove(fifo.c_str());
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kDataErr);
  CHECK(r.status().message().find(": not a regular file (a FIFO)") != std::string::npos);
  CHECK(ob::model::DataFingerprint(fifo).empty());
  CHECK(ob::model::DataFingerprint("synthetic") == "synthetic");
  // A directory was called "a device or socket".
  auto dir = TokenSource::Open("/tmp");
  REQUIRE_FALSE(dir.ok());
  CHECK(dir.status().code() == Code::kDataErr);
  CHECK(dir.status().message() == "/tmp: a directory, not a token file (give a file of it)");
}

TEST_CASE("an evaluation split holds out the end of the tokens, disjoint from training", "[data]") {
  auto u16 = Ramp<uint16_t>(1000, 50257);
  TempData f("split.bin", u16.data(), u16.size() * 2);
  auto all = TokenSource::Open(f.path);
  REQUIRE(all.ok());
  auto synthetic = TokenSource::Synthetic(256, 9, 1000);
  for (const TokenSource* src : {&*all, &synthetic}) {
    TokenSource train = *src, eval = *src;
    REQUIRE(ob::model::SplitForEval(*src, 0.1, 16, &train, &eval).ok());
    CHECK(train.size() == 900);
    CHECK(eval.size() == 100);
    for (size_t p = 0; p < 900; ++p) REQUIRE(train.at(p) == src->at(p));
    for (size_t p = 0; p < 100; ++p) REQUIRE(eval.at(p) == src->at(900 + p));
    // Every window either part samples lies inside it.
    for (uint64_t i = 0; i < 200; ++i) {
      CHECK(train.Offset(1, 3, i, 16) + 16 < 900);
      CheckWindow(train, 1, 3, i, 16);
      CheckWindow(eval, 1, 3, i, 16);
    }
  }
  TokenSource train = *all, eval = *all;
  auto st = ob::model::SplitForEval(*all, 0.01, 16, &train, &eval);  // 10 tokens held out < 17
  CHECK(st.code() == Code::kDataErr);
  CHECK(st.message().find(f.path + ": 1000 tokens split 990 for training and 10 for evaluation") == 0);
  CHECK(ob::model::SplitForEval(*all, 1.0, 16, &train, &eval).code() == Code::kUsage);
  CHECK(ob::model::SplitForEval(*all, 0, 16, &train, &eval).code() == Code::kUsage);
}

TEST_CASE("a data file rewritten in place is seen, one renamed into place is not the file mapped", "[data]") {
  std::string text(4096, 'a');
  TempData f("live.txt", text.data(), text.size());
  auto src = TokenSource::Open(f.path);
  REQUIRE(src.ok());
  CHECK(src->Unchanged().ok());
  const TokenSource window = src->Window(10, 100);  // shares the mapping
  {
    // A new file renamed over the path: the mapping is still the old one.
    const std::string fresh = f.path + ".new";
    std::ofstream(fresh, std::ios::binary) << std::string(100, 'z');
    REQUIRE(std::rename(fresh.c_str(), f.path.c_str()) == 0);
    CHECK(src->Unchanged().ok());
    CHECK(src->at(0) == 'a');
  }
  auto live = TokenSource::Open(f.path);
  REQUIRE(live.ok());
  const TokenSource held = live->Window(1, 50);
  {
    // Rewritten in place, same size: the mapping reads the new bytes.
    std::fstream out(f.path, std::ios::in | std::ios::out | std::ios::binary);
    out.seekp(0);
    out << "y";
  }
  // The modification time moves on write; a file system's clock may round
  // it to a tick, so set it plainly different.
  struct timespec times[2] = {{0, UTIME_OMIT}, {1, 0}};
  REQUIRE(utimensat(AT_FDCWD, f.path.c_str(), times, 0) == 0);
  const ob::Status st = live->Unchanged();
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == Code::kDataErr);
  CHECK_THAT(st.message(), Catch::StartsWith(f.path + ": rewritten while the run read it (100 bytes modified "));
  CHECK_THAT(st.message(), Catch::Contains("now 100 bytes modified 1970-01-01 00:00:01 UTC): the tokens read since"));
  CHECK(held.Unchanged().code() == Code::kDataErr);  // a window of it too
  CHECK(window.Unchanged().ok());
  // Truncated: the size says it.
  { std::ofstream(f.path, std::ios::binary | std::ios::trunc); }
  CHECK_THAT(live->Unchanged().message(), Catch::Contains("now 0 bytes"));
  CHECK(TokenSource::Synthetic(256, 1).Unchanged().ok());
}

TEST_CASE("FileContentSum is the open's content sum, and FileIdentity changes with a write whose time is set back",
          "[data]") {
  std::string text(5000, 'q');
  TempData f("ident.txt", text.data(), text.size());
  auto src = TokenSource::Open(f.path);
  REQUIRE(src.ok());
  auto sum = ob::model::FileContentSum(f.path);
  REQUIRE(sum.ok());
  CHECK(*sum == src->content_sum());
  std::atomic<bool> stop{true};
  CHECK(ob::model::FileContentSum(f.path, &stop).status().code() == Code::kUnavailable);
  CHECK(ob::model::FileContentSum(f.path + ".missing").status().code() == Code::kNoInput);
  const std::string before = ob::model::FileIdentity(f.path);
  REQUIRE_FALSE(before.empty());
  struct stat st {};
  REQUIRE(stat(f.path.c_str(), &st) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a tick of the file system's clock
  {
    std::fstream out(f.path, std::ios::in | std::ios::out | std::ios::binary);
    out.seekp(2500);
    out << "z";
  }
  struct timespec times[2] = {st.st_atim, st.st_mtim};  // touch -r: the old times back
  REQUIRE(utimensat(AT_FDCWD, f.path.c_str(), times, 0) == 0);
  CHECK(ob::model::FileIdentity(f.path) != before);
  CHECK(*ob::model::FileContentSum(f.path) != *sum);
  CHECK(ob::model::FileIdentity(f.path + ".missing").empty());
}

TEST_CASE("the scan cache vouches for a file only while its identity is the one read, and never for a fresh one",
          "[data]") {
  CacheDir dir;
  const ScanCache cache(dir.path);
  std::string text(4000, 'a');
  TempData f("cached.txt", text.data(), text.size());
  struct stat st = Stat(f.path);
  CHECK_FALSE(cache.Find(st));
  const ScanEntry e{"", "text", 97, "xxh3=0123456789abcdef"};

  // A file changed within kQuietNs of its pass is not remembered: a rewrite
  // in the same timestamp tick would keep its identity.
  cache.Remember(st, e, NowNs());
  CHECK_FALSE(cache.Find(st));
  // Quiet long enough before the pass: remembered, under its identity.
  cache.Remember(st, e, NowNs() + ScanCache::kQuietNs + 1000000);
  auto found = cache.Find(st);
  REQUIRE(found);
  CHECK(found->identity == ob::model::IdentityOf(st));
  CHECK(found->max_token == 97);
  CHECK(found->format == "text");
  CHECK(found->sum == e.sum);
  // A pass that only summed keeps the count.
  cache.Remember(st, {"", "", -1, e.sum}, NowNs() + ScanCache::kQuietNs + 1000000);
  REQUIRE(cache.Find(st));
  CHECK(cache.Find(st)->max_token == 97);

  // Rewritten in place, size kept and times set back (touch -r): its ctime
  // moved, so the entry is another file's.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  {
    std::fstream out(f.path, std::ios::in | std::ios::out | std::ios::binary);
    out.seekp(100);
    out << "b";
  }
  struct timespec times[2] = {st.st_atim, st.st_mtim};
  REQUIRE(utimensat(AT_FDCWD, f.path.c_str(), times, 0) == 0);
  const struct stat now = Stat(f.path);
  CHECK(now.st_size == st.st_size);
  CHECK(now.st_mtim.tv_nsec == st.st_mtim.tv_nsec);
  CHECK_FALSE(cache.Find(now));

  // Malformed or forged entries are nobody's.
  const std::string entry = dir.path + "/" + std::to_string(now.st_dev) + "-" + std::to_string(now.st_ino);
  const std::string id = ob::model::IdentityOf(now);
  auto planted = [&](const std::string& body) {
    REQUIRE(ob::io::WriteFile(entry, body).ok());
    return cache.Find(now).has_value();
  };
  CHECK(planted("ob scan 1\nidentity " + id + "\nformat text\nmax_token 5\nsum xxh3=0123456789abcdef\n"));
  CHECK_FALSE(planted("ob scan 2\nidentity " + id + "\nformat text\nmax_token 5\nsum xxh3=0123456789abcdef\n"));
  CHECK_FALSE(planted("ob scan 1\nidentity " + id + "\nformat text\nmax_token x\nsum xxh3=0123456789abcdef\n"));
  CHECK_FALSE(planted("ob scan 1\nidentity " + id + "\nformat text\nsum xxh3=0123456789abcdef\n"));
  CHECK_FALSE(planted("ob scan 1\nidentity " + id + "\nformat text\nmax_token 5\nsum xxh3=01\n"));
  CHECK_FALSE(planted("ob scan 1\nidentity " + id + "0\nformat text\nmax_token 5\nsum xxh3=0123456789abcdef\n"));
  CHECK_FALSE(planted("garbage"));
  CHECK_FALSE(ScanCache("").Find(now));
}

TEST_CASE("Open and FileContentSum take what the cache read before, and a fresh file is read each time", "[data]") {
  CacheDir dir;
  const ScanCache cache(dir.path);
  auto u16 = Ramp<uint16_t>(1000, 300);  // largest id 299
  TempData f("cached.bin", u16.data(), u16.size() * 2);
  // Fresh: read, and not remembered.
  auto read = TokenSource::Open(f.path, TokenFormat::kAuto, nullptr, &cache);
  REQUIRE(read.ok());
  CHECK(read->max_token() == 299);
  const std::string sum = read->content_sum();
  CHECK(sum.rfind("xxh3=", 0) == 0);
  CHECK_FALSE(cache.Find(Stat(f.path)));
  // An entry for this very file (planted values show that nothing was read).
  cache.Remember(Stat(f.path), {"", "u16", 7, "xxh3=00000000000000ff"}, NowNs() + ScanCache::kQuietNs + 1000000);
  auto taken = TokenSource::Open(f.path, TokenFormat::kAuto, nullptr, &cache);
  REQUIRE(taken.ok());
  CHECK(taken->max_token() == 7);
  CHECK(taken->content_sum() == "xxh3=00000000000000ff");
  std::atomic<uint64_t> done{0};
  CHECK(*ob::model::FileContentSum(f.path, nullptr, &done, &cache) == "xxh3=00000000000000ff");
  CHECK(done == 2000);
  // Counted in another format: read again.
  auto as_text = TokenSource::Open(f.path, TokenFormat::kText, nullptr, &cache);
  REQUIRE(as_text.ok());
  CHECK(as_text->content_sum() == sum);
  // Without a cache: read.
  CHECK(TokenSource::Open(f.path, TokenFormat::kAuto, nullptr, nullptr)->max_token() == 299);
  CHECK(*ob::model::FileContentSum(f.path, nullptr, nullptr, nullptr) == sum);
}

TEST_CASE("the scan cache's directory comes from the environment and is refused when others may write to it",
          "[data]") {
  CacheDir dir;
  const char* old = std::getenv("OB_CACHE_DIR");
  const std::string saved = old != nullptr ? old : "";
  const bool had = old != nullptr;
  const std::string mine = dir.path + "/made/here";
  setenv("OB_CACHE_DIR", mine.c_str(), 1);
  CHECK(ScanCache::FromEnvironment().dir() == mine);
  CHECK((Stat(mine).st_mode & 0777) == 0700);
  for (const char* off : {"", "off"}) {
    setenv("OB_CACHE_DIR", off, 1);
    CHECK(ScanCache::FromEnvironment().dir().empty());
  }
  REQUIRE(::chmod(mine.c_str(), 0777) == 0);
  setenv("OB_CACHE_DIR", mine.c_str(), 1);
  CHECK(ScanCache::FromEnvironment().dir().empty());
  REQUIRE(::chmod(mine.c_str(), 0720) == 0);
  CHECK(ScanCache::FromEnvironment().dir().empty());
  REQUIRE(::chmod(mine.c_str(), 0700) == 0);
  CHECK(ScanCache::FromEnvironment().dir() == mine);
  const std::string file = dir.path + "/a-file";
  REQUIRE(ob::io::WriteFile(file, "x").ok());
  setenv("OB_CACHE_DIR", file.c_str(), 1);
  CHECK(ScanCache::FromEnvironment().dir().empty());
  // Named and unusable: a warning; a home that cannot take one (a compute
  // node's read-only or missing home), nothing above debug level.
  const std::string log_file = dir.path + "/log";
  REQUIRE(ob::log::SetFile(log_file));
  const ob::log::Level level = ob::log::GetLevel();
  ob::log::SetLevel(ob::log::Level::kInfo);
  CHECK(ScanCache::FromEnvironment().dir().empty());
  unsetenv("OB_CACHE_DIR");
  const char* home = std::getenv("HOME");
  const std::string saved_home = home != nullptr ? home : "";
  const char* xdg0 = std::getenv("XDG_CACHE_HOME");
  const std::string saved_xdg0 = xdg0 != nullptr ? xdg0 : "";
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", file.c_str(), 1);  // HOME/.cache/ob cannot be made under a file
  CHECK(ScanCache::FromEnvironment().dir().empty());
  unsetenv("HOME");
  CHECK(ScanCache::FromEnvironment().dir().empty());
  if (home != nullptr) setenv("HOME", saved_home.c_str(), 1);
  if (xdg0 != nullptr) setenv("XDG_CACHE_HOME", saved_xdg0.c_str(), 1);
  ob::log::SetFile("");
  ob::log::SetLevel(level);
  {
    std::ifstream in(log_file);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t n = 0;
    for (size_t at = text.find("not keeping"); at != std::string::npos; at = text.find("not keeping", at + 1)) ++n;
    CHECK(n == 1);  // the named one only
    CHECK(text.find(file + " is not a directory") != std::string::npos);
  }
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved_xdg = xdg != nullptr ? xdg : "";
  setenv("XDG_CACHE_HOME", dir.path.c_str(), 1);
  CHECK(ScanCache::FromEnvironment().dir() == dir.path + "/ob");
  if (xdg != nullptr) setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1); else unsetenv("XDG_CACHE_HOME");
  if (had) setenv("OB_CACHE_DIR", saved.c_str(), 1);
}
