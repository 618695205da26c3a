// RelayStore: ob's store as the c10d::Store workers hand to process-group
// creation, over the whole relay path (master's StoreServer ↔ control
// channel ↔ agent's relay ↔ worker's socket), as in a run.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "ob/launch/worker/relay_store.h"
#include "ob/torch_compat.h"
#include "store_testing.h"

using ob::launch::RelayStore;
using std::chrono::milliseconds;

namespace {

std::vector<uint8_t> B(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string S(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

}  // namespace

TEST_CASE("relay store: every c10d operation, through a PrefixStore", "[store]") {
  ob::testing::RelayHarness h;
  auto root = c10::make_intrusive<RelayStore>(h.NewClient(), milliseconds(2000));
  auto other = c10::make_intrusive<RelayStore>(h.NewClient(), milliseconds(2000));
  auto gen = c10::make_intrusive<c10d::PrefixStore>("ob/gen/7", root);
  gen->set("a", B("1"));
  CHECK(S(other->get("ob/gen/7/a")) == "1");
  CHECK(gen->add("n", 3) == 3);
  CHECK(gen->add("n", 4) == 7);
  CHECK(S(gen->compareSet("c", B(""), B("x"))) == "x");
  CHECK(S(gen->compareSet("c", B("y"), B("z"))) == "x");
  CHECK(gen->check({"a", "n", "c"}));
  CHECK_FALSE(gen->check({"a", "missing"}));
  gen->wait({"a", "c"});
  gen->wait({"a"}, milliseconds(100));
  CHECK(gen->getNumKeys() == 3);
  CHECK(gen->deleteKey("a"));
  CHECK_FALSE(gen->deleteKey("a"));
  // Failures are exceptions, as c10d's contract says, and name the key.
  try {
    gen->wait({"missing"}, milliseconds(100));
    FAIL("no timeout");
  } catch (const c10::Error& e) {
    CHECK(std::string(e.what()).find("ob/gen/7/missing") != std::string::npos);
  }
  CHECK_THROWS_AS(root->get("never"), c10::Error);  // within the store's 2 s timeout
  CHECK_THROWS_AS(root->set(std::string(2000, 'k'), B("v")), c10::Error);
  auto copy = root->clone();
  CHECK(S(copy->get("ob/gen/7/n")) == "7");
}

TEST_CASE("relay store: a Gloo group of two processes' worth of ranks forms and all-reduces", "[store]") {
  ob::testing::RelayHarness h;
  const int world = 2;
  std::vector<float> sums(world, 0);
  std::vector<std::string> errors(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      try {
        auto store = c10::make_intrusive<RelayStore>(h.NewClient(), milliseconds(20000));
        auto prefixed = c10::make_intrusive<c10d::PrefixStore>("ob/gen/1/test-group", store);
        auto pg = ob::compat::MakeProcessGroup(prefixed, r, world, torch::kCPU, milliseconds(20000));
        std::vector<at::Tensor> t{torch::full({4}, static_cast<float>(r + 1))};
        pg->allreduce(t)->wait();
        sums[static_cast<size_t>(r)] = t[0][0].item<float>();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = ob::FirstLine(e.what());
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r << ": " << errors[static_cast<size_t>(r)]);
    CHECK(errors[static_cast<size_t>(r)].empty());
    CHECK(sums[static_cast<size_t>(r)] == 3.0f);
  }
}
