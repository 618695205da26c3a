#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>

#include "ob/io/records.h"
#include "ob/metrics.pb.h"

namespace {

ob::pb::Metrics Step(int i) {
  ob::pb::Metrics m;
  m.set_format_version(1);
  m.set_host("h" + std::to_string(i % 3));
  m.set_rank(i % 4);
  m.set_step(i);
  m.set_loss(10.0 / (i + 1));
  m.set_step_seconds(0.1 * i);
  return m;
}

std::string Stream(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) ob::io::AppendRecord(Step(i), &s);
  return s;
}

}  // namespace

TEST_CASE("a delimited stream round-trips through a pipe") {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  ob::io::RecordWriter w(fds[1], "pipe");
  for (int i = 0; i < 100; ++i) REQUIRE(w.Write(Step(i)).ok());
  close(fds[1]);
  ob::io::RecordReader r(fds[0], "pipe");
  ob::pb::Metrics m;
  for (int i = 0; i < 100; ++i) {
    auto got = r.Next(&m);
    REQUIRE(got.ok());
    REQUIRE(*got);
    CHECK(m.step() == static_cast<uint64_t>(i));
    CHECK(m.host() == Step(i).host());
  }
  auto end = r.Next(&m);
  REQUIRE(end.ok());
  CHECK_FALSE(*end);
  CHECK(r.records() == 100);
  close(fds[0]);
}

TEST_CASE("a truncated stream gives every whole record, then says where it was cut") {
  const std::string full = Stream(10);
  // Find the offset where record 8 starts.
  std::string first7 = Stream(7);
  for (size_t cut : {first7.size() + 1, first7.size() + 5, full.size() - 1}) {
    auto r = ob::io::RecordReader::FromString(full.substr(0, cut), "m.pb");
    ob::pb::Metrics m;
    int good = 0;
    ob::Status err;
    for (;;) {
      auto got = r.Next(&m);
      if (!got.ok()) {
        err = got.status();
        break;
      }
      if (!*got) break;
      ++good;
    }
    INFO("cut at " << cut);
    CHECK(err.code() == ob::Code::kDataErr);
    CHECK_THAT(err.message(), Catch::Contains("m.pb: record") && Catch::Contains("truncated"));
    if (cut < full.size() - 1) {
      CHECK(good == 7);
      CHECK_THAT(err.message(), Catch::Contains("record 8 at byte " + std::to_string(first7.size())));
    } else {
      CHECK(good == 9);
    }
  }
}

TEST_CASE("corrupt streams are reported, not allocated or misread") {
  ob::pb::Metrics m;
  SECTION("absurd size prefix") {
    std::string s = Stream(2) + std::string("\xff\xff\xff\xff\x0f", 5) + "xxxx";
    auto r = ob::io::RecordReader::FromString(s, "m.pb");
    REQUIRE(*r.Next(&m));
    REQUIRE(*r.Next(&m));
    auto bad = r.Next(&m);
    REQUIRE_FALSE(bad.ok());
    CHECK_THAT(bad.status().message(), Catch::Contains("record 3") && Catch::Contains("corrupt"));
  }
  SECTION("garbage body") {
    std::string s = Stream(1) + std::string("\x04\xff\xff\xff\xff", 5);
    auto r = ob::io::RecordReader::FromString(s, "m.pb");
    REQUIRE(*r.Next(&m));
    auto bad = r.Next(&m);
    REQUIRE_FALSE(bad.ok());
    CHECK_THAT(bad.status().message(), Catch::Contains("not a valid ob.pb.Metrics"));
  }
  SECTION("an empty stream is a clean end") {
    auto r = ob::io::RecordReader::FromString("", "m.pb");
    auto got = r.Next(&m);
    REQUIRE(got.ok());
    CHECK_FALSE(*got);
  }
}
