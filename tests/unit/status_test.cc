#include <catch2/catch.hpp>

#include "ob/cli/cli.h"
#include "ob/status.h"

namespace {

ob::Result<int> Half(int x) {
  if (x % 2) return ob::Status::DataErr("odd: " + std::to_string(x));
  return x / 2;
}

ob::Result<int> Quarter(int x) {
  OB_ASSIGN_OR_RETURN(int h, Half(x));
  OB_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

}  // namespace

TEST_CASE("status codes are the sysexits exit statuses") {
  CHECK(ob::Status::Ok().exit_code() == 0);
  CHECK(ob::Status::Usage("x").exit_code() == 64);
  CHECK(ob::Status::DataErr("x").exit_code() == 65);
  CHECK(ob::Status::NoInput("x").exit_code() == 66);
  CHECK(ob::Status::Unavailable("x").exit_code() == 69);
  CHECK(ob::Status::Internal("x").exit_code() == 70);
  CHECK(ob::Status::IoErr("x").exit_code() == 74);
  CHECK(ob::Status::TempFail("x").exit_code() == 75);
  CHECK(ob::Status::Config("x").exit_code() == 78);
}

TEST_CASE("results carry values or propagate the first error") {
  auto q = Quarter(12);
  REQUIRE(q.ok());
  CHECK(*q == 3);
  auto bad = Quarter(6);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == ob::Code::kDataErr);
  CHECK(bad.status().message() == "odd: 3");
  CHECK(bad.status().WithContext("f.pb").message() == "f.pb: odd: 3");
}

TEST_CASE("integer lists parse or name the flag") {
  auto ok = ob::cli::ParseIntList("1,2,4", "--microbatch");
  REQUIRE(ok.ok());
  CHECK(*ok == std::vector<int>{1, 2, 4});
  for (const char* bad : {"", "1,,2", "0", "-1", "2x", "a"}) {
    auto r = ob::cli::ParseIntList(bad, "--microbatch");
    CHECK_FALSE(r.ok());
    CHECK(r.status().code() == ob::Code::kUsage);
    CHECK(r.status().message().find("--microbatch") == 0);
  }
}
