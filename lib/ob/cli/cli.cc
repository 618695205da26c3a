#include "ob/cli/cli.h"

#include <google/protobuf/stubs/common.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <optional>
#include <sstream>

#include "ob/build_info.h"
#include "ob/git_describe.h"
#include "ob/io/file.h"
#include "ob/log.h"

namespace ob::cli {
namespace {

std::string ProtobufVersion() {
  int v = GOOGLE_PROTOBUF_VERSION;  // e.g. 3021012
  return std::to_string(v / 1000000) + "." + std::to_string(v / 1000 % 1000) + "." +
         std::to_string(v % 1000);
}

// One line on stderr in one write(2): several processes that fail at once
// into one pipe (every agent of a job, say) leave whole lines, where
// std::cerr's piece-by-piece writes interleaved them mid-line.
void ErrorLine(const std::string& line) { (void)io::WriteAll(STDERR_FILENO, line + "\n", "<stderr>"); }

void UsageError(const std::string& bin, const std::string& message) {
  ErrorLine(bin + ": " + message + " (try '" + bin + " --help')");
}

}  // namespace

namespace {

// The finite number `v` spells (all of it), or NaN: "inf" and "nan" are not
// a count, a size or a time.
double Number(const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v.c_str(), &end);
  return v.empty() || end != v.c_str() + v.size() || errno != 0 || !std::isfinite(x) ? std::nan("") : x;
}

}  // namespace

CLI::Validator Positive() {
  return CLI::Validator(
      [](std::string& v) {
        const double x = Number(v);
        if (x > 0) return std::string();
        return "'" + v + (std::isnan(x) ? "' is not a finite number" : "' must be a positive number");
      },
      "POSITIVE");
}

CLI::Validator Seconds() {
  return CLI::Validator(
      [](std::string& v) {
        const double x = Number(v);
        if (x > 0 && x <= 1e6) return std::string();
        return "'" + v + (std::isnan(x) ? "' is not a finite number" : "' must be a positive number of seconds, at most 1000000");
      },
      "SECONDS");
}

CLI::Validator NonNegative() {
  return CLI::Validator(
      [](std::string& v) {
        const double x = Number(v);
        if (x >= 0) return std::string();
        return "'" + v + (std::isnan(x) ? "' is not a finite number" : "' must not be negative");
      },
      "NONNEGATIVE");
}

std::string VersionLine(const std::string& name) {
  std::string line = "ob-" + name + " " OB_VERSION;
  std::string git = OB_GIT_DESCRIBE;
  if (!git.empty()) line += " (" + git + ")";
  return line;
}

std::string VersionDetails() {
  std::ostringstream os;
  std::string nccl = OB_NCCL_VERSION;
  std::string cuda = OB_CUDA_VERSION;
  os << "libtorch: " OB_TORCH_VERSION "\n"
     << "cuda: " << (nccl.empty() ? "none (CPU build)" : (cuda.empty() ? "yes" : cuda)) << "\n"
     << "nccl: " << (nccl.empty() ? "none (CPU build)" : nccl) << "\n"
     << "gloo: yes\n"
     << "protobuf: " << ProtobufVersion() << "\n"
     << "compiler: " OB_COMPILER "\n"
     << "build: " OB_BUILD_TYPE "\n";
  return os.str();
}

namespace {

// --config FILE and --print-config, for a tool with Tool::config.
struct ConfigFlags {
  std::string path;
  bool print = false;
};

// app.parse, and --help: an exit code when Main is done.
std::optional<int> Parse(CLI::App& app, int argc, char** argv, const std::string& bin) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    return 0;
  } catch (const CLI::ParseError& e) {
    UsageError(bin, e.what());
    return static_cast<int>(Code::kUsage);
  }
  return std::nullopt;
}

// The file of --config over the options the command line left, and
// --print-config: an exit code when Main is done.
std::optional<int> ApplyConfigFlags(CLI::App& app, const Tool& tool, const ConfigFlags& flags,
                                    ConfigOrigins* origins) {
  if (!tool.config) return std::nullopt;
  const std::vector<ConfigKey> keys = ConfigKeys(app, *tool.config);
  if (!flags.path.empty()) {
    if (Status st = LoadConfig(flags.path, *tool.config, keys, origins); !st.ok()) {
      ErrorLine("ob-" + tool.name + ": " + st.message());
      return st.exit_code();
    }
  }
  if (!flags.print) return std::nullopt;
  std::cout << ConfigText(keys);
  return 0;
}

// A failed run's line on stderr and its exit code. A usage error about an
// option a config file set is that file's: its line, and kConfig.
int ReportFailure(const std::string& bin, const Status& st, const ConfigOrigins& origins) {
  if (st.code() != Code::kUsage) {
    ErrorLine(bin + ": " + st.message());
    return st.exit_code();
  }
  if (const std::string where = ConfigOriginOf(st.message(), origins); !where.empty()) {
    ErrorLine(bin + ": " + where + ": " + st.message());
    return static_cast<int>(Code::kConfig);
  }
  UsageError(bin, st.message());
  return st.exit_code();
}

}  // namespace

