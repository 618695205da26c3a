// cli/config.h: YAML config files over a CLI11 command line (ob-launch --config).
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "ob/cli/cli.h"
#include "ob/cli/config.h"

using ob::Code;
using ob::cli::ConfigValue;

namespace {

// A small command line with one option of each kind a tool has.
struct Flags {
  std::string plan;
  int64_t steps = 100;
  double lr = 1e-3;
  std::string data = "synthetic";
  std::string device = "auto";
  int eval_every = 0;
  std::vector<std::string> inject;
  bool resume_from_other = false;
  int verbose = 0;
  int rank = -1;
};

struct Tool {
  Flags f;
  CLI::App app{"test", "ob-test"};
  std::vector<ob::cli::ConfigKey> keys;
  ob::cli::ConfigSpec spec;

  explicit Tool(std::vector<std::string> argv = {}) {
    app.add_flag("-v,--verbose", f.verbose);  // a common option, declared first (cli.cc Main)
    app.add_option("PLAN", f.plan);
    app.add_option("--steps", f.steps)->check(ob::cli::NonNegative());
    app.add_option("--lr", f.lr);
    app.add_option("--data", f.data);
    app.add_option("--device", f.device)->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    app.add_option("--eval-every", f.eval_every);
    app.add_option("--inject", f.inject)->allow_extra_args(false);
    app.add_flag("--resume-from-other", f.resume_from_other);
    app.add_option("--rank", f.rank)->group("");
    spec.sections = {{"optimizer", "", {"lr"}}, {"eval", "eval-", {}}};
    argv.insert(argv.begin(), "ob-test");
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    app.parse(static_cast<int>(args.size()), args.data());
    keys = ob::cli::ConfigKeys(app, spec);
  }

  ob::Status Apply(const std::string& text, ob::cli::ConfigOrigins* origins = nullptr) {
    auto values = ob::cli::ReadConfig(text, "run.yaml", spec);
    if (!values.ok()) return values.status();
    return ob::cli::ApplyConfig(*values, keys, "run.yaml", origins);
  }
};

std::vector<std::string> Paths(const std::vector<ob::cli::ConfigKey>& keys) {
  std::vector<std::string> out;
  for (const auto& k : keys) out.push_back(k.Path());
  return out;
}

}  // namespace

TEST_CASE("config keys: positionals first in lower case, long names, sections, no hidden or built-in ones") {
  Tool t;
  CHECK(Paths(t.keys) == std::vector<std::string>{"plan", "verbose", "steps", "optimizer.lr", "data", "device",
                                                   "eval.every", "inject", "resume-from-other"});
}

TEST_CASE("ReadConfig: keys with their lines, sections as dotted keys, lists item by item") {
  ob::cli::ConfigSpec spec;
  spec.sections = {{"eval", "eval-", {}}};
  auto v = ob::cli::ReadConfig("steps: 20\n\neval:\n  every: 5\ninject:\n  - a\n  - b\ndata:\n", "run.yaml", spec);
  REQUIRE(v.ok());
  REQUIRE(v->size() == 4);
  CHECK(((*v)[0].key == "steps" && (*v)[0].line == 1 && (*v)[0].items == std::vector<std::string>{"20"}));
  CHECK(((*v)[1].key == "eval.every" && (*v)[1].line == 4));
  CHECK(((*v)[2].kind == ConfigValue::Kind::kList && (*v)[2].item_lines == std::vector<int>{6, 7}));
  CHECK(((*v)[3].key == "data" && (*v)[3].kind == ConfigValue::Kind::kNull));
  CHECK(ob::cli::ReadConfig("", "run.yaml", spec)->empty());
}

TEST_CASE("ReadConfig: malformed files are one line naming the file and line") {
  ob::cli::ConfigSpec spec;
  spec.sections = {{"eval", "eval-", {}}};
  auto error = [&](const std::string& text) {
    auto v = ob::cli::ReadConfig(text, "run.yaml", spec);
    REQUIRE(!v.ok());
    CHECK(v.status().code() == Code::kConfig);
    return v.status().message();
  };
  CHECK(error("steps: 1\ndata: [a\n").rfind("run.yaml:3: ", 0) == 0);  // the flow list never closes
  CHECK(error("steps: 1\nsteps: 2\n") == "run.yaml:2: steps is given twice (line 1 too)");
  CHECK(error("- steps\n") == "run.yaml:1: expected a mapping of options (steps: 200, ...), not a list");
  CHECK(error("steps: 1\neval: 5\n") ==
        "run.yaml:2: eval: expected a mapping of its options (eval:, then indented keys), not a value");
  CHECK(error("inject:\n  - a\n  - {b: 1}\n") == "run.yaml:3: inject: expected a list of values, not of mappings");
}

