// ob-launch: train across hosts, and keep training when hosts die.
// The master by default; the same binary runs as an agent (--agent, started
// by the master through --rsh). Workers are ob-launch-worker
// (worker_main.cc), started by the agents: the one program of the three
// that loads LibTorch. Everything real is in lib/ob/launch/.
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
#include "ob/cluster/rsh.h"
#include "ob/io/fd_limit.h"
#include "ob/io/file.h"
#include "ob/io/message.h"
#include "ob/io/records.h"
#include "ob/control.pb.h"
#include "ob/launch/agent/agent.h"
#include "ob/launch/wire/devices.h"
#include "ob/model/data.h"
#include "ob/launch/worker/inject.h"
#include "ob/launch/master/master.h"
#include "ob/launch/master/master_setup.h"
#include "ob/launch/master/standby_fetch.h"
#include "ob/launch/agent/peer_probe.h"
#include "ob/launch/master/data_checks.h"
#include "ob/launch/wire/plan_data.h"
#include "ob/log.h"
#include "options.h"

namespace {

using namespace ob::launch_tool;

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
    // Left exported from a test, it would run a shell for every worker and
    // train nothing: said once, as the first workers start.
    static bool said = false;
    if (!said) {
      OB_LOG(Warn) << "OB_TEST_WORKER_CMD is set (for tests): the workers run `sh -c " << test
                   << "` instead of training";
      said = true;
    }
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

// The path this ob-launch was started by: the master's own, or on a host
// the one the master named (--agent-exe), symbolic links kept, so that
// ob-launch-worker is looked for where the master's worker commands name
// it; /proc/self/exe when it was not absolute.
std::string g_argv0;
std::string LaunchPath() { return !g_argv0.empty() && g_argv0[0] == '/' ? g_argv0 : SelfExe(); }

// kConfig naming `exe` when the worker program is not there to run.
ob::Status CheckWorkerExe(const std::string& exe) {
  if (access(exe.c_str(), X_OK) == 0) return ob::Status::Ok();
  return ob::Status::Config(exe + ": " + std::strerror(errno) + " (ob-launch runs its workers with " +
                            kWorkerExeName + ", installed beside it on every host)");
}

// What a worker here would see (devices.h ProbeResult): nothing for
// --device cpu or on a machine with no NVIDIA driver, where no process sees a
// GPU; else ob-launch-worker --probe says, the program that loads LibTorch
// and CUDA (ob-launch itself does neither). `runtime`: also its
// DescribeRuntime line for --version -v (the device resolved as a worker
// would, the precision as given). kConfig when the worker program is
// missing (and needed); kUnavailable when it fails or says nothing within 120 s.
ob::Result<ob::launch::ProbeResult> ProbeWorker(ob::launch::DeviceKind device, bool runtime) {
  ob::launch::ProbeResult none;
  if (!runtime && (device == ob::launch::DeviceKind::kCpu || !ob::launch::MayHaveGpus())) return none;
  const std::string exe = WorkerExe(LaunchPath());
  OB_RETURN_IF_ERROR(CheckWorkerExe(exe));
  std::vector<std::string> argv{exe, "--probe", "--device", ob::launch::DeviceName(device)};
  if (!g.worker.precision.empty()) {
    argv.push_back("--precision");
    argv.push_back(g.worker.precision);
  }
  OB_ASSIGN_OR_RETURN(ob::cluster::ChildProcess child, ob::cluster::SpawnWithPipes(argv));
  child.CloseStdin();
  std::string out;
  // Not a report past 1 MiB; and waiting on it could block on a full pipe.
  const ob::io::ReadEnd end = ob::io::ReadFor(child.stdout_fd(), 120000, 1u << 20, &out);
  if (end != ob::io::ReadEnd::kEof) {
    const std::string e = ob::io::Errno();
    child.Kill();
    child.Wait();
    if (end == ob::io::ReadEnd::kTimeout) {
      return ob::Status::Unavailable(exe + " --probe said nothing in 120 s (a GPU or driver that hangs?)");
    }
    if (end == ob::io::ReadEnd::kTooLong) {
      return ob::Status::DataErr(exe + " --probe: printed more than 1 MiB; not a device report");
    }
    return ob::Status::Unavailable(exe + " --probe: cannot read its output: " + e);
  }
  if (child.Wait() != 0) return ob::Status::Unavailable(exe + " --probe: " + child.DescribeExit());
  return ob::launch::ParseProbe(out, exe + " --probe");
}

// The GPUs of this host, as an agent counts them, and their UUIDs, memory
// and names, slot i's at i: $OB_GPUS_PER_HOST when set (tests: a GPU count
// without GPUs, and no UUIDs), $OB_TEST_GPU_IDS and $OB_TEST_GPU_MEMORY
// (bytes; comma-separated), else the probe's (with `runtime`, its runtime
// line too; none when the count was given).
ob::Result<ob::launch::ProbeResult> AgentGpus(ob::launch::DeviceKind device, bool runtime = false) {
  ob::launch::ProbeResult p;
  const char* n = std::getenv("OB_GPUS_PER_HOST");
  if (n != nullptr && *n != '\0') {
    p.gpus = std::atoi(n);
  } else {
    OB_ASSIGN_OR_RETURN(p, ProbeWorker(device, runtime));
  }
  // Tests: a comma-separated list in place of the probe's.
  auto listed = [](const char* var) {
    std::vector<std::string> items;
    const char* value = std::getenv(var);
    std::stringstream in(value != nullptr ? value : "");
    for (std::string item; std::getline(in, item, ',');) items.push_back(item);
    return items;
  };
  if (std::vector<std::string> ids = listed("OB_TEST_GPU_IDS"); !ids.empty()) p.gpu_ids = std::move(ids);
  if (std::vector<std::string> sizes = listed("OB_TEST_GPU_MEMORY"); !sizes.empty()) {
    p.gpu_memory.clear();
    for (const std::string& bytes : sizes) p.gpu_memory.push_back(std::strtoull(bytes.c_str(), nullptr, 10));
  }
  return p;
}

// --version -v: what a worker started here with these options runs on.
// One probe says both the GPUs and the runtime line (it resolves --device
// auto as a worker would); a second only when $OB_GPUS_PER_HOST gave the
// GPUs, for the device they resolve to.
std::string RuntimeDetails() {
  auto device = ob::launch::ParseDevice(g.worker.device);
  if (!device.ok()) return "";
  auto seen = AgentGpus(*device, /*runtime=*/true);
  if (!seen.ok()) return "worker: " + seen.status().message() + "\n";
  const ob::launch::DeviceKind here = ob::launch::ResolveDevice(*device, seen->gpus);
  auto precision = ob::launch::ResolvePrecision(g.worker.precision, here);
  if (!precision.ok()) return "";
  std::string runtime = seen->runtime;
  if (runtime.empty()) {
    auto probe = ProbeWorker(here, /*runtime=*/true);
    runtime = probe.ok() ? probe->runtime : probe.status().message();
  }
  return std::string("device: ") + g.worker.device + " (here: " + ob::launch::DeviceName(here) + ", " +
         std::to_string(seen->gpus) + " GPU(s))\n" + "backend: " + ob::launch::BackendName(here) +
         "\n" + "precision: " + *precision + (g.worker.precision.empty() ? " (the default here)" : "") + "\n" +
         "worker: " + runtime + "\n";
}

// fd_limit.h: said at -v, for whoever set a limit and wonders where it went.
void RaiseOpenFileLimit() {
  const ob::io::FileLimit l = ob::io::RaiseOpenFileLimit();
  if (l.after != l.before) {
    OB_LOG(Debug) << "open-file limit raised from " << l.before << " to " << l.after << " (the hard limit)";
  }
}

// ob-launch --agent: an agent, started by the master on its host.
ob::Status RunAgentRole() {
  ob::launch::AgentOptions& o = g.agent;
  if (o.master.empty() || o.host.empty()) return ob::Status::Usage("--agent needs --master and --host");
  ob::log::Init("agent", -1, o.host);
  RaiseOpenFileLimit();  // for its probes, and the workers' groups (they inherit it)
  o.master_timeout_s = g.master.master_timeout_s;
  OB_ASSIGN_OR_RETURN(o.probe_port, ob::launch::ParseProbePort(g.probe_port));
  o.standby_exe = WorkerExe(LaunchPath());
  OB_RETURN_IF_ERROR(CheckWorkerExe(o.standby_exe));
  if (g.standby == "off") {
    o.spare_standbys = false;
    OB_LOG(Info) << "no standby workers (--standby off): the workers fork from one process that loads "
                    "LibTorch once";
  } else if (g.standby == "exec") {
    o.standby_seed = false;
    OB_LOG(Info) << "no standby seed (--standby exec): each standby loads LibTorch itself";
  }
  OB_ASSIGN_OR_RETURN(ob::launch::DeviceKind device, ob::launch::ParseDevice(g.worker.device));
  o.device = g.worker.device;
  OB_ASSIGN_OR_RETURN(ob::launch::ProbeResult seen, AgentGpus(device));
  o.gpus = seen.gpus;
  o.gpu_ids = std::move(seen.gpu_ids);
  o.gpu_memory = std::move(seen.gpu_memory);
  o.gpu_names = std::move(seen.gpu_names);
  o.build = BuildId();
  int rc = ob::launch::RunAgent(o);
  // The agent has logged why it stopped; exit with its status, no summary line.
  if (rc != 0) std::exit(rc);
  return ob::Status::Ok();
}

// The precision the workers train in (the device's default unless given;
// with --device auto, as this machine sees it), which the plan must have
// been profiled for.
ob::Status ChoosePrecision(const ob::launch::PlanData& plan, ob::launch::MasterOptions* o) {
  OB_ASSIGN_OR_RETURN(ob::launch::DeviceKind device, ob::launch::ParseDevice(g.worker.device));
  int gpus = 0;
  if (device == ob::launch::DeviceKind::kAuto) {
    OB_ASSIGN_OR_RETURN(ob::launch::ProbeResult seen, ProbeWorker(device, /*runtime=*/false));
    gpus = seen.gpus;
  }
  const ob::launch::DeviceKind here = ob::launch::ResolveDevice(device, gpus);
  OB_ASSIGN_OR_RETURN(g.worker.precision, ob::launch::ResolvePrecision(g.worker.precision, here));
  OB_RETURN_IF_ERROR(ob::launch::CheckPrecisionForPlan(plan, g.worker.precision));
  o->agent_flags.push_back("--device");
  o->agent_flags.push_back(g.worker.device);
  o->agent_flags.insert(o->agent_flags.end(), {"--standby", g.standby});
  o->agent_flags.insert(o->agent_flags.end(), {"--probe-port", g.probe_port});
  return ob::Status::Ok();
}

// The --eval-* flags, and --steps 0, as a whole.
ob::Status CheckEvalFlags(const ob::launch::MasterOptions& o) {
  const auto& w = g.worker;
  if (!w.eval_data.empty() && w.eval_split > 0) return ob::Status::Usage("--eval-data and --eval-split exclude each other");
  if (!(w.eval_split >= 0 && w.eval_split < 1)) return ob::Status::Usage("--eval-split must be in [0, 1)");
  if ((w.eval_every > 0 || w.eval_batches != 1) && w.eval_data.empty() && w.eval_split == 0) {
    return ob::Status::Usage("--eval-every and --eval-batches need --eval-data or --eval-split");
  }
  if (w.steps == 0 && (o.resume.empty() || (w.eval_data.empty() && w.eval_split == 0))) {
    return ob::Status::Usage("--steps 0 evaluates a checkpoint: give --resume and --eval-data or --eval-split");
  }
  return ob::Status::Ok();
}

// The optimizer's flags, each in its range and --min-lr and --warmup-steps
// against --lr and --steps.
ob::Status CheckOptimizerFlags() {
  const auto& w = g.worker;
  if (!(w.lr > 0) || !std::isfinite(w.lr)) {
    return ob::Status::Usage("--lr " + Exact(w.lr) + ": the learning rate must be a positive number");
  }
  if (w.warmup_steps < 0) return ob::Status::Usage("--warmup-steps must not be negative");
  if (w.steps > 0 && w.warmup_steps > w.steps) {
    return ob::Status::Usage("--warmup-steps " + std::to_string(w.warmup_steps) + " is longer than --steps " +
                             std::to_string(w.steps) + ": the learning rate would never reach --lr");
  }
  if (!(w.min_lr >= 0 && w.min_lr <= w.lr)) {
    return ob::Status::Usage("--min-lr " + Exact(w.min_lr) + ": must be between 0 and --lr");
  }
  if (w.lr_schedule != "cosine" && w.lr_schedule != "constant")
    return ob::Status::Usage("--lr-schedule must be 'cosine' or 'constant', not '" + w.lr_schedule + "'");
  if (!(w.weight_decay >= 0 && std::isfinite(w.weight_decay))) {
    return ob::Status::Usage("--weight-decay " + Exact(w.weight_decay) + ": must be a finite number, 0 or more");
  }
  if (!(w.beta1 >= 0 && w.beta1 < 1) || !(w.beta2 >= 0 && w.beta2 < 1))
    return ob::Status::Usage("--beta1 and --beta2 must be in [0, 1)");
  if (!(w.eps > 0 && std::isfinite(w.eps))) {
    return ob::Status::Usage("--eps " + Exact(w.eps) + ": must be a positive, finite number");
  }
  if (!(w.clip_norm >= 0 && std::isfinite(w.clip_norm))) {
    return ob::Status::Usage("--clip-norm " + Exact(w.clip_norm) +
                             ": must be a finite number, 0 or more (0: no clipping)");
  }
  return ob::Status::Ok();
}

// The data and the evaluation data, as this machine reads them, against the
// plan's model; their facts and sums for the workers.
ob::Status CheckData(const ob::launch::PlanData& plan, ob::launch::MasterOptions* o) {
  // Refuse a plan whose model cannot take the data (or its --eval-split)
  // before any host is touched; a malformed blend first (kUsage).
  OB_RETURN_IF_ERROR(ob::model::ParseBlend(g.worker.data).status());
  OB_RETURN_IF_ERROR(ob::model::ParseBlend(g.worker.eval_data).status());
  OB_ASSIGN_OR_RETURN(const ob::launch::DataChecked data_checked,
                      ob::launch::CheckDataForPlan(AbsoluteData(g.worker.data), plan,
                                                   /*data_is_local=*/o->rsh == "local", g.worker.eval_split));
  g.worker.data_facts = data_checked.facts;
  o->data_sum = data_checked.sum;
  o->data_identity = data_checked.identity;
  auto& w = g.worker;
  if (w.eval_data.empty()) return ob::Status::Ok();
  w.eval_data = AbsoluteData(w.eval_data);
  OB_ASSIGN_OR_RETURN(const ob::launch::DataChecked eval_checked,
                      ob::launch::CheckDataForPlan(w.eval_data, plan, /*data_is_local=*/o->rsh == "local"));
  o->eval_data_sum = eval_checked.sum;
  const auto eval_id = ob::io::RegularFileId(ob::model::DataFile(w.eval_data));
  if (eval_id && eval_id == ob::io::RegularFileId(ob::model::DataFile(AbsoluteData(w.data)))) {
    OB_LOG(Warn) << "--eval-data " << w.eval_data << " is the training data (--data " << w.data
                 << "): its loss is not a held-out one (--eval-split holds out the end of --data)";
  }
  return ob::Status::Ok();
}

// The master's options from the flags and the plan (the master's and its
// standby's alike).
ob::Status MasterFromFlags(const ob::launch::PlanData& plan, const ob::cli::CommonOptions& common);

// A standby master (design/master.md): main() fetched what it starts from
// (g_standby) before parsing the master's command line as its own.
ob::launch::StandbyStart g_standby;
std::string g_standby_secret;
std::vector<std::string> g_args;  // argv[1..], for the standby

ob::Status RunStandbyRole(const ob::cli::CommonOptions& common) {
  ob::launch::MasterOptions& o = g.master;
  o.standby_host = g.agent.host;
  ob::log::Init("standby-master", -1, o.standby_host);
  RaiseOpenFileLimit();
  const ob::pb::MasterSync& s = g_standby.sync;
  o.run_dir = s.run_dir() + "/standby-" + o.standby_host;
  OB_RETURN_IF_ERROR(ob::io::MakeDirs(o.run_dir, "run directory", 0700));
  if (!s.hosts().empty()) {
    o.hosts_path = o.run_dir + "/hosts.txt";
    OB_RETURN_IF_ERROR(ob::io::WriteFile(o.hosts_path, s.hosts()));
  }
  OB_ASSIGN_OR_RETURN(const ob::launch::PlanData plan, ob::launch::PlanDataOf(s.plan(), "the master's plan"));
  OB_RETURN_IF_ERROR(MasterFromFlags(plan, common));
  o.secret = g_standby_secret;
  o.bind = g_standby.local_ip;
  o.argv.assign(s.argv().begin(), s.argv().end());  // for a standby of its own, after a takeover
  o.cwd = s.cwd();
  o.metrics = Absolute(o.metrics);
  ob::Result<int> rc = ob::launch::RunMaster(o);
  if (!rc.ok()) return rc.status();
  if (*rc != 0) return ob::Status(static_cast<ob::Code>(*rc), "the standby master ended with status " + std::to_string(*rc));
  return ob::Status::Ok();
}

ob::Status Run(const ob::cli::CommonOptions& common) {
  if (g.as_worker || g.probe) {
    return ob::Status::Usage(std::string("--worker and --probe are ") + kWorkerExeName + "'s (started by agents)");
  }
  if (g.as_agent) return RunAgentRole();
  if (!g.master.standby_of.empty()) return RunStandbyRole(common);
  ob::launch::MasterOptions& o = g.master;
  if (o.plan_path.empty()) return ob::Status::Usage("no plan: give plan.pb (and hosts.txt)");
  ob::log::Init("master");
  RaiseOpenFileLimit();  // one connection per agent
  // Read once, checked and run as read: "-" and a pipe cannot be read again,
  // and a file replaced meanwhile would be checked as one plan, run as another.
  OB_ASSIGN_OR_RETURN(const ob::launch::PlanData plan, ob::launch::LoadPlanData(Absolute(o.plan_path)));
  OB_RETURN_IF_ERROR(MasterFromFlags(plan, common));
  o.argv = g_args;
  if (char cwd[PATH_MAX]; ::getcwd(cwd, sizeof cwd) != nullptr) o.cwd = cwd;
  o.metrics = o.metrics.empty() || o.metrics == "-" ? o.metrics : Absolute(o.metrics);
  ob::Result<int> rc = ob::launch::RunMaster(o);
  if (!rc.ok()) return rc.status();
  if (*rc != 0) return ob::Status(static_cast<ob::Code>(*rc), "training ended with status " + std::to_string(*rc));
  return ob::Status::Ok();
}

ob::Status MasterFromFlags(const ob::launch::PlanData& plan, const ob::cli::CommonOptions& common) {
  ob::launch::MasterOptions& o = g.master;
  OB_RETURN_IF_ERROR(ChoosePrecision(plan, &o));
  OB_RETURN_IF_ERROR(CheckEvalFlags(o));
  OB_RETURN_IF_ERROR(CheckData(plan, &o));
  o.plan_path = Absolute(o.plan_path);
  o.plan = plan.plan;
  o.log_to_run_dir = common.log_file.empty();
  o.ckpt_dir = Absolute(g.worker.ckpt_dir);
  o.resume = o.resume == "auto" ? o.resume : Absolute(o.resume);
  o.seed = g.worker.seed;
  o.eval_split = g.worker.eval_split;
  o.data = AbsoluteData(g.worker.data);
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
  OB_RETURN_IF_ERROR(CheckOptimizerFlags());
  for (const auto& i : g.inject) OB_RETURN_IF_ERROR(ob::launch::ParseInjection(i, -1).status());
  // Agents, and the workers they start, run this path on their hosts.
  o.self_exe = g.agent_exe.empty() ? SelfExe() : g.agent_exe;
  // Local hosts run this machine's programs: a missing worker program is
  // said now, not by every agent.
  if (o.rsh == "local") OB_RETURN_IF_ERROR(CheckWorkerExe(WorkerExe(o.self_exe)));
  o.build = BuildId();
  if (common.verbose > 0) g.log_flags.push_back("-v");
  if (common.quiet) g.log_flags.push_back("-q");
  o.agent_flags.insert(o.agent_flags.end(), g.log_flags.begin(), g.log_flags.end());
  const std::string self = WorkerExe(o.self_exe);
  o.worker_command = [self](const ob::launch::WorkerContext& c) { return WorkerCommand(c, self); };
  return ob::Status::Ok();
}

const ob::cli::Tool kTool{"launch", "Train across hosts, and keep training when hosts die.", Setup,
                          Run, RuntimeDetails, Reads,
                          [] { return std::vector<ob::cli::NamedFile>{{"--metrics", g.master.metrics}}; },
                          ConfigFileSpec()};

}  // namespace

