// ob-launch: train across hosts, and keep training when hosts die.
// The master by default; the same binary runs as an agent (--agent, started
// by the master through --rsh) and as a worker (--worker, started by an
// agent). Everything real is in lib/ob/launch/.
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <vector>

#include <unistd.h>

#include "ob/build_info.h"
#include "ob/cli/cli.h"
#include "ob/clock.h"
#include "ob/io/file.h"
#include "ob/io/message.h"
#include "ob/io/records.h"
#include "ob/control.pb.h"
#include "ob/launch/agent.h"
#include "ob/launch/devices.h"
#include "ob/launch/inject.h"
#include "ob/launch/master.h"
#include "ob/launch/master_setup.h"
#include "ob/launch/worker.h"
#include "ob/log.h"
#include "ob/torch_compat.h"

namespace {

// The flags bind straight into the options of the role that uses them; the
// master passes the workers' own to them on their command lines.
struct Options {
  ob::launch::MasterOptions master;
  ob::launch::WorkerOptions worker;  // steps, data, lr, warm-up, seed, checkpoints
  ob::launch::AgentOptions agent;
  std::vector<std::string> inject;
  std::string agent_exe;  // ob-launch's path on the hosts (default: this one's)
  std::vector<std::string> log_flags;  // -v or -q, passed on to agents and workers
  bool as_agent = false, as_worker = false;  // hidden: the roles ob-launch starts itself
  Options() {
    worker.steps = 100;
    worker.rank = -1;
  }
};

Options g;

std::string Absolute(const std::string& path) {
  if (path.empty() || path == "-" || path[0] == '/') return path;
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) != nullptr) return buf;
  return path;
}

