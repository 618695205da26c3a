// ob-launch: train across hosts, and keep training when hosts die.
// The master by default; the same binary runs as an agent (--agent, started
// by the master through --rsh) and as a worker (--worker, started by an
// agent). Everything real is in lib/ob/launch/.
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <vector>

#include <unistd.h>

#include "ob/cli/cli.h"
#include "ob/control.pb.h"
#include "ob/launch/agent.h"
#include "ob/launch/inject.h"
#include "ob/launch/master.h"
#include "ob/launch/master_setup.h"
#include "ob/launch/worker.h"
#include "ob/log.h"

namespace {

struct Options {
  std::string plan;
  std::string hosts;
  std::string rsh = "ssh";
  int steps = 100;
  std::string data = "synthetic";
  std::string secret_file;
  std::string bind = "127.0.0.1";
  std::string metrics;
  std::string run_dir;
  double master_timeout = 3.0;
  double start_timeout = 30.0;
  std::string ckpt_dir;
  int64_t ckpt_every = 0;
  int ckpt_keep = 0;
  std::string resume;
  std::vector<std::string> inject;
  // Hidden: the agent and worker roles.
  bool agent = false;
  std::string master;
  std::string host;
  bool worker = false;
  int rank = -1;
  int world = 0;
  std::string store;
  uint64_t generation = 1;
  double lr = 1e-3;
  int warmup_steps = 0;
  uint64_t seed = 1234;
};

Options g;

std::string Absolute(const std::string& path) {
  if (path.empty() || path == "-" || path[0] == '/') return path;
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) != nullptr) return buf;
  return path;
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
        std::to_string(ctx.generation), std::string("--steps"), std::to_string(g.steps), std::string("--data"), g.data,
        std::string("--lr"), std::to_string(g.lr), std::string("--warmup-steps"),
        std::to_string(g.warmup_steps), std::string("--seed"), std::to_string(g.seed)}) {
    spec.add_argv(a);
  }
  if (!ctx.store.empty()) {
    spec.add_argv("--store");
    spec.add_argv(ctx.store);
  }
  if (!g.ckpt_dir.empty()) {
    for (const std::string& a : {std::string("--ckpt-dir"), Absolute(g.ckpt_dir),
                                 std::string("--ckpt-every"), std::to_string(g.ckpt_every)}) {
      spec.add_argv(a);
    }
  }
  return spec;
}

std::string SelfExe() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("ob-launch");
}

ob::Status Run(const ob::cli::CommonOptions& common) {
  if (g.agent + g.worker > 1) return ob::Status::Usage("--agent and --worker exclude each other");
  if (g.agent) {
    if (g.master.empty() || g.host.empty()) return ob::Status::Usage("--agent needs --master and --host");
    ob::log::Init("agent", -1, g.host);
    ob::launch::AgentOptions o;
    o.master = g.master;
    o.host = g.host;
    o.master_timeout_s = g.master_timeout;
    o.standby_exe = SelfExe();
    int rc = ob::launch::RunAgent(o);
    // The agent has logged why it stopped; exit with its status, no summary line.
    if (rc != 0) std::exit(rc);
    return ob::Status::Ok();
  }
  if (g.worker) {
    ob::log::Init("worker", g.rank);
    ob::launch::WorkerOptions w;
    w.rank = g.rank;
    w.world = g.world;
    w.store = g.store;
    w.generation = g.generation;
    w.ckpt_dir = g.ckpt_dir;
    w.ckpt_every = g.ckpt_every;
    w.steps = g.steps;
    w.data = g.data;
    w.lr = g.lr;
    w.warmup_steps = g.warmup_steps;
    w.seed = g.seed;
    if (const char* host = std::getenv("OB_HOST")) w.host = host;
    return ob::launch::RunWorker(w);
  }
  if (g.plan.empty()) return ob::Status::Usage("no plan: give plan.pb (and hosts.txt)");
  if (g.master_timeout <= 0 || g.start_timeout <= 0) {
    return ob::Status::Usage("timeouts must be positive");
  }
  ob::log::Init("master");
  // Refuse a plan whose model cannot take the data before any host is touched.
  OB_RETURN_IF_ERROR(ob::launch::CheckDataForPlan(Absolute(g.data), Absolute(g.plan)));
  ob::launch::MasterOptions o;
  o.plan_path = Absolute(g.plan);
  o.hosts_path = g.hosts;
  o.rsh = g.rsh;
  o.secret_file = g.secret_file;
  o.bind = g.bind;
  o.metrics = g.metrics;
  o.run_dir = g.run_dir;
  o.log_to_run_dir = common.log_file.empty();
  o.master_timeout_s = g.master_timeout;
  o.start_timeout_s = g.start_timeout;
  o.ckpt_dir = Absolute(g.ckpt_dir);
  o.ckpt_keep = g.ckpt_keep;
  o.resume = g.resume == "auto" ? g.resume : Absolute(g.resume);
  o.seed = g.seed;
  if (g.ckpt_every > 0 && g.ckpt_dir.empty()) return ob::Status::Usage("--ckpt-every needs --ckpt-dir");
  for (const auto& i : g.inject) OB_RETURN_IF_ERROR(ob::launch::ParseInjection(i, -1).status());
  o.self_exe = SelfExe();
  if (common.verbose > 0) o.agent_flags.push_back("-v");
  if (common.quiet) o.agent_flags.push_back("-q");
  // The rendezvous store workers form their groups through; on the bind address.
  std::unique_ptr<ob::launch::RendezvousStore> store;
  if (std::getenv("OB_TEST_WORKER_CMD") == nullptr) {
    std::string bind_addr;
    int bind_port = 0;
    OB_RETURN_IF_ERROR(ob::launch::ParseBind(g.bind, &bind_addr, &bind_port));
    OB_ASSIGN_OR_RETURN(store, ob::launch::RendezvousStore::Start(bind_addr));
    o.store = store->address();
    o.publish = [&store](const std::string& key, const std::string& value) {
      return store->Set(key, value);
    };
  }
  const std::string self = o.self_exe;
  o.worker_command = [self](const ob::launch::WorkerContext& c) { return WorkerCommand(c, self); };
  ob::Result<int> rc = ob::launch::RunMaster(o);
  if (!rc.ok()) return rc.status();
  if (*rc != 0) return ob::Status(static_cast<ob::Code>(*rc), "training ended with status " + std::to_string(*rc));
  return ob::Status::Ok();
}