// `ob-launch --standby-master-of ADDR:PORT --host H [...]`, as the master
// starts it: the secret on stdin's first line; then what the master says
// it runs with, parsed as this process's own command line.
int StandbyMain(int argc, char** argv) {
  std::string of, host;
  std::vector<std::string> extra;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--standby-master-of" && i + 1 < argc) {
      of = argv[++i];
    } else if (a == "--host" && i + 1 < argc) {
      host = argv[++i];
    } else {
      extra.push_back(a);  // --master-timeout S, -v: passed on
    }
  }
  ob::log::Init("standby-master", -1, host);
  std::string secret;
  for (char c; secret.size() < 4096 && ::read(0, &c, 1) == 1 && c != '\n';) secret += c;
  if (secret.empty() || of.empty() || host.empty()) {
    OB_LOG(Error) << "--standby-master-of is ob-launch's own (it reads the secret on stdin)";
    return static_cast<int>(ob::Code::kUsage);
  }
  ob::Result<ob::launch::StandbyStart> start = ob::launch::FetchStandbyStart(of, host, secret, 30000);
  if (!start.ok()) {
    OB_LOG(Error) << "cannot follow the master: " << start.status().message();
    return start.status().exit_code();
  }
  g_standby = std::move(start).value();
  g_standby_secret = secret;
  if (!g_standby.sync.cwd().empty() && ::chdir(g_standby.sync.cwd().c_str()) != 0) {
    OB_LOG(Warn) << "no directory " << g_standby.sync.cwd() << " here (the master's): relative paths of its "
                 << "command line are read from " << (std::getenv("HOME") ? std::getenv("HOME") : "/");
  }
  std::vector<std::string> args = {argv[0]};
  args.insert(args.end(), g_standby.sync.argv().begin(), g_standby.sync.argv().end());
  args.insert(args.end(), {"--standby-master-of", of, "--host", host});
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  return ob::cli::Main(static_cast<int>(args.size()), cargs.data(), kTool);
}

int main(int argc, char** argv) {
  if (argc > 0) g_argv0 = argv[0];
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--standby-master-of") == 0) return StandbyMain(argc, argv);
    g_args.push_back(argv[i]);
  }
  if (argc == 2 && std::strcmp(argv[1], "--standby-worker") == 0) {
    std::fprintf(stderr, "ob-launch: --standby-worker is %s's (started by agents)\n", kWorkerExeName);
    return static_cast<int>(ob::Code::kUsage);
  }
  return ob::cli::Main(argc, argv, kTool);
}