// A double as text that reads back to the same value (std::to_string
// writes 6 decimals: --lr 3e-7 became 0).
std::string Exact(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// The command each agent runs for a worker. OB_TEST_WORKER_CMD (tests only)
// replaces the real worker with `sh -c CMD`, given OB_RANK, OB_WORLD_SIZE,
// OB_LOCAL_RANK and OB_HOST in its environment.
ob::pb::WorkerSpec WorkerCommand(const ob::launch::WorkerContext& ctx, const std::string& self) {
  ob::pb::WorkerSpec spec;
  auto& env = *spec.mutable_env();
  env["OB_RANK"] = std::to_string(ctx.rank);
  env["OB_WORLD_SIZE"] = std::to_string(ctx.world_size);
  env["OB_LOCAL_RANK"] = std::to_string(ctx.local_rank);
  env["OB_HOST"] = ctx.host;
  if (!g.inject.empty()) {
    std::string spec;
    for (const auto& i : g.inject) spec += (spec.empty() ? "" : ";") + i;
    env["OB_INJECT"] = spec;
  }
  if (const char* test = std::getenv("OB_TEST_WORKER_CMD"); test != nullptr && *test != '\0') {
    for (const char* a : {"/bin/sh", "-c", test}) spec.add_argv(a);
    return spec;
  }
  for (const std::string& a :
       {self, std::string("--worker"), std::string("--rank"), std::to_string(ctx.rank),
        std::string("--world"), std::to_string(ctx.world_size), std::string("--generation"),
        std::to_string(ctx.generation), std::string("--steps"), std::to_string(g.worker.steps),
        std::string("--data"), g.worker.data, std::string("--lr"), Exact(g.worker.lr),
        std::string("--warmup-steps"), std::to_string(g.worker.warmup_steps), std::string("--seed"),
        std::to_string(g.worker.seed), std::string("--device"), g.worker.device,
        std::string("--precision"), g.worker.precision, std::string("--min-lr"), Exact(g.worker.min_lr),
        std::string("--lr-schedule"), g.worker.lr_schedule, std::string("--weight-decay"),
        Exact(g.worker.weight_decay), std::string("--beta1"), Exact(g.worker.beta1), std::string("--beta2"),
        Exact(g.worker.beta2), std::string("--eps"), Exact(g.worker.eps), std::string("--clip-norm"),
        Exact(g.worker.clip_norm)}) {
    spec.add_argv(a);
  }
  for (const std::string& f : g.log_flags) spec.add_argv(f);
  if (!g.worker.data_facts.empty()) {
    spec.add_argv("--data-facts");
    spec.add_argv(g.worker.data_facts);
  }
  if (!g.worker.eval_data.empty() || g.worker.eval_split > 0) {
    for (const std::string& a :
         {std::string("--eval-data"), g.worker.eval_data, std::string("--eval-split"), Exact(g.worker.eval_split),
          std::string("--eval-every"), std::to_string(g.worker.eval_every), std::string("--eval-batches"),
          std::to_string(g.worker.eval_batches)}) {
      spec.add_argv(a);
    }
  }
  if (!g.worker.ckpt_dir.empty()) {
    for (const std::string& a : {std::string("--ckpt-dir"), Absolute(g.worker.ckpt_dir),
                                 std::string("--ckpt-every"), std::to_string(g.worker.ckpt_every)}) {
      spec.add_argv(a);
    }
  }
  return spec;
}

// The GPUs of this host, as an agent counts them: $OB_GPUS_PER_HOST when set
// (tests: a GPU count without GPUs), else what LibTorch sees (none asked
// for --device cpu: no CUDA start-up).
int AgentGpus(ob::launch::DeviceKind device) {
  if (const char* n = std::getenv("OB_GPUS_PER_HOST"); n != nullptr && *n != '\0') return std::atoi(n);
  return device == ob::launch::DeviceKind::kCpu ? 0 : ob::launch::VisibleGpus();
}

// Their UUIDs, slot i's at i: $OB_TEST_GPU_IDS (comma-separated) when set,
// for tests, else what CUDA says; none on the CPU.
std::vector<std::string> AgentGpuIds(ob::launch::DeviceKind device, int gpus) {
  std::vector<std::string> ids;
  if (const char* s = std::getenv("OB_TEST_GPU_IDS"); s != nullptr && *s != '\0') {
    std::stringstream in(s);
    for (std::string id; std::getline(in, id, ',');) ids.push_back(id);
    return ids;
  }
  if (device == ob::launch::DeviceKind::kCpu || std::getenv("OB_GPUS_PER_HOST") != nullptr) return ids;
  for (int i = 0; i < gpus; ++i) ids.push_back(ob::compat::CudaDeviceUuid(i));
  return ids;
}

// --version -v: what a worker started here with these options runs on.
std::string RuntimeDetails() {
  auto device = ob::launch::ParseDevice(g.worker.device);
  if (!device.ok()) return "";
  const ob::launch::DeviceKind here = ob::launch::ResolveDevice(*device, AgentGpus(*device));
  auto precision = ob::launch::ResolvePrecision(g.worker.precision, here);
  if (!precision.ok()) return "";
  return std::string("device: ") + g.worker.device + " (here: " + ob::launch::DeviceName(here) + ", " +
         std::to_string(AgentGpus(*device)) + " GPU(s))\n" + "backend: " + ob::launch::BackendName(here) +
         "\n" + "precision: " + *precision + (g.worker.precision.empty() ? " (the default here)" : "") + "\n" +
         "worker: " + ob::launch::DescribeRuntime(ob::launch::DeviceName(here), *precision) + "\n";
}

// Which build agents and the master are (Hello.build): the version line
// and the LibTorch it was built with; $OB_TEST_BUILD instead, for tests.
std::string BuildId() {
  if (const char* b = std::getenv("OB_TEST_BUILD"); b != nullptr && *b != '\0') return b;
  return ob::cli::VersionLine("launch") + ", LibTorch " OB_TORCH_VERSION;
}

std::string SelfExe() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("ob-launch");
}

