// ob-profile: measure or model a GPT's layers, or the links between hosts.
//
// Two programs from this file. ob-profile (no LibTorch) models, measures
// links, prints, and serves --net; to measure layers it runs
// ob-profile-measure, installed beside it, with its own arguments (exec:
// its output and exit status are ob-profile's). ob-profile-measure
// (OB_PROFILE_MEASURE, LibTorch) is the same tool that measures itself.
// Loading Debian's LibTorch costs 0.65 s of CPU, which --analytic, --net
// and printing a profile no longer pay.
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "ob/cli/cli.h"
#include "ob/cli/progress.h"
#include "ob/cluster/hosts.h"
#include "ob/io/file.h"
#include "ob/io/message.h"
#include "ob/log.h"
#include "ob/model/config.h"
#include "ob/profile/analytic.h"
#include "ob/profile/measured.h"
#include "ob/profile/network.h"
#include "ob/profile/profile.h"
#include "ob/profile/table.h"

namespace {

struct Options {
  std::string input;                 // a profile to print
  std::string model;
  std::string device = "cpu";
  std::string microbatches = "1";
  int seq_len = 0;
  int warmup = 2;
  int repeats = 5;
  int allreduce_max = 0;
  int threads = 0;
  int concurrency = 1;
  std::string dtype;                 // --precision (or --dtype): "" is the run's default
  uint64_t seed = 1234;
  bool analytic = false;
  std::string gpu;
  double peak_tflops = 0, mem_gib = 0, efficiency = 0, allreduce_gbps = 0;
  int gpus_per_node = 0;
  bool fused_attention = false;
  bool table = false;
  std::string net_hosts;
  std::string rsh = "ssh";
  std::string agent_exe;
  bool net_agent = false;
};

Options g;
char** g_argv = nullptr;  // ours, for ob-profile-measure

// Whether to profile in bf16: as given (ob-launch's fp32|bf16, or the
// profile's own float32|bfloat16), else as ob-launch would train on the
// device: bf16 on a GPU (and for an analytic GPU), fp32 on the CPU.
bool Bf16(bool analytic) {
  if (g.dtype.empty()) return analytic || g.device.rfind("cuda", 0) == 0;
  const auto p = ob::model::ParsePrecision(g.dtype);  // checked at parsing (Setup)
  return p.ok() && *p == ob::model::Precision::kBf16;
}

void Progress(const std::string& line) { OB_LOG(Info) << line; }

ob::Status PrintProfile(const ob::cli::CommonOptions& common) {
  OB_ASSIGN_OR_RETURN(std::string path, ob::cli::InputPath(g.input, "profile"));
  ob::pb::Profile p;
  OB_RETURN_IF_ERROR(ob::io::LoadMessage(path, ob::io::kProfileFormatVersion, &p));
  if (g.table || (!common.json && common.output == "-" && ob::io::StdoutIsTerminal()))
    return ob::io::WriteFile(common.output, ob::profile::FormatProfile(p));
  return ob::io::WriteMessage(common.output, p, ob::io::kProfileFormatVersion, common.json);
}

ob::Result<ob::pb::Profile> Analytic(const ob::model::GptConfig& cfg) {
  ob::profile::GpuSpec gpu;
  if (!g.gpu.empty()) {
    OB_ASSIGN_OR_RETURN(gpu, ob::profile::FindGpu(g.gpu));
  } else if (g.peak_tflops > 0 && g.mem_gib > 0) {
    gpu.name = "custom";
    gpu.description = "custom GPU";
    gpu.memory_gbps = 2000;
    gpu.allreduce_gbps = 200;
  } else {
    return ob::Status::Usage("--analytic needs --gpu NAME, or --peak-tflops and --mem-gib");
  }
  const bool fp32 = !Bf16(/*analytic=*/true);
  if (g.peak_tflops > 0) (fp32 ? gpu.fp32_tflops : gpu.peak_tflops) = g.peak_tflops;
  if (g.mem_gib > 0) gpu.memory_bytes = static_cast<uint64_t>(g.mem_gib * (1ull << 30));
  if (g.efficiency > 0) gpu.efficiency = g.efficiency;
  if (g.allreduce_gbps > 0) gpu.allreduce_gbps = g.allreduce_gbps;
  if (g.gpus_per_node > 0) gpu.gpus_per_node = g.gpus_per_node;
  ob::profile::AnalyticOptions o;
  o.gpu = gpu;
  OB_ASSIGN_OR_RETURN(o.microbatches, ob::cli::ParseIntList(g.microbatches, "--microbatch"));
  o.seq_len = g.seq_len;
  // The Llama family trains only where SDPA's fused kernels run it (flash
  // or memory-efficient attention keep no score matrix): a 70B block's
  // scores at sequence 8192 would be 21 GiB a micro-batch.
  o.fused_attention = g.fused_attention || cfg.llama();
  o.fp32 = fp32;
  return ob::profile::AnalyticProfile(cfg, o);
}

#ifndef OB_PROFILE_MEASURE
constexpr char kMeasureExeName[] = "ob-profile-measure";

// ob-profile-measure beside this program (the real path: a link to
// ob-profile finds it beside its target).
std::string MeasureExe() { return ob::io::Beside(ob::io::SelfExe(kMeasureExeName), kMeasureExeName); }

// Measuring needs LibTorch: ob-profile-measure does it, with our arguments,
// in this process. Returns only when it cannot be run.
ob::Status Measured(const ob::model::GptConfig&) {
  const std::string exe = MeasureExe();
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(exe.c_str()));
  for (char** a = g_argv + 1; *a != nullptr; ++a) argv.push_back(*a);
  argv.push_back(nullptr);
  std::cout.flush();
  ::execv(exe.c_str(), argv.data());
  return ob::Status::Config("cannot run " + exe + ": " + std::strerror(errno) + " (" + kMeasureExeName +
                            " measures layers; it is installed beside ob-profile)");
}
#else
ob::Result<ob::pb::Profile> Measured(const ob::model::GptConfig& cfg, bool quiet) {
  ob::profile::MeasureOptions o;
  o.device = g.device;
  OB_ASSIGN_OR_RETURN(o.microbatches, ob::cli::ParseIntList(g.microbatches, "--microbatch"));
  o.seq_len = g.seq_len;
  o.warmup = g.warmup;
  o.repeats = g.repeats;
  o.max_group = g.allreduce_max;
  o.threads = g.threads;
  o.concurrency = g.concurrency;
  o.bf16 = Bf16(/*analytic=*/false);
  o.seed = g.seed;
  // Minutes of measuring on a CPU: what is done, and the time left.
  ob::cli::ProgressLine line("ob-profile", quiet);
  o.progress = [&line](const std::string& what, int done, int total) {
    OB_LOG(Debug) << what;  // -v: every step, with the host and pid
    line.Update(done, total, what);
  };
  try {
    return ob::profile::MeasureProfile(cfg, o);
  } catch (const std::exception& e) {
    // Memory the check before could not foresee (AdamW state, workspaces,
    // another process's): the device's lack, not an internal error.
    const std::string what = e.what();
    if (what.find("can't allocate memory") == std::string::npos && what.find("out of memory") == std::string::npos)
      throw;
    return ob::Status::Unavailable("out of memory measuring " + cfg.name + " on " + g.device + ": " +
                                   what.substr(0, what.find('\n')) +
                                   " (model it with --analytic --gpu NAME, or measure a smaller model or micro-batch)");
  }
}
#endif

