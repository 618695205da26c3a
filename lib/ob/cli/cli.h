// Behaviour shared by every ob tool (STYLE "Tools people enjoy"):
// common flags declared once, --help to stdout (exit 0), usage errors as one
// line ending "(try 'ob-x --help')" (exit 64), --version [-v], Status → exit code,
// and exceptions caught at the door (exit 70).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ob/cli/config.h"
#include "ob/status.h"

namespace ob::cli {

struct CommonOptions {
  std::string output = "-";   // -o FILE; "-" is stdout
  bool json = false;          // --json: protobuf's JSON mapping instead of binary
  int verbose = 0;            // -v (repeatable)
  bool quiet = false;         // -q
  bool version = false;       // --version
  std::string log_file;       // --log-file FILE
};

// A file a command line names, for CheckFiles: `what` says which to the
// user ("the profile", "--data", "-o").
struct NamedFile {
  std::string what;
  std::string path;
};

// kUsage when a file written (`writes`) is a file read (`reads`) or another
// file written, through symbolic and hard links: "writing -o prof.pb would
// destroy the input prof.pb (the profile): name another file". Only
// existing regular files can be one (io::RegularFileId): "-", "", devices
// and pipes never match. kUsage too when two reads are "-" (standard input
// can be read once).
Status CheckFiles(const std::vector<NamedFile>& reads, const std::vector<NamedFile>& writes);

struct Tool {
  std::string name;           // "profile" → binary ob-profile
  std::string description;    // one line for --help
  // Declares the tool's own options on `app` (common ones already exist).
  std::function<void(CLI::App& app)> setup;
  // Runs after a successful parse.
  std::function<Status(const CommonOptions&)> run;
  // Optional: more lines for --version -v (after the build's), e.g. what the
  // tool would run on here with the options given.
  std::function<std::string()> version_details = nullptr;
  // Optional: the files the parsed command line reads, and those it writes
  // besides -o and --log-file. Main checks them with CheckFiles before any
  // is opened (a plan written over its profile, metrics over the training
  // data, a log appended to a plan: exit 64, nothing touched).
  std::function<std::vector<NamedFile>()> reads = nullptr;
  std::function<std::vector<NamedFile>()> writes = nullptr;
  // Optional: the tool takes its options from a YAML file too (config.h):
  // Main declares --config FILE and --print-config, applies the file after
  // the command line (whose options win), and prints the options in effect
  // for --print-config. A usage error the run returns about an option the
  // file set names the file and line, and exits 78 (kConfig).
  std::optional<ConfigSpec> config = std::nullopt;
};

// Parses argv, handles help/version/usage errors, runs the tool, reports a
// failed Status as "ob-NAME: message" on stderr, returns the exit code.
int Main(int argc, char** argv, const Tool& tool);

// "ob-NAME 0.1.0 (git describe)"
std::string VersionLine(const std::string& name);
// Multi-line build details: LibTorch, CUDA, NCCL, protobuf, compiler.
std::string VersionDetails();

// The input to read: `given` if set; "-" when stdin is not a terminal;
// otherwise kUsage "no input: give FILE or pipe one in" (with `what`).
Result<std::string> InputPath(const std::string& given, const std::string& what);

// Splits "1,2,4" into positive integers; kUsage naming `flag` on bad input.
Result<std::vector<int>> ParseIntList(const std::string& text, const std::string& flag);

// A command of a tool with several (ob-ckpt ls, ob-data tokenize): a
// subcommand after which the common options (-o, --json, -q, ...) still work.
CLI::App* AddCommand(CLI::App& app, const std::string& name, const std::string& what);

// Validators whose messages read as ours ("must be positive"), not
// CLI11's ("Value -3 not in range 0 to 1.797…e308").
CLI::Validator Positive();
CLI::Validator NonNegative();
// A timeout: positive and at most 1,000,000 s, so that its milliseconds fit
// a 64-bit count ("'1e300' must be a positive number of seconds, at most
// 1000000").
CLI::Validator Seconds();

}  // namespace ob::cli