ob::Status Run(const ob::cli::CommonOptions& common) {
  if (g.as_agent && g.as_worker) return ob::Status::Usage("--agent and --worker exclude each other");
  if (g.as_agent) {
    ob::launch::AgentOptions& o = g.agent;
    if (o.master.empty() || o.host.empty()) return ob::Status::Usage("--agent needs --master and --host");
    ob::log::Init("agent", -1, o.host);
    o.master_timeout_s = g.master.master_timeout_s;
    o.standby_exe = SelfExe();
    OB_ASSIGN_OR_RETURN(ob::launch::DeviceKind device, ob::launch::ParseDevice(g.worker.device));
    o.device = g.worker.device;
    o.gpus = AgentGpus(device);
    o.gpu_ids = AgentGpuIds(device, o.gpus);
    o.build = BuildId();
    int rc = ob::launch::RunAgent(o);
    // The agent has logged why it stopped; exit with its status, no summary line.
    if (rc != 0) std::exit(rc);
    return ob::Status::Ok();
  }
  if (g.as_worker) {
    ob::log::Init("worker", g.worker.rank);
    if (const char* host = std::getenv("OB_HOST")) g.worker.host = host;
    return ob::launch::RunWorker(g.worker);
  }
  ob::launch::MasterOptions& o = g.master;
  if (o.plan_path.empty()) return ob::Status::Usage("no plan: give plan.pb (and hosts.txt)");
  ob::log::Init("master");
  // The precision the workers train in (the device's default unless given;
  // with --device auto, as this machine sees it), which the plan must have
  // been profiled for.
  {
    OB_ASSIGN_OR_RETURN(ob::launch::DeviceKind device, ob::launch::ParseDevice(g.worker.device));
    const ob::launch::DeviceKind here = ob::launch::ResolveDevice(
        device, device == ob::launch::DeviceKind::kAuto ? ob::launch::VisibleGpus() : 0);
    OB_ASSIGN_OR_RETURN(g.worker.precision, ob::launch::ResolvePrecision(g.worker.precision, here));
    OB_RETURN_IF_ERROR(ob::launch::CheckPrecisionForPlan(Absolute(o.plan_path), g.worker.precision));
    o.agent_flags.push_back("--device");
    o.agent_flags.push_back(g.worker.device);
  }
  // Refuse a plan whose model cannot take the data before any host is touched.
  OB_ASSIGN_OR_RETURN(g.worker.data_facts,
                      ob::launch::CheckDataForPlan(Absolute(g.worker.data), Absolute(o.plan_path),
                                                   /*data_is_local=*/o.rsh == "local"));
  {
    auto& w = g.worker;
    if (!w.eval_data.empty() && w.eval_split > 0) return ob::Status::Usage("--eval-data and --eval-split exclude each other");
    if (!(w.eval_split >= 0 && w.eval_split < 1)) return ob::Status::Usage("--eval-split must be in [0, 1)");
    if ((w.eval_every > 0 || w.eval_batches != 1) && w.eval_data.empty() && w.eval_split == 0) {
      return ob::Status::Usage("--eval-every and --eval-batches need --eval-data or --eval-split");
    }
    if (w.steps == 0 && (o.resume.empty() || (w.eval_data.empty() && w.eval_split == 0))) {
      return ob::Status::Usage("--steps 0 evaluates a checkpoint: give --resume and --eval-data or --eval-split");
    }
    if (!w.eval_data.empty()) {
      w.eval_data = w.eval_data == "synthetic" ? w.eval_data : Absolute(w.eval_data);
      OB_RETURN_IF_ERROR(ob::launch::CheckDataForPlan(w.eval_data, Absolute(o.plan_path),
                                                      /*data_is_local=*/o.rsh == "local").status());
      const auto eval_id = ob::io::RegularFileId(w.eval_data);
      if (eval_id && eval_id == ob::io::RegularFileId(Absolute(w.data))) {
        OB_LOG(Warn) << "--eval-data " << w.eval_data << " is the training data (--data " << w.data
                     << "): its loss is not a held-out one (--eval-split holds out the end of --data)";
      }
    }
    OB_RETURN_IF_ERROR(ob::launch::CheckEvalSplit(Absolute(w.data), w.eval_split, Absolute(o.plan_path)));
  }
  o.plan_path = Absolute(o.plan_path);
  o.log_to_run_dir = common.log_file.empty();
  o.ckpt_dir = Absolute(g.worker.ckpt_dir);
  o.resume = o.resume == "auto" ? o.resume : Absolute(o.resume);
  o.seed = g.worker.seed;
  o.eval_split = g.worker.eval_split;
  o.data = g.worker.data == "synthetic" ? g.worker.data : Absolute(g.worker.data);
  o.eval_data = g.worker.eval_data;
  o.steps = g.worker.steps;
  {
    const auto& w = g.worker;
    ob::pb::OptimizerSettings& s = o.optimizer;
    s.set_lr(w.lr);
    s.set_min_lr(w.min_lr);
    s.set_warmup_steps(w.warmup_steps);
    s.set_lr_schedule(w.lr_schedule);
    s.set_weight_decay(w.weight_decay);
    s.set_beta1(w.beta1);
    s.set_beta2(w.beta2);
    s.set_eps(w.eps);
    s.set_clip_norm(w.clip_norm);
    s.set_steps(w.steps);
  }
  if (g.worker.ckpt_every > 0 && o.ckpt_dir.empty()) return ob::Status::Usage("--ckpt-every needs --ckpt-dir");
  // Each directory is locked by its own owner (the master, the checkpoint
  // keeper): one directory for both read as "in use by another process".
  if (!o.ckpt_dir.empty() && !o.run_dir.empty() && ob::io::SameDirectory(o.ckpt_dir, o.run_dir)) {
    return ob::Status::Usage("--ckpt-dir " + g.worker.ckpt_dir + " is the run directory (--run-dir " + o.run_dir +
                             "): give the checkpoints a directory of their own, e.g. " +
                             ob::io::JoinPath(o.run_dir, "ckpt"));
  }
  {
    const auto& w = g.worker;
    if (!(w.lr > 0) || !std::isfinite(w.lr)) {
      return ob::Status::Usage("--lr " + Exact(w.lr) + ": the learning rate must be a positive number");
    }
    if (w.warmup_steps < 0) return ob::Status::Usage("--warmup-steps must not be negative");
    if (w.steps > 0 && w.warmup_steps > w.steps) {
      return ob::Status::Usage("--warmup-steps " + std::to_string(w.warmup_steps) + " is longer than --steps " +
                               std::to_string(w.steps) + ": the learning rate would never reach --lr");
    }
    if (!(w.min_lr >= 0 && w.min_lr <= w.lr)) return ob::Status::Usage("--min-lr must be between 0 and --lr");
    if (w.lr_schedule != "cosine" && w.lr_schedule != "constant")
      return ob::Status::Usage("--lr-schedule must be 'cosine' or 'constant', not '" + w.lr_schedule + "'");
    if (!(w.weight_decay >= 0 && std::isfinite(w.weight_decay))) return ob::Status::Usage("--weight-decay must not be negative");
    if (!(w.beta1 >= 0 && w.beta1 < 1) || !(w.beta2 >= 0 && w.beta2 < 1))
      return ob::Status::Usage("--beta1 and --beta2 must be in [0, 1)");
    if (!(w.eps > 0 && std::isfinite(w.eps))) return ob::Status::Usage("--eps must be a positive number");
    if (!(w.clip_norm >= 0 && std::isfinite(w.clip_norm))) return ob::Status::Usage("--clip-norm must not be negative (0: no clipping)");
  }
  for (const auto& i : g.inject) OB_RETURN_IF_ERROR(ob::launch::ParseInjection(i, -1).status());
  // Agents, and the workers they start, run this path on their hosts.
  o.self_exe = g.agent_exe.empty() ? SelfExe() : g.agent_exe;
  o.build = BuildId();
  if (common.verbose > 0) g.log_flags.push_back("-v");
  if (common.quiet) g.log_flags.push_back("-q");
  o.agent_flags.insert(o.agent_flags.end(), g.log_flags.begin(), g.log_flags.end());
  const std::string self = o.self_exe;
  o.worker_command = [self](const ob::launch::WorkerContext& c) { return WorkerCommand(c, self); };
  ob::Result<int> rc = ob::launch::RunMaster(o);
  if (!rc.ok()) return rc.status();
  if (*rc != 0) return ob::Status(static_cast<ob::Code>(*rc), "training ended with status " + std::to_string(*rc));
  return ob::Status::Ok();
}