void Setup(CLI::App& app) {
  app.add_option("PLAN", g.plan, "The plan to run (from ob-plan)")->option_text("PLAN");
  app.add_option("HOSTS", g.hosts, "Hosts file (see ob-formats(5)); Slurm's nodes when absent")
      ->option_text("HOSTS");
  app.add_option("--rsh", g.rsh, "How agents are started: ssh, local, or a prefix command (default ssh)")
      ->option_text("CMD");
  app.add_option("--steps", g.steps, "Training steps (default 100)")->option_text("N")
      ->check(CLI::PositiveNumber);
  app.add_option("--data", g.data, "Token file, text file, or 'synthetic' (the default)")
      ->option_text("SPEC");
  app.add_option("--lr", g.lr, "Peak learning rate (default 1e-3)")->option_text("X");
  app.add_option("--warmup-steps", g.warmup_steps, "Linear warm-up steps before cosine decay (default 0)")
      ->option_text("N");
  app.add_option("--seed", g.seed, "Seed of the weights and of data sampling (default 1234)")
      ->option_text("N");
  app.add_option("--secret-file", g.secret_file, "Shared secret for agents (mode 600; else $OB_SECRET)")
      ->option_text("FILE");
  app.add_option("--bind", g.bind, "Control channel address, ADDR[:PORT] (default 127.0.0.1)")
      ->option_text("ADDR");
  app.add_option("--metrics", g.metrics, "Write delimited Metrics records to FILE ('-' stdout)")
      ->option_text("FILE");
  app.add_option("--run-dir", g.run_dir, "Logs, events and control socket (default ./ob-run-TIME)")
      ->option_text("DIR");
  app.add_option("--master-timeout", g.master_timeout,
                 "Agents kill their workers after a silent master (default 3 s)")
      ->option_text("SECONDS");
  app.add_option("--start-timeout", g.start_timeout, "Time for every agent to connect (default 30 s)")
      ->option_text("SECONDS");
  app.add_option("--ckpt-dir", g.ckpt_dir, "Checkpoint directory (see ob-ckpt(1))")->option_text("DIR");
  app.add_option("--ckpt-every", g.ckpt_every, "Save a checkpoint every N steps, in the background")
      ->option_text("N")->check(CLI::NonNegativeNumber);
  app.add_option("--ckpt-keep", g.ckpt_keep, "Keep only the newest N checkpoints (default 0: all)")
      ->option_text("N")->check(CLI::NonNegativeNumber);
  app.add_option("--inject", g.inject,
                 "Fault injection for tests: RANK:slow=F, RANK:hang=STEP or RANK:nan=STEP")
      ->option_text("SPEC")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--resume", g.resume, "Start from a checkpoint: 'auto' (the latest in --ckpt-dir) or DIR")
      ->option_text("WHAT");
  // Roles started by ob-launch itself; not for people.
  app.add_flag("--agent", g.agent)->group("");
  app.add_option("--master", g.master)->group("");
  app.add_option("--host", g.host)->group("");
  app.add_flag("--worker", g.worker)->group("");
  app.add_option("--rank", g.rank)->group("");
  app.add_option("--world", g.world)->group("");
  app.add_option("--store", g.store)->group("");
  app.add_option("--generation", g.generation)->group("");
  app.footer(
      "Examples:\n"
      "  ob-launch --rsh local --steps 200 --secret-file secret plan.pb hosts.txt\n"
      "  ob-launch --bind 10.0.0.1 --metrics run.metrics plan.pb hosts.txt\n"
      "  echo status | socat - UNIX:ob-run-*/control.sock");
}

const ob::cli::Tool kTool{"launch", "Train across hosts, and keep training when hosts die.", Setup,
                          Run};

// `ob-launch --standby-worker`: started by an agent ahead of need, with
// LibTorch already loaded by the time it waits. Its stdin brings a
// WorkerSpec (then end of file): it takes the spec's environment and
// becomes that worker, in this process when the spec runs ob-launch,
// else by exec. End of file alone: it was not needed.
int RunStandby() {
  ob::launch::WarmUpLibTorch();
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