ob::Result<ob::pb::Profile> Network() {
  OB_ASSIGN_OR_RETURN(auto hosts, ob::cluster::LoadHosts(g.net_hosts));
  ob::profile::NetOptions o;
  o.rsh = g.rsh;
  if (!g.agent_exe.empty()) o.agent_exe = g.agent_exe;
  o.progress = Progress;
  OB_ASSIGN_OR_RETURN(auto matrix, ob::profile::MeasureNetwork(hosts, o));
  ob::pb::Profile p = ob::profile::NewProfile(ob::pb::PROFILE_NETWORK);
  *p.mutable_network() = std::move(matrix);
  return p;
}

ob::Status Run(const ob::cli::CommonOptions& common) {
  if (g.net_agent) {
    int rc = ob::profile::RunNetAgent(STDIN_FILENO, STDOUT_FILENO);
    return rc == 0 ? ob::Status::Ok() : ob::Status::Unavailable("network agent failed");
  }
  const bool produce = !g.model.empty() || !g.net_hosts.empty() || g.analytic;
  if (!produce) return PrintProfile(common);
  if (!g.input.empty())
    return ob::Status::Usage("a FILE to print and --model/--net/--analytic exclude each other");
  // Refuse before minutes of measuring, not after.
  if (!common.json && common.output == "-" && ob::io::StdoutIsTerminal())
    return ob::Status::Usage(
        "refusing to write a binary Profile to a terminal; use -o FILE, a pipe, or --json");

  ob::pb::Profile p;
  if (!g.net_hosts.empty()) {
    OB_ASSIGN_OR_RETURN(p, Network());
  } else {
    if (g.model.empty()) return ob::Status::Usage("--analytic needs --model NAME|FILE");
    OB_ASSIGN_OR_RETURN(auto cfg, ob::model::ResolveModel(g.model));
    if (g.analytic) {
      OB_ASSIGN_OR_RETURN(p, Analytic(cfg));
    } else {
#ifdef OB_PROFILE_MEASURE
      OB_ASSIGN_OR_RETURN(p, Measured(cfg, common.quiet));
#else
      return Measured(cfg);
#endif
    }
  }
  return ob::io::WriteMessage(common.output, p, ob::io::kProfileFormatVersion, common.json);
}