int Main(int argc, char** argv, const Tool& tool) {
  const std::string bin = "ob-" + tool.name;
  CLI::App app(tool.description, bin);
  app.get_formatter()->column_width(34);
  CommonOptions common;
  app.add_option("-o,--output", common.output, "Write to FILE ('-' is stdout, the default)")
      ->option_text("FILE");
  app.add_flag("--json", common.json, "Write protobuf's JSON mapping instead of binary");
  app.add_flag("-v,--verbose", common.verbose, "More log output (repeatable)");
  app.add_flag("-q,--quiet", common.quiet, "Only errors on stderr");
  app.add_option("--log-file", common.log_file, "Also append log lines to FILE")->option_text("FILE");
  app.add_flag("--version", common.version, "Print the version (with -v: library versions) and exit");
  ConfigFlags config;
  if (tool.config) {
    app.add_option("--config", config.path, "Read options from a YAML FILE; the command line's win")
        ->option_text("FILE");
    app.add_flag("--print-config", config.print, "Write the options in effect as YAML (for --config) and exit");
  }
  tool.setup(app);
  if (std::optional<int> rc = Parse(app, argc, argv, bin)) return *rc;
  ConfigOrigins origins;
  if (std::optional<int> rc = ApplyConfigFlags(app, tool, config, &origins)) return *rc;

  if (common.version) {
    std::cout << VersionLine(tool.name) << "\n";
    if (common.verbose > 0) std::cout << VersionDetails();
    if (common.verbose > 0 && tool.version_details) std::cout << tool.version_details();
    return 0;
  }
  {
    std::vector<NamedFile> reads, writes;
    if (tool.reads) reads = tool.reads();
    if (tool.config) reads.push_back({"--config", config.path});
    if (tool.writes) writes = tool.writes();
    writes.push_back({"-o", common.output});
    writes.push_back({"--log-file", common.log_file});
    if (Status st = CheckFiles(reads, writes); !st.ok()) {
      UsageError(bin, st.message());
      return static_cast<int>(Code::kUsage);
    }
  }
  log::Init(tool.name);
  log::SetLevel(common.quiet ? log::Level::kError
                             : (common.verbose > 0 ? log::Level::kDebug : log::Level::kInfo));
  if (!log::SetFile(common.log_file)) {
    ErrorLine(bin + ": " + common.log_file + ": cannot open log file");
    return static_cast<int>(Code::kIoErr);
  }

  // An interrupted tool leaves no temporary output behind (ob-data's was as
  // large as what it had tokenized).
  io::RemoveTemporariesOnSignal();
  Status st;
  try {
    st = tool.run(common);
  } catch (const std::exception& e) {
    st = Status::Internal("internal error: " + FirstLine(e.what()));
  }
  // A log file that stopped taking lines (a full disk) is said again at the
  // end, where it is read; the status stays the run's: a log is a record.
  if (const std::string lost = log::FileLost(); !lost.empty()) log::Write(log::Level::kWarn, lost);
  if (st.ok()) return 0;
  return ReportFailure(bin, st, origins);
}

Status CheckFiles(const std::vector<NamedFile>& reads, const std::vector<NamedFile>& writes) {
  // Standard input is one stream: the second reader would find it empty.
  const NamedFile* stdin_reader = nullptr;
  for (const NamedFile& r : reads) {
    if (r.path != "-") continue;
    if (stdin_reader != nullptr) {
      return Status::Usage(stdin_reader->what + " and " + r.what +
                           " are both '-', standard input, which only one can read: name a file for the other");
    }
    stdin_reader = &r;
  }
  std::vector<std::optional<io::FileId>> read_ids;
  for (const NamedFile& r : reads) read_ids.push_back(io::RegularFileId(r.path));
  std::vector<std::string> keys;  // each write's io::OutputKey, compared with those before it
  for (const NamedFile& w : writes) {
    if (const auto id = io::RegularFileId(w.path)) {
      for (size_t k = 0; k < reads.size(); ++k) {
        if (!read_ids[k] || !(*read_ids[k] == *id)) continue;
        const NamedFile& r = reads[k];
        return Status::Usage("writing " + w.what + " " + w.path + " would destroy the input " + r.path + " (" +
                             r.what + (r.path == w.path ? "" : ": the same file") + "): name another file");
      }
    }
    const std::string key = io::OutputKey(w.path);
    for (size_t j = 0; j < keys.size() && !key.empty(); ++j) {
      if (key == keys[j]) {
        return Status::Usage(writes[j].what + " " + writes[j].path + " and " + w.what + " " + w.path +
                             " are one file: one would overwrite the other; name two files");
      }
    }
    keys.push_back(key);
  }
  return Status::Ok();
}

Result<std::string> InputPath(const std::string& given, const std::string& what) {
  if (!given.empty()) return given;
  if (!io::StdinIsTerminal()) return std::string("-");
  return Status::Usage("no input: give a " + what + " FILE or pipe one in");
}

Result<std::vector<int>> ParseIntList(const std::string& text, const std::string& flag) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      int v = std::stoi(item, &used);
      if (used != item.size() || v <= 0) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      return Status::Usage(flag + ": '" + item + "' is not a positive integer");
    }
  }
  if (out.empty()) return Status::Usage(flag + ": empty list");
  return out;
}

CLI::App* AddCommand(CLI::App& app, const std::string& name, const std::string& what) {
  CLI::App* sub = app.add_subcommand(name, what);
  sub->fallthrough();
  return sub;
}

}  // namespace ob::cli
