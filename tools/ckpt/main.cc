// ob-ckpt: list, show, verify, export, import and prune checkpoint directories.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <vector>

#include "ob/ckpt/checkpoint.h"
#include "ob/ckpt/hf.h"
#include "ob/cli/cli.h"
#include "ob/cli/progress.h"
#include "ob/clock.h"
#include "ob/io/file.h"
#include "ob/io/message.h"
#include "ob/log.h"
#include "ob/model/config.h"

namespace {

struct Options {
  std::string path;             // DIR, or a checkpoint directory
  bool with_optimizer = false;  // export: Adam moments too
  int keep = 0;                 // prune: complete checkpoints to keep
  std::string format = "ob";    // export: "ob" (one safetensors file) or "hf"
  std::string max_shard_size = "5GB";  // export --format hf: as HF's save_pretrained
  std::string model;            // import: the ob model (preset or config) it is
  int64_t step = 0;             // import: the step it counts as
};

Options g;
CLI::App* g_ls = nullptr;
CLI::App* g_show = nullptr;
CLI::App* g_verify = nullptr;
CLI::App* g_export = nullptr;
CLI::App* g_prune = nullptr;
CLI::App* g_import = nullptr;

std::string HumanBytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  else std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string BaseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// A checkpoint directory (rather than a root holding them): it has a
// manifest, or is named like one (step-<digits>[.partial]).
bool IsCheckpointDir(const std::string& path) {
  struct stat st;
  if (stat((path + "/manifest.pb").c_str(), &st) == 0) return true;
  std::string name = BaseName(path);
  if (name.rfind("step-", 0) != 0) return false;
  name = name.substr(5, name.find('.') == std::string::npos ? std::string::npos : name.find('.') - 5);
  return !name.empty() && name.find_first_not_of("0123456789") == std::string::npos;
}

// The checkpoint PATH means: itself, or the one to resume from under it.
ob::Result<std::string> ResolveCheckpoint(const std::string& path) {
  if (IsCheckpointDir(path)) return path;
  return ob::ckpt::Latest(path);
}

// "ob-ckpt: verify step-40: 1.2 GiB of 2.9 GiB (42%, 12 s left)" on stderr
// (cli/progress.h: redrawn on a terminal, a line every few seconds
// otherwise, nothing with -q).
class ProgressBar {
 public:
  ProgressBar(std::string what, bool quiet) : what_(std::move(what)), line_("ob-ckpt", quiet) {}
  ob::ckpt::Progress Callback() {
    if (!line_.on()) return {};
    return [this](uint64_t done, uint64_t total) {
      line_.Update(static_cast<double>(done), static_cast<double>(total),
                   what_ + ": " + HumanBytes(done) + " of " + HumanBytes(total));
    };
  }