void Setup(CLI::App& app) {
  app.add_option("PLAN", g.master.plan_path, "The plan to run (from ob-plan)")->option_text("PLAN");
  app.add_option("HOSTS", g.master.hosts_path, "Hosts file (see ob-formats(5)); Slurm's nodes when absent")
      ->option_text("HOSTS");
  app.add_option("--rsh", g.master.rsh, "How agents are started: ssh, local, slurm (srun steps of this job), or a prefix command (default ssh)")
      ->option_text("CMD");
  app.add_option("--agent-exe", g.agent_exe, "Path of ob-launch on the hosts (default: this one's)")
      ->option_text("PATH");
  app.add_option("--steps", g.worker.steps,
                 "Training steps (default 100); 0 with --resume and evaluation data: evaluate the checkpoint")
      ->option_text("N")
      ->check(ob::cli::NonNegative());
  app.add_option("--data", g.worker.data, "Token file, text file, or 'synthetic' (the default)")
      ->option_text("SPEC");
  app.add_option("--eval-data", g.worker.eval_data,
                 "Held-out token file (or 'synthetic') whose loss is evaluated, forward only")
      ->option_text("SPEC");
  app.add_option("--eval-split", g.worker.eval_split,
                 "Hold out the last fraction X of --data's tokens for evaluation; training samples the rest")
      ->option_text("X");
  app.add_option("--eval-every", g.worker.eval_every,
                 "Evaluate after every N steps and the last (default 0: after the last only)")
      ->option_text("N")->check(ob::cli::NonNegative());
  app.add_option("--eval-batches", g.worker.eval_batches,
                 "Global batches of evaluation data per evaluation, the same ones each time (default 1)")
      ->option_text("N")->check(ob::cli::Positive());
  app.add_option("--lr", g.worker.lr, "Peak learning rate (default 1e-3)")->option_text("X");
  app.add_option("--warmup-steps", g.worker.warmup_steps, "Linear warm-up steps before cosine decay (default 0)")
      ->option_text("N");
  app.add_option("--min-lr", g.worker.min_lr, "Floor of the cosine decay (default 0)")->option_text("X");
  app.add_option("--lr-schedule", g.worker.lr_schedule,
                 "After the warm-up: 'cosine' decay to --min-lr at the last step, or 'constant' (default cosine)")
      ->option_text("cosine|constant");
  app.add_option("--weight-decay", g.worker.weight_decay,
                 "AdamW weight decay of the matrices, embeddings included; none on biases and LayerNorms "
                 "(default 0.1)")
      ->option_text("X");
  app.add_option("--beta1", g.worker.beta1, "AdamW beta1 (default 0.9)")->option_text("X");
  app.add_option("--beta2", g.worker.beta2, "AdamW beta2 (default 0.95)")->option_text("X");
  app.add_option("--eps", g.worker.eps, "AdamW epsilon (default 1e-8)")->option_text("X");
  app.add_option("--clip-norm", g.worker.clip_norm, "Clip the global gradient norm to X; 0: no clipping (default 1)")
      ->option_text("X");
  app.add_option("--seed", g.worker.seed, "Seed of the weights and of data sampling (default 1234)")
      ->option_text("N");
  app.add_option("--device", g.worker.device,
                 "auto (CUDA where a worker sees a GPU; the default), cpu or cuda (one GPU per worker)")
      ->option_text("DEVICE")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--precision", g.worker.precision,
                 "fp32 or bf16 (default: bf16 on CUDA, fp32 on CPU); the plan's profile must match")
      ->option_text("P")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--secret-file", g.master.secret_file, "Shared secret for agents (mode 600; else $OB_SECRET)")
      ->option_text("FILE");
  app.add_option("--bind", g.master.bind,
                 "Control channel address, ADDR[:PORT], or 'auto' (the default: this machine's address on "
                 "the route to the first remote host; 127.0.0.1 when all hosts are local)")
      ->option_text("ADDR");
  app.add_option("--metrics", g.master.metrics, "Write delimited Metrics records to FILE ('-' stdout)")
      ->option_text("FILE");
  app.add_option("--run-dir", g.master.run_dir, "Logs, events and control socket (default ./ob-run-TIME)")
      ->option_text("DIR");
  app.add_option("--agent-timeout", g.master.agent_timeout_s,
                 "Seconds of silence after which an agent counts as lost (default 1; up to 3x that "
                 "while its host still acknowledges)")
      ->option_text("SECONDS")->check(ob::cli::Seconds());
  app.add_option("--master-timeout", g.master.master_timeout_s,
                 "Agents kill their workers after a silent master (default 3 s)")
      ->option_text("SECONDS")->check(ob::cli::Seconds());
  app.add_option("--start-timeout", g.master.start_timeout_s, "Time for every agent to connect (default 30 s)")
      ->option_text("SECONDS")->check(ob::cli::Seconds());
  app.add_option("--hang-timeout", g.master.hang_timeout_s,
                 "A rank whose training loop made no progress for this long is hung; its "
                 "generation is restarted (default 3 s; at least 30 s before a generation's first step)")
      ->option_text("SECONDS")->check(ob::cli::Seconds());
  app.add_option("--stop-grace", g.master.stop_grace_s,
                 "On SIGTERM, SIGINT or SIGUSR1 with --ckpt-dir: time for the checkpoint taken before "
                 "stopping (default 120 s)")
      ->option_text("SECONDS")->check(ob::cli::Seconds());
  app.add_option("--ckpt-dir", g.worker.ckpt_dir, "Checkpoint directory (see ob-ckpt(1))")->option_text("DIR");
  app.add_option("--ckpt-every", g.worker.ckpt_every, "Save a checkpoint every N steps, in the background")
      ->option_text("N")->check(ob::cli::NonNegative());
  app.add_option("--ckpt-keep", g.master.ckpt_keep, "Keep only the newest N checkpoints (default 0: all)")
      ->option_text("N")->check(ob::cli::NonNegative());
  app.add_option("--inject", g.inject,
                 "Fault injection for tests: RANK:slow=F, RANK:hang=STEP, RANK:stall=STEP or RANK:nan=STEP")
      ->option_text("SPEC")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--resume", g.master.resume, "Start from a checkpoint: 'auto' (the latest in --ckpt-dir) or DIR")
      ->option_text("WHAT");
  app.add_flag("--resume-from-other", g.master.resume_from_other,
               "Resume from a checkpoint another job saved (another seed or data)");
  // Roles started by ob-launch itself; not for people.
  app.add_flag("--agent", g.as_agent)->group("");
  app.add_option("--master", g.agent.master)->group("");
  app.add_option("--host", g.agent.host)->group("");
  app.add_option("--cpu-share", g.agent.cpu_share)->group("");
  app.add_flag("--worker", g.as_worker)->group("");
  app.add_option("--rank", g.worker.rank)->group("");
  app.add_option("--world", g.worker.world)->group("");
  app.add_option("--data-facts", g.worker.data_facts)->group("");
  app.add_option("--generation", g.worker.generation)->group("");
  app.footer(
      "Examples:\n"
      "  ob-launch --rsh local --steps 200 --secret-file secret plan.pb hosts.txt\n"
      "  ob-launch --bind 10.0.0.1 --metrics run.metrics plan.pb hosts.txt\n"
      "  echo status | socat - UNIX:ob-run-*/control.sock");
}

