#include "options.h"

#include <climits>
#include <cstdio>
#include <cstdlib>

#include <unistd.h>

#include "ob/build_info.h"
#include "ob/io/file.h"
#include "ob/launch/agent/peer_probe.h"
#include "ob/model/data.h"

namespace ob::launch_tool {

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

std::string AbsoluteData(const std::string& spec) {
  ob::Result<std::vector<ob::model::BlendPart>> parts = ob::model::ParseBlend(spec);
  if (spec == "synthetic" || !parts.ok() || parts->empty()) {
    if (spec == "synthetic") return spec;
    // A Megatron dataset's PREFIX names no file: its .bin's directory does.
    const std::string file = ob::model::DataFile(spec);
    if (file == spec + ".bin") {
      const std::string bin = Absolute(file);
      return bin.substr(0, bin.size() - 4);
    }
    return Absolute(spec);
  }
  std::string out;
  for (const ob::model::BlendPart& p : *parts) {
    out += (out.empty() ? "" : ",") + Exact(p.weight) + ":" + Absolute(p.path);
  }
  return out;
}

// Which build agents and the master are (Hello.build): the version line
// and the LibTorch it was built with; $OB_TEST_BUILD instead, for tests.
std::string BuildId() {
  if (const char* b = std::getenv("OB_TEST_BUILD"); b != nullptr && *b != '\0') return b;
  return ob::cli::VersionLine("launch") + ", LibTorch " OB_TORCH_VERSION;
}

std::string SelfExe() { return ob::io::SelfExe("ob-launch"); }

std::string WorkerExe(const std::string& launch_exe) { return ob::io::Beside(launch_exe, kWorkerExeName); }

void Setup(CLI::App& app) {
  app.add_option("PLAN", g.master.plan_path, "The plan to run (from ob-plan)")->option_text("PLAN");
  app.add_option("HOSTS", g.master.hosts_path, "Hosts file (see ob-formats(5)); Slurm's nodes when absent")
      ->option_text("HOSTS");
  app.add_option("--rsh", g.master.rsh, "How agents are started: ssh, local, slurm (srun steps of this job), or a prefix command (default ssh)")
      ->option_text("CMD");
  app.add_option("--agent-exe", g.agent_exe,
                 "Path of ob-launch on the hosts, with ob-launch-worker beside it (default: this one's)")
      ->option_text("PATH");
  app.add_option("--steps", g.worker.steps,
                 "Training steps (default 100); 0 with --resume and evaluation data: evaluate the checkpoint")
      ->option_text("N")
      ->check(ob::cli::NonNegative());
  app.add_option("--data", g.worker.data,
                 "Token file (*.bin, *.u32, a Megatron dataset's PREFIX), a blend W1:FILE1,W2:FILE2,..., a text "
                 "file, or 'synthetic' (the default)")
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
  app.add_option("--standby", g.standby,
                 "on (the default): each agent keeps a standby worker per slot, LibTorch loaded (and a CUDA "
                 "context made), for fast restarts, forked from one process per agent that loads LibTorch once; "
                 "exec: the same standbys, each loading LibTorch itself; off: none (the workers still fork from that "
                 "process)")
      ->option_text("on|exec|off")
      ->check(CLI::IsMember({"on", "exec", "off"}));
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
  app.add_option("--probe-port", g.probe_port,
                 "The port the agents' partition probes try on the other hosts (any answer, a refusal "
                 "included, means reachable), or 'off' (default 9)")
      ->option_text("PORT")
      ->check(CLI::Validator(
          [](std::string& v) {
            const Result<int> port = ob::launch::ParseProbePort(v);
            return port.ok() ? std::string() : port.status().message();
          },
          "PORT|off"));
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
                 "Fault injection for tests: RANK:slow=F, RANK:spin=F, RANK:hang=STEP, RANK:stall=STEP, RANK:nan=STEP, RANK:check=STEP or RANK:park=STEP; @GEN after one: in that generation only")
      ->option_text("SPEC")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--resume", g.master.resume, "Start from a checkpoint: 'auto' (the latest in --ckpt-dir) or DIR")
      ->option_text("WHAT");
  app.add_flag("--resume-from-other", g.master.resume_from_other,
               "Resume from a checkpoint another job saved (another seed or data)");
  app.add_option("--standby-master", g.master.standby_master,
                 "Where a standby master follows the master, to take over if the master's host is lost: a host "
                 "of HOSTS, 'off', or 'auto' (the default: the first host that is not the master's, with three "
                 "hosts or more)")
      ->option_text("HOST|auto|off");
  app.add_option("--master-host", g.master.master_host,
                 "The host of HOSTS this master runs on (default: this machine's name when listed; the batch "
                 "node under Slurm; the first host with --rsh local)")
      ->option_text("HOST");
  // Roles started by ob-launch itself; not for people.
  app.add_option("--standby-master-of", g.master.standby_of)->group("");
  app.add_flag("--agent", g.as_agent)->group("");
  app.add_option("--master", g.agent.master)->group("");
  app.add_option("--host", g.agent.host)->group("");
  app.add_option("--cpu-share", g.agent.cpu_share)->group("");
  app.add_flag("--worker", g.as_worker)->group("");
  app.add_flag("--probe", g.probe)->group("");
  app.add_option("--rank", g.worker.rank)->group("");
  app.add_option("--world", g.worker.world)->group("");
  app.add_option("--data-facts", g.worker.data_facts)->group("");
  app.add_option("--generation", g.worker.generation)->group("");
  app.footer(
      "Examples:\n"
      "  ob-launch --rsh local --steps 200 --secret-file secret plan.pb hosts.txt\n"
      "  ob-launch --bind 10.0.0.1 --metrics run.metrics plan.pb hosts.txt\n"
      "  ob-launch --config run.yaml --steps 50\n"
      "  ob-launch --rsh local --steps 200 --print-config > run.yaml\n"
      "  echo status | socat - UNIX:ob-run-*/control.sock");
}

ob::cli::ConfigSpec ConfigFileSpec() {
  ob::cli::ConfigSpec spec;
  spec.sections = {
      {"optimizer", "", {"lr", "warmup-steps", "min-lr", "lr-schedule", "weight-decay", "beta1", "beta2", "eps", "clip-norm"}},
      {"eval", "eval-", {}},
      {"ckpt", "ckpt-", {}},
  };
  // Accepted by every ob tool, but ob-launch writes no data file of its own.
  spec.omit = {"output", "json"};
  return spec;
}

// The files a run reads, and --metrics, which it writes (truncated at the
// start: over --data it would destroy the training set).
std::vector<ob::cli::NamedFile> Reads() {
  std::vector<ob::cli::NamedFile> reads{{"the plan", g.master.plan_path},
                                        {"the hosts file", g.master.hosts_path},
                                        {"--secret-file", g.master.secret_file}};
  // What is read: a Megatron dataset's .bin (its PREFIX names no file), a
  // blend's files.
  if (g.worker.data != "synthetic") {
    for (const std::string& f : ob::model::DataFiles(g.worker.data)) reads.push_back({"--data", f});
  }
  if (g.worker.eval_data != "synthetic") {
    for (const std::string& f : ob::model::DataFiles(g.worker.eval_data)) reads.push_back({"--eval-data", f});
  }
  return reads;
}

}  // namespace ob::launch_tool