void Setup(CLI::App& app) {
  app.footer(
      "Modes: --model measures on --device; --analytic models --gpu from FLOPs and bytes;\n"
      "--net measures host-to-host links; a FILE (or stdin) is read and printed.\n"
      "Examples:\n"
      "  ob-profile --model gpt-tiny --device cpu -o tiny.pb\n"
      "  ob-profile --model gpt3-175b --analytic --gpu h100 | ob-plan -f 2 --nodes 64\n"
      "  ob-profile --net hosts.txt --rsh ssh -o net.pb\n"
      "  ob-profile --json tiny.pb");
  app.add_option("file", g.input, "A profile to print (default: stdin)")->option_text("FILE");
  app.add_option("-m,--model", g.model, "Preset name or config.json/.yaml to profile")->option_text("NAME|FILE");
  app.add_option("-d,--device", g.device, "cpu, cuda or cuda:N (measured mode)")->capture_default_str();
  app.add_option("-b,--microbatch", g.microbatches, "Micro-batch size, or a list: 1,2,4")->capture_default_str();
  app.add_option("--seq-len", g.seq_len, "Tokens per sequence (default: the model's context)")
      ->check(ob::cli::Positive());
  app.add_option("--warmup", g.warmup, "Untimed runs before timing")
      ->check(ob::cli::NonNegative())
      ->capture_default_str();
  app.add_option("-k,--repeats", g.repeats, "Timed runs; their mean is kept (on a GPU the median)")
      ->check(ob::cli::Positive())
      ->capture_default_str();
  app.add_option("--allreduce-max", g.allreduce_max,
                 "Time gradient all-reduce for groups 1, 2, 4, ... up to N (default: this node's GPUs; 4 on the CPU)")
      ->check(ob::cli::Positive());
  app.add_option("--threads", g.threads, "CPU intra-op threads (default: LibTorch's)")->check(ob::cli::Positive());
  app.add_option("--concurrency", g.concurrency,
                 "CPU: time the layers while N-1 other processes train them here, as N workers of a local cluster share the cores")
      ->check(ob::cli::Positive())
      ->capture_default_str();
  app.add_option("--precision,--dtype", g.dtype,
                 "fp32 or bf16 (also float32, bfloat16): bf16 is autocast over fp32 weights, as ob-launch trains "
                 "(default: ob-launch's for the device: bf16 on cuda and --analytic, fp32 on cpu)")
      ->option_text("fp32|bf16")
      ->check(CLI::Validator(
          [](std::string& v) {
            return ob::model::ParsePrecision(v).ok()
                       ? std::string()
                       : "'" + v + "' is not a precision: fp32 (float32) or bf16 (bfloat16)";
          },
          "PRECISION"));
  app.add_option("--seed", g.seed, "Seed for weights and inputs")->capture_default_str();
  app.add_flag("--analytic", g.analytic, "Model the layers from FLOPs and bytes (docs/design/formulas.md)");
  app.add_option("--gpu", g.gpu, "GPU to model: a100-40gb, a100-80gb, h100, h200, ...");
  app.add_option("--peak-tflops", g.peak_tflops, "Override the GPU's dense peak (TFLOP/s) in the profile's precision")->check(ob::cli::Positive());
  app.add_option("--mem-gib", g.mem_gib, "Override the GPU's memory (GiB)")->check(ob::cli::Positive());
  app.add_option("--efficiency", g.efficiency, "Fraction of peak reached, at most 1 (default: per GPU)")
      ->check(ob::cli::Positive())
      ->check(CLI::Validator(
          [](std::string& v) { return std::stod(v) <= 1 ? std::string() : "'" + v + "' is above 1"; }, ""));
  app.add_option("--allreduce-gbps", g.allreduce_gbps, "Override intra-node all-reduce bus bandwidth (GB/s)")
      ->check(ob::cli::Positive());
  app.add_option("--gpus-per-node", g.gpus_per_node, "GPUs per node (all-reduce group sizes)")
      ->check(ob::cli::Positive());
  app.add_flag("--fused-attention", g.fused_attention, "Analytic: fused attention keeps no s x s scores");
  app.add_flag("--table", g.table, "Print a profile as a human table");
  app.add_option("--net", g.net_hosts, "Measure bandwidth and latency between the hosts in FILE")
      ->option_text("HOSTS");
  app.add_option("--rsh", g.rsh, "How to start agents on hosts: ssh, local, or a prefix command")
      ->capture_default_str();
  app.add_option("--agent-exe", g.agent_exe, "Path of ob-profile on the hosts (default: this one)");
  app.add_flag("--net-agent", g.net_agent, "Internal: serve --net measurements over stdin/stdout")
      ->group("");
}

}  // namespace

int main(int argc, char** argv) {
  g_argv = argv;
  return ob::cli::Main(argc, argv,
                       {"profile", "Measure or model a GPT's layers, or the links between hosts.",
                        Setup, Run,
                        nullptr,
                        [] {
                          return std::vector<ob::cli::NamedFile>{
                              {"the profile", g.input}, {"--model", g.model}, {"--net", g.net_hosts}};
                        }});
}