// The files a run reads, and --metrics, which it writes (truncated at the
// start: over --data it would destroy the training set).
std::vector<ob::cli::NamedFile> Reads() {
  std::vector<ob::cli::NamedFile> reads{{"the plan", g.master.plan_path},
                                        {"the hosts file", g.master.hosts_path},
                                        {"--secret-file", g.master.secret_file}};
  if (g.worker.data != "synthetic") reads.push_back({"--data", g.worker.data});
  if (g.worker.eval_data != "synthetic") reads.push_back({"--eval-data", g.worker.eval_data});
  return reads;
}

const ob::cli::Tool kTool{"launch", "Train across hosts, and keep training when hosts die.", Setup,
                          Run, RuntimeDetails, Reads,
                          [] { return std::vector<ob::cli::NamedFile>{{"--metrics", g.master.metrics}}; }};

// `ob-launch --standby-worker`: started by an agent ahead of need, with
// LibTorch already loaded by the time it waits, which it says with one
// heartbeat record on stdout (its agent reads it when it hands the role:
// a standby that said so must start within kRoleAckMs). Its stdin brings a
// WorkerSpec (then end of file): it takes the spec's environment and
// becomes that worker, in this process when the spec runs ob-launch,
// else by exec. End of file alone: it was not needed.
int RunStandby() {
  const char* device = std::getenv("OB_DEVICE");  // the agent's choice for this host (agent.h)
  ob::launch::WarmUpLibTorch(device != nullptr && std::strcmp(device, "cuda") == 0);
  {
    ob::pb::Metrics ready;
    ready.set_format_version(ob::io::kMetricsFormatVersion);
    ready.set_heartbeat(true);
    ready.set_unix_ms(ob::UnixMs());
    (void)ob::io::RecordWriter(STDOUT_FILENO, "<stdout>").Write(ready);
  }
  std::string bytes;
  char buf[4096];
  for (;;) {
    ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    bytes.append(buf, static_cast<size_t>(n));
  }
  if (bytes.empty()) return 0;
  ob::pb::WorkerSpec spec;
  if (!spec.ParseFromString(bytes) || spec.argv_size() == 0) {
    std::fprintf(stderr, "ob-launch: standby worker: stdin is not a worker spec\n");
    return static_cast<int>(ob::Code::kDataErr);
  }
  for (const auto& [k, v] : spec.env()) setenv(k.c_str(), v.c_str(), 1);
  std::vector<std::string> args(spec.argv().begin(), spec.argv().end());
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  if (args[0] != SelfExe()) {
    execvp(cargs[0], cargs.data());
    std::fprintf(stderr, "ob-launch: standby worker: cannot run '%s': %s\n", cargs[0], std::strerror(errno));
    return 127;
  }
  return ob::cli::Main(static_cast<int>(args.size()), cargs.data(), kTool);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--standby-worker") == 0) return RunStandby();
  return ob::cli::Main(argc, argv, kTool);
}