TEST_CASE("ApplyConfig: the file's values through the options, the command line winning") {
  Tool t({"--steps", "7", "--inject", "x", "plan.pb"});
  ob::cli::ConfigOrigins origins;
  REQUIRE(t.Apply("plan: other.pb\nsteps: 20\noptimizer:\n  lr: 3e-4\neval:\n  every: 5\n"
                  "inject: [a, b]\nresume-from-other: true\nverbose: 2\ndevice: ~\n",
                  &origins)
              .ok());
  CHECK(t.f.plan == "plan.pb");
  CHECK(t.f.steps == 7);
  CHECK(t.f.lr == 3e-4);
  CHECK(t.f.eval_every == 5);
  CHECK(t.f.inject == std::vector<std::string>{"x"});  // replaced, not merged
  CHECK(t.f.resume_from_other);
  CHECK(t.f.verbose == 2);
  CHECK(t.f.device == "auto");
  CHECK(origins == ob::cli::ConfigOrigins{{"lr", "run.yaml:4"},
                                          {"eval-every", "run.yaml:6"},
                                          {"resume-from-other", "run.yaml:8"},
                                          {"verbose", "run.yaml:9"}});
}

TEST_CASE("ApplyConfig: unknown keys, wrong types and bad values name the file, line and key") {
  auto error = [](const std::string& text) {
    Tool t;
    ob::Status st = t.Apply(text);
    REQUIRE(!st.ok());
    CHECK(st.code() == Code::kConfig);
    return st.message();
  };
  CHECK(error("data: a\nstpes: 3\n") == "run.yaml:2: unknown key 'stpes' (did you mean 'steps'?)");
  CHECK(error("eval-every: 3\n") == "run.yaml:1: unknown key 'eval-every' (did you mean 'eval.every'?)");
  CHECK(error("rank: 3\n") == "run.yaml:1: unknown key 'rank' (--print-config lists the keys)");
  CHECK(error("eval:\n  evry: 3\n") == "run.yaml:2: unknown key 'eval.evry' (did you mean 'eval.every'?)");
  CHECK(error("steps: abc\n") == "run.yaml:1: steps: 'abc' is not an integer");
  CHECK(error("steps: [1, 2]\n") == "run.yaml:1: steps: expected an integer, not a list");
  CHECK(error("data:\n  a: 1\n") == "run.yaml:1: data: expected a value, not a mapping");
  CHECK(error("optimizer:\n  lr: fast\n") == "run.yaml:2: optimizer.lr: 'fast' is not a number");
  CHECK(error("resume-from-other: yes\n") == "run.yaml:1: resume-from-other: 'yes' is not true or false");
  CHECK(error("verbose: -1\n") == "run.yaml:1: verbose: '-1' is not a count");
  CHECK(error("\nsteps: -3\n") == "run.yaml:2: steps: '-3' must not be negative");
  CHECK(error("device: gpu\n") == "run.yaml:1: device: gpu not in {auto,cpu,cuda}");
  CHECK(error("eval:\n  every: 99999999999\n") == "run.yaml:2: eval.every: '99999999999' is out of range");
  // A key the command line overrides is still checked for its type.
  Tool t({"--steps", "3"});
  CHECK(t.Apply("steps: abc\n").message() == "run.yaml:1: steps: 'abc' is not an integer");
}

TEST_CASE("ConfigText: every key, values as given, defaults, and read back to the same text") {
  Tool t({"--lr", "3e-4", "--inject", "0:hang=5", "--inject", "1:slow=2", "-vv", "--data", "ip netns exec {host}"});
  const std::string text = ob::cli::ConfigText(t.keys);
  CHECK(text ==
        "plan: ~\nverbose: 2\nsteps: 100\noptimizer:\n  lr: 3e-4\ndata: ip netns exec {host}\ndevice: auto\n"
        "eval:\n  every: 0\ninject:\n  - 0:hang=5\n  - 1:slow=2\nresume-from-other: false\n");
  Tool back;
  REQUIRE(back.Apply(text).ok());
  CHECK(back.f.lr == 3e-4);
  CHECK(back.f.inject == t.f.inject);
  CHECK(back.f.verbose == 2);
  CHECK(back.f.data == t.f.data);
  CHECK(ob::cli::ConfigText(back.keys) == text);
}

TEST_CASE("ConfigOriginOf: the file's line for a usage error about an option it set") {
  const ob::cli::ConfigOrigins origins{{"min-lr", "run.yaml:5"}};
  CHECK(ob::cli::ConfigOriginOf("--min-lr 0.5: must be between 0 and --lr", origins) == "run.yaml:5");
  CHECK(ob::cli::ConfigOriginOf("--lr 0: must be positive", origins).empty());
  CHECK(ob::cli::ConfigOriginOf("no plan: give plan.pb", origins).empty());
}
