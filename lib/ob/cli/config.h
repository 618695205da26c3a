// Options from a YAML file: `ob-launch --config run.yaml`. A tool takes one
// by setting Tool::config (cli.h); Main then declares --config FILE and
// --print-config and calls what is here.
//
// A file is a mapping. Its keys are the tool's visible long options by name
// ("steps: 200" is --steps 200), its positionals in lower case ("plan:
// plan.pb"), and sections that group options ("eval:" with "every: 50" is
// --eval-every 50). Flags take true or false, a count flag (-v) a count,
// an option that repeats a list. A key with no value (or ~) leaves the
// option at its default. Hidden options, --help, --version, --config and
// --print-config are no keys.
//
// The command line wins: an option it gave keeps its value, and a list
// given there replaces the file's. Every other key's value goes through its
// option's own conversion and checks, as on the command line. Relative paths
// in a file are relative to the current directory, as on the command line.
//
// Errors are kConfig, one line "FILE:LINE: KEY: what is wrong", except a
// file that cannot be read (kNoInput). Not thread-safe: it sets the
// options of a CLI::App, once, after App::parse.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ob/status.h"

namespace ob::cli {

// A key of a config file whose value is a mapping of options.
struct ConfigSection {
  std::string name;                  // "eval"
  std::string prefix;                // options --PREFIXkey are key "key" of it ("eval-": --eval-every is every)
  std::vector<std::string> options;  // and these, under their own names (--lr is optimizer: lr)
};

// What a tool's config files hold besides one key per option.
struct ConfigSpec {
  std::vector<ConfigSection> sections;
  std::vector<std::string> omit;  // visible options that are no key (ob-launch: output, json)
};

// An option and its key.
struct ConfigKey {
  CLI::Option* option = nullptr;
  std::string section;  // "" at the top level
  std::string name;     // its key in the section
  std::string Path() const { return section.empty() ? name : section + "." + name; }
};

// The keys of `app`'s options: the positionals, then the others in the
// order they were declared. REQUIRES:
// the options are declared; the ConfigKeys point into `app`, which
// outlives them.
std::vector<ConfigKey> ConfigKeys(CLI::App& app, const ConfigSpec& spec);

// A key's value as a file gives it.
struct ConfigValue {
  enum class Kind { kNull, kScalar, kList, kMap };
  std::string key;  // "steps", "eval.every"
  int line = 0;     // of the key, from 1
  Kind kind = Kind::kNull;
  std::vector<std::string> items;  // the scalar, or each item of the list
  std::vector<int> item_lines;     // each item's line
};

// The values of YAML `text` read from `path`, in the file's order. kConfig
// "PATH:LINE: ..." for a YAML syntax error, a document that is not a
// mapping, a key that is not a word or is given twice, a section of `spec`
// whose value is not a mapping, and a list item that is not a value.
// Names no option: ApplyConfig says which keys are unknown.
Result<std::vector<ConfigValue>> ReadConfig(const std::string& text, const std::string& path,
                                            const ConfigSpec& spec);

// Where the file set each option it set: "run.yaml:7", by the option's
// long name ("steps"; a positional's name, "PLAN").
using ConfigOrigins = std::map<std::string, std::string>;

// Gives each option of `keys` that the command line did not give the
// value `values` has for it. kConfig "PATH:LINE: KEY: ..." for an unknown
// key (with the nearest known one), a value of the wrong type (a list or a
// mapping for a single value, "abc" for a number, "yes" for a flag; checked
// for options the command line gave too), and a value the option's checks
// refuse. Records in `origins` (may be null) what it set.
Status ApplyConfig(const std::vector<ConfigValue>& values, const std::vector<ConfigKey>& keys,
                   const std::string& path, ConfigOrigins* origins);

// Reads `path` ("-": standard input) and applies it: kNoInput when it
// cannot be read, else as ReadConfig and ApplyConfig.
Status LoadConfig(const std::string& path, const ConfigSpec& spec, const std::vector<ConfigKey>& keys,
                  ConfigOrigins* origins);

// The options of `keys` as a config file, every key present: a value given
// (on the command line or by a file) as it was given, else the option's
// default (~ for an empty one). LoadConfig reads it back to the same
// options, and ConfigText of those is the same text.
std::string ConfigText(const std::vector<ConfigKey>& keys);

// Where the option a usage error names first came from: "run.yaml:7" when
// `message` starts with --NAME and the file set --NAME, else "". For the
// checks a tool makes across options after parsing ("--min-lr 0.5: must be
// between 0 and --lr"), which then point into the file too.
std::string ConfigOriginOf(const std::string& message, const ConfigOrigins& origins);

}  // namespace ob::cli
