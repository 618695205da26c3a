#include <catch2/catch.hpp>

#include "ob/io/message.h"
#include "ob/plan.pb.h"
#include "ob/profile.pb.h"

namespace {

ob::pb::Profile Sample() {
  ob::pb::Profile p;
  p.set_mode(ob::pb::PROFILE_ANALYTIC);
  p.mutable_model()->set_name("gpt-tiny");
  for (int i = 0; i < 4; ++i) {
    auto* l = p.add_layers();
    l->set_index(i);
    l->set_name("layer" + std::to_string(i));
    l->add_costs()->set_forward_seconds(0.001 * (i + 1));
  }
  p.set_host("somewhere");
  return p;
}

}  // namespace

TEST_CASE("top-level messages round-trip with version and end marker") {
  std::string bytes = ob::io::SerializeMessage(Sample(), ob::io::kProfileFormatVersion);
  ob::pb::Profile back;
  REQUIRE(ob::io::ParseMessage(bytes, "p.pb", ob::io::kProfileFormatVersion, &back).ok());
  CHECK(back.format_version() == ob::io::kProfileFormatVersion);
  CHECK(back.layers_size() == 4);
  CHECK(back.host() == "somewhere");
}

TEST_CASE("every truncation of a file is refused") {
  std::string bytes = ob::io::SerializeMessage(Sample(), ob::io::kProfileFormatVersion);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    ob::pb::Profile back;
    auto st = ob::io::ParseMessage(bytes.substr(0, cut), "p.pb", 1, &back);
    INFO("cut at " << cut << " of " << bytes.size());
    REQUIRE_FALSE(st.ok());
    CHECK(st.code() == ob::Code::kDataErr);
    CHECK(st.message().rfind("p.pb: ", 0) == 0);
  }
}

TEST_CASE("newer format versions and foreign messages are refused") {
  ob::pb::Profile p;
  std::string newer = ob::io::SerializeMessage(Sample(), 7);
  auto st = ob::io::ParseMessage(newer, "p.pb", 1, &p);
  CHECK(st.code() == ob::Code::kDataErr);
  CHECK_THAT(st.message(), Catch::Contains("format_version 7 is newer than this ob reads (1)"));

  ob::pb::Profile no_version = Sample();
  std::string raw = no_version.SerializeAsString();  // no version, no marker
  st = ob::io::ParseMessage(raw, "p.pb", 1, &p);
  CHECK_THAT(st.message(), Catch::Contains("not an ob Profile"));
}

TEST_CASE("JSON uses proto field names and prints defaults") {
  std::string json = ob::io::ToJson(Sample());
  CHECK_THAT(json, Catch::Contains("\"forward_seconds\"") && Catch::Contains("\"backward_seconds\": 0"));
}

TEST_CASE("a file of one type given for another is named for what it is") {
  ob::pb::Plan plan;
  plan.set_nodes(4);
  std::string bytes = ob::io::SerializeMessage(plan, ob::io::kPlanFormatVersion);
  ob::pb::Profile p;
  auto st = ob::io::ParseMessage(bytes, "plan.pb", ob::io::kProfileFormatVersion, &p);
  CHECK(st.code() == ob::Code::kDataErr);
  CHECK(st.message() == "plan.pb: is an ob Plan, not a Profile");
}

TEST_CASE("the --json form is read back") {
  std::string json = ob::io::ToJson(Sample());
  ob::pb::Profile back;
  // ToJson of an unversioned message lacks the header: add it as WriteMessage does.
  std::string bytes = ob::io::SerializeMessage(Sample(), 1);
  ob::pb::Profile versioned;
  REQUIRE(versioned.ParseFromString(bytes));
  REQUIRE(ob::io::ParseMessage(ob::io::ToJson(versioned), "p.json", 1, &back).ok());
  CHECK(back.layers_size() == 4);
  CHECK(ob::io::ParseMessage("{\"layers\": [", "p.json", 1, &back).code() == ob::Code::kDataErr);
}