 private:
  std::string what_;
  ob::cli::ProgressLine line_;
};

ob::Status Ls(const ob::cli::CommonOptions& common) {
  OB_ASSIGN_OR_RETURN(auto all, ob::ckpt::List(g.path));
  std::string out;
  if (common.json) {
    for (const auto& c : all)
      out += "{\"step\":" + std::to_string(c.step) + ",\"path\":" + JsonString(c.path) +
             ",\"bytes\":" + std::to_string(c.bytes) +
             ",\"complete\":" + (c.complete ? "true" : "false") +
             ",\"latest\":" + (c.latest ? "true" : "false") +
             (c.refuted.empty() ? "" : ",\"refuted\":" + JsonString(c.refuted)) + "}\n";
    return ob::io::WriteFile(common.output, out);
  }
  char line[512];
  out += "# checkpoints in " + g.path + " (* = latest)\n";
  std::snprintf(line, sizeof line, "#%13s  %10s  %-12s %s\n", "step", "size", "state", "directory");
  out += line;
  int complete = 0, refuted = 0;
  for (const auto& c : all) {
    complete += c.complete;
    refuted += !c.refuted.empty();
    std::snprintf(line, sizeof line, "%14lld  %10s  %-10s %s %s\n", static_cast<long long>(c.step),
                  HumanBytes(c.bytes).c_str(),
                  !c.refuted.empty() ? "refuted" : c.complete ? "complete" : "incomplete", c.latest ? "*" : " ",
                  BaseName(c.path).c_str());
    out += line;
    if (!c.refuted.empty()) out += "#   refuted: " + c.refuted + "\n";
  }
  out += "# " + std::to_string(all.size()) + " checkpoint" + (all.size() == 1 ? "" : "s") + ", " +
         std::to_string(complete) + " complete" +
         (refuted ? ", " + std::to_string(refuted) + " of them refuted" : std::string()) + "\n";
  return ob::io::WriteFile(common.output, out);
}

std::string ManifestText(const std::string& path, const ob::pb::Manifest& m) {
  std::string out;
  char line[512];
  auto row = [&](const char* key, const std::string& value) {
    std::snprintf(line, sizeof line, "%-12s ", key);  // a value of any length after it
    out += line + value + "\n";
  };
  uint64_t bytes = 0;
  for (const auto& f : m.files()) bytes += f.size();
  const auto& mc = m.model();
  row("checkpoint", path);
  row("step", std::to_string(m.step()));
  row("model", (mc.name().empty() ? std::string("(unnamed)") : mc.name()) + ": " +
                   std::to_string(mc.n_layer()) + " blocks, h " + std::to_string(mc.n_embd()) +
                   ", " + std::to_string(mc.n_head()) + " heads, context " +
                   std::to_string(mc.n_positions()) + ", vocabulary " +
                   std::to_string(mc.vocab_size()));
  row("layers", std::to_string(m.num_layers()));
  row("data", "seed " + std::to_string(m.data_seed()) + ", " + std::to_string(m.samples_seen()) +
                  " samples seen");
  row("created", ob::FormatUtcSeconds(static_cast<int64_t>(m.created_unix_ms())));
  row("plan", m.plan().empty() ? "none" : std::to_string(m.plan().size()) + " bytes");
  row("written by", m.ob_version().empty() ? "?" : "ob " + m.ob_version());
  row("files", std::to_string(m.files_size()) + ", " + HumanBytes(bytes));
  for (const auto& u : m.unchecked()) {
    row("unchecked", u.flag() + " on host " + u.host() + " was still being compared with the job's");
  }
  if (const std::string why = ob::ckpt::RefutedWhy(path); !why.empty()) row("refuted", why);
  std::snprintf(line, sizeof line, "#%-11s %10s  %-21s  %s\n", "layers", "size", "checksum", "path");
  out += line;
  for (const auto& f : m.files()) {
    std::string layers;
    for (int i = 0; i < f.layers_size(); ++i) layers += (i ? "," : "") + std::to_string(f.layers(i));
    std::snprintf(line, sizeof line, " %-11s %10s  %-21s  %s\n", layers.c_str(),
                  HumanBytes(f.size()).c_str(), f.checksum().c_str(), f.path().c_str());
    out += line;
  }
  return out;
}

ob::Status Show(const ob::cli::CommonOptions& common) {
  OB_ASSIGN_OR_RETURN(std::string path, ResolveCheckpoint(g.path));
  OB_ASSIGN_OR_RETURN(auto m, ob::ckpt::LoadManifest(path));
  if (common.json) return ob::io::WriteFile(common.output, ob::io::ToJson(m));
  return ob::io::WriteFile(common.output, ManifestText(path, m));
}

// Damage is the expected "no" of verify (exit 1); other failures keep theirs.
ob::Status AsNo(const ob::Status& s) {
  return s.code() == ob::Code::kDataErr ? ob::Status(ob::Code::kNo, s.message()) : s;
}

ob::Status VerifyCmd(const ob::cli::CommonOptions& common) {
  std::vector<std::string> targets;
  if (IsCheckpointDir(g.path)) {
    targets.push_back(g.path);
  } else {
    OB_ASSIGN_OR_RETURN(auto all, ob::ckpt::List(g.path));
    for (const auto& c : all)
      if (BaseName(c.path).find('.') == std::string::npos) targets.push_back(c.path);  // not .partial
    if (targets.empty()) return ob::Status::NoInput(g.path + ": no checkpoints to verify");
  }
  uint64_t files = 0, bytes = 0;
  std::vector<ob::Status> damage;
  for (const auto& t : targets) {
    ProgressBar bar("verify " + BaseName(t), common.quiet);
    ob::Status s = ob::ckpt::Verify(t, bar.Callback());
    if (!s.ok()) {
      if (s.code() != ob::Code::kDataErr) return s;
      damage.push_back(AsNo(s));
      continue;
    }
    auto m = ob::ckpt::LoadManifest(t);
    if (!m.ok()) return m.status();
    files += static_cast<uint64_t>(m->files_size());
    for (const auto& f : m->files()) bytes += f.size();
  }
  if (!damage.empty()) {
    // One line per damaged checkpoint; the last is reported by the caller.
    for (size_t i = 0; i + 1 < damage.size(); ++i)
      std::fprintf(stderr, "ob-ckpt: %s\n", damage[i].message().c_str());
    return damage.back();
  }
  std::string out = "ok: ";
  if (targets.size() > 1) out += std::to_string(targets.size()) + " checkpoints, ";
  out += std::to_string(files) + " file" + (files == 1 ? "" : "s") + ", " + std::to_string(bytes) +
         " bytes verified\n";
  return ob::io::WriteFile("-", out);
}

// "5GB", "500MB", "64KiB", "1000": bytes (KB, MB, GB decimal as HF's;
// KiB, MiB, GiB binary); kUsage naming --max-shard-size otherwise.
ob::Result<uint64_t> ParseSize(const std::string& text) {
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  const std::pair<const char*, double> units[] = {{"", 1},      {"B", 1},      {"KB", 1e3},         {"MB", 1e6},
                                                  {"GB", 1e9},  {"KiB", 1024}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  for (const auto& [name, scale] : units) {
    if (used > 0 && unit == name && v > 0 && v * scale < 1.8e19) return static_cast<uint64_t>(v * scale);
  }
  return ob::Status::Usage("--max-shard-size '" + text + "': not a positive size such as 5GB, 500MB or 2GiB");
}

ob::Status ExportCmd(const ob::cli::CommonOptions& common) {
  if (g.format == "hf") {
    if (common.output == "-" || common.output.empty())
      return ob::Status::Usage("--format hf writes a directory (model.safetensors, config.json): give -o DIR");
    OB_ASSIGN_OR_RETURN(std::string path, ResolveCheckpoint(g.path));
    OB_ASSIGN_OR_RETURN(uint64_t shard, ParseSize(g.max_shard_size));
    ProgressBar bar("export", common.quiet);
    return ob::ckpt::ExportHf(path, common.output, bar.Callback(), shard);
  }
  if (g.format != "ob") return ob::Status::Usage("--format must be 'ob' or 'hf', not '" + g.format + "'");
  if ((common.output == "-" || common.output.empty()) && ob::io::StdoutIsTerminal())
    return ob::Status::Usage(
        "refusing to write a binary safetensors file to a terminal; use -o FILE or a pipe");
  OB_ASSIGN_OR_RETURN(std::string path, ResolveCheckpoint(g.path));
  ProgressBar bar("export", common.quiet);
  OB_RETURN_IF_ERROR(ob::ckpt::Export(path, common.output, g.with_optimizer, bar.Callback()));
  OB_LOG(Debug) << "exported " << path << " to " << ob::io::DisplayName(common.output, true);
  return ob::Status::Ok();
}

ob::Status PruneCmd(const ob::cli::CommonOptions& common) {
  OB_ASSIGN_OR_RETURN(auto removed, ob::ckpt::Prune(g.path, g.keep));
  std::string out;
  for (const auto& r : removed) out += "removed " + r + "\n";
  if (out.empty()) return ob::Status::Ok();
  return ob::io::WriteFile(common.output, out);
}

// A HuggingFace directory (config.json, model.safetensors or shards with
// their index) of GPT-2 or the Llama family into the checkpoint root -o DIR.
ob::Status ImportCmd(const ob::cli::CommonOptions& common) {
  if (common.output == "-" || common.output.empty())
    return ob::Status::Usage("import writes a checkpoint root: give -o DIR");
  const std::string config = g.path + "/config.json";
  OB_ASSIGN_OR_RETURN(ob::pb::ModelConfig shape, ob::ckpt::ReadHfConfig(config));
  OB_ASSIGN_OR_RETURN(std::vector<std::string> weights, ob::ckpt::HfWeightFiles(g.path));
  ob::pb::ModelConfig model;
  if (!g.model.empty()) {
    OB_ASSIGN_OR_RETURN(ob::model::GptConfig cfg, ob::model::ResolveModel(g.model));
    model = cfg.ToProto();
  } else {  // the preset of that shape, else the directory's own config.json
    for (const std::string& name : ob::model::PresetNames()) {
      ob::pb::ModelConfig p = ob::model::Preset(name)->ToProto();
      ob::pb::ModelConfig s = p;
      s.clear_name();
      if (s.SerializeAsString() == shape.SerializeAsString()) {
        model = p;
        break;
      }
    }
    if (model.name().empty()) {
      OB_ASSIGN_OR_RETURN(ob::model::GptConfig cfg, ob::model::ResolveModel(config));
      model = cfg.ToProto();
    }
  }
  {
    ProgressBar bar("import", common.quiet);
    OB_RETURN_IF_ERROR(ob::ckpt::ImportHf(config, weights, model, common.output, g.step, bar.Callback()));
  }
  return ob::io::WriteFile("-", "imported " + g.path + " as " + model.name() + ", " +
                                    ob::ckpt::StepPath(common.output, g.step) + "\n");
}

ob::Status Run(const ob::cli::CommonOptions& common) {
  if (g_import->parsed()) return ImportCmd(common);
  if (g_ls->parsed()) return Ls(common);
  if (g_show->parsed()) return Show(common);
  if (g_verify->parsed()) return VerifyCmd(common);
  if (g_export->parsed()) return ExportCmd(common);
  if (g_prune->parsed()) return PruneCmd(common);
  return ob::Status::Usage("no command: give ls, show, verify, export, import or prune");
}

// Every file under the command's DIR, for cli::CheckFiles: -o or --log-file
// naming one (or a link to one) would write over a checkpoint's file
// ('ob-ckpt export CKPT -o CKPT/layer-0001.safetensors' replaced a layer of
// the checkpoint it exported and exited 0). Bounded: a root of a million
// files is not walked further.
std::vector<ob::cli::NamedFile> Reads() {
  std::vector<ob::cli::NamedFile> reads;
  if (g.path.empty()) return reads;
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(g.path, ec)) return {{"the input", g.path}};
  const std::string what = g_import->parsed() ? "the imported model" : "the checkpoint";
  for (fs::recursive_directory_iterator it(g.path, fs::directory_options::skip_permission_denied, ec), end;
       !ec && it != end && reads.size() < 1000000; it.increment(ec)) {
    if (it->is_regular_file(ec)) reads.push_back({what, it->path().string()});
  }
  return reads;
}

CLI::App* Command(CLI::App& app, const char* name, const char* what, const char* dir_help) {
  CLI::App* sub = ob::cli::AddCommand(app, name, what);
  sub->add_option("DIR", g.path, dir_help)->required()->option_text(" ");
  return sub;
}

void Setup(CLI::App& app) {
  app.require_subcommand(0, 1);
  g_ls = Command(app, "ls", "List checkpoints: step, size, complete, incomplete or refuted, * for latest",
                 "Checkpoint root directory");
  g_show = Command(app, "show", "Print a checkpoint's manifest (text, or --json)",
                   "A checkpoint, or a root (its latest checkpoint)");
  g_verify = Command(app, "verify", "Recompute checksums; exit 1 naming a damaged file",
                     "A checkpoint, or a root (all its committed checkpoints)");
  g_export = Command(app, "export", "Write one safetensors file of the weights (-o FILE)",
                     "A checkpoint, or a root (its latest checkpoint)");
  g_export->add_flag("--with-optimizer", g.with_optimizer,
                     "Also export the Adam moments (<name>.exp_avg, <name>.exp_avg_sq)");
  g_export->add_option("--format", g.format,
                       "'ob' (one safetensors file, ob's names) or 'hf' (-o DIR: a HuggingFace model, "
                       "model.safetensors and config.json)")
      ->option_text("ob|hf");
  g_export->add_option("--max-shard-size", g.max_shard_size,
                       "--format hf: weights above this go to shards with an index (default 5GB, as HF's)")
      ->option_text("SIZE");
  g_import = Command(app, "import", "Make a checkpoint (-o DIR) of a HuggingFace directory (GPT-2, Llama family)",
                     "A directory with config.json and model.safetensors (or shards and their index)");
  g_import->add_option("--model", g.model,
                       "The ob model it is, a preset or config file (default: the preset of its shape, "
                       "else HF_DIR/config.json)")
      ->option_text("NAME|FILE");
  g_import->add_option("--step", g.step, "The step the weights count as; --resume trains from the next (default 0)")
      ->option_text("N")
      ->check(ob::cli::NonNegative());
  g_prune = Command(app, "prune", "Delete all but the newest K complete checkpoints",
                    "Checkpoint root directory");
  g_prune->add_option("-k,--keep", g.keep, "Complete checkpoints to keep (at least 1)")
      ->required()
      ->option_text("K");
  // After the commands, which would otherwise inherit it.
  app.footer(
      "Each command has its own --help, e.g. 'ob-ckpt export --help'.\n"
      "Examples:\n"
      "  ob-ckpt ls ckpt/\n"
      "  ob-ckpt verify ckpt/step-000000001000\n"
      "  ob-ckpt export ckpt/ -o model.safetensors\n"
      "  ob-ckpt export --format hf ckpt/ -o gpt2-finetuned/\n"
      "  ob-ckpt import gpt2/ -o ckpt/         # then ob-launch --ckpt-dir ckpt --resume auto\n"
      "  ob-ckpt prune ckpt/ --keep 3");
}

}  // namespace

int main(int argc, char** argv) {
  return ob::cli::Main(argc, argv,
                       {"ckpt", "Inspect, verify, export, import and prune checkpoints.", Setup, Run, nullptr,
                        Reads});
}
