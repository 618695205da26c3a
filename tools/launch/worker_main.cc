// ob-launch-worker: the worker of ob-launch, started by its agents (never
// by people): --worker (one pipeline stage of a generation: lib/ob/launch/
// worker.h), --standby-worker (loaded ahead of need, it becomes a worker
// when its agent hands it one), and --probe (the GPUs a worker here sees,
// and for ob-launch --version -v its runtime). It parses ob-launch's own
// flags (options.h), with which the master starts it. The one program of
// ob-launch's that links LibTorch: the master and the agents do not load it.
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

#include "ob/cli/cli.h"
#include "ob/clock.h"
#include "ob/control.pb.h"
#include "ob/io/message.h"
#include "ob/io/records.h"
#include "ob/launch/wire/devices.h"
#include "ob/launch/worker/blas.h"
#include "ob/launch/worker/heap.h"
#include "ob/launch/agent/standby_seed.h"
#include "ob/launch/worker/worker.h"
#include "ob/log.h"
#include "ob/metrics.pb.h"
#include "ob/torch_compat.h"
#include "options.h"

namespace {

using namespace ob::launch_tool;

// --probe: devices.h's ProbeResult on stdout. No CUDA call for --device
// cpu. The runtime line is the one a worker with these flags would log.
ob::Status Probe() {
  OB_ASSIGN_OR_RETURN(ob::launch::DeviceKind device, ob::launch::ParseDevice(g.worker.device));
  ob::launch::ProbeResult p;
  if (device != ob::launch::DeviceKind::kCpu) {
    p.gpus = ob::launch::VisibleGpus();
    for (int i = 0; i < p.gpus; ++i) {
      p.gpu_ids.push_back(ob::compat::CudaDeviceUuid(i));
      p.gpu_memory.push_back(ob::compat::CudaTotalMemory(i));
      p.gpu_names.push_back(ob::compat::CudaDeviceName(i));
    }
  }
  const ob::launch::DeviceKind here = ob::launch::ResolveDevice(device, p.gpus);
  auto precision = ob::launch::ResolvePrecision(g.worker.precision, here);
  if (precision.ok()) p.runtime = ob::launch::DescribeRuntime(ob::launch::DeviceName(here), *precision);
  const std::string out = ob::launch::FormatProbe(p);
  if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size() || std::fflush(stdout) != 0) {
    return ob::Status::IoErr(std::string("<stdout>: ") + std::strerror(errno));
  }
  return ob::Status::Ok();
}

ob::Status Run(const ob::cli::CommonOptions&) {
  if (g.probe) return Probe();
  if (!g.as_worker) {
    return ob::Status::Usage(std::string(kWorkerExeName) +
                             " is started by ob-launch's agents (--worker, --standby-worker, --probe)");
  }
  ob::log::Init("worker", g.worker.rank);
  if (const char* host = std::getenv("OB_HOST")) g.worker.host = host;
  return ob::launch::RunWorker(g.worker);
}

// Named "launch": its messages, --version and build are ob-launch's.
const ob::cli::Tool kTool{"launch", "The worker of ob-launch (started by its agents).", Setup, Run};

// `ob-launch-worker --standby-worker`: started by an agent ahead of need, with
// LibTorch already loaded by the time it waits, which it says with one
// heartbeat record on stdout (its agent reads it when it hands the role:
// a standby that said so must start within kRoleAckMs). Its stdin brings a
// WorkerSpec (then end of file): it takes the spec's environment and
// becomes that worker, in this process when the spec runs this program
// (through a link or not), else by exec (OB_TEST_WORKER_CMD's shell). End
// of file alone: it was not needed.
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
    std::fprintf(stderr, "ob-launch-worker: standby worker: stdin is not a worker spec\n");
    return static_cast<int>(ob::Code::kDataErr);
  }
  for (const auto& [k, v] : spec.env()) setenv(k.c_str(), v.c_str(), 1);
  std::vector<std::string> args(spec.argv().begin(), spec.argv().end());
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  char real[PATH_MAX];  // the spec names this program, perhaps through a link
  if (realpath(args[0].c_str(), real) == nullptr || SelfExe() != real) {
    execvp(cargs[0], cargs.data());
    std::fprintf(stderr, "ob-launch-worker: standby worker: cannot run '%s': %s\n", cargs[0], std::strerror(errno));
    return 127;
  }
  return ob::cli::Main(static_cast<int>(args.size()), cargs.data(), kTool);
}

// `ob-launch-worker --seed-standby-workers`: the agent's standby seed
// (lib/ob/launch/agent/standby_seed.h). It serves fork requests until its agent
// closes the socket; each forked process comes back here and becomes a
// standby, its pools sized from the environment it was given (the seed's
// were loaded at one thread each).
int RunSeed() {
  ob::launch::SeedRequest request;
  ob::Result<bool> forked = ob::launch::ServeSeed(ob::cluster::kPassedFd, &request);
  if (!forked.ok()) {
    std::fprintf(stderr, "ob-launch-worker: standby seed: %s\n", forked.status().message().c_str());
    return forked.status().exit_code();
  }
  if (!*forked) return 0;
  ob::Status st = ob::launch::BecomeStandby(request);
  if (!st.ok()) {
    std::fprintf(stderr, "ob-launch-worker: forked standby: %s\n", st.message().c_str());
    return st.exit_code();
  }
  auto count = [](const char* var) {
    const char* v = std::getenv(var);
    return v != nullptr ? std::atoi(v) : 0;
  };
  if (int n = count("OMP_NUM_THREADS"); n > 0) at::set_num_threads(n);
  ob::launch::SetBlasThreads(count("OPENBLAS_NUM_THREADS"), count("MKL_NUM_THREADS"));
  return RunStandby();
}

// The way out of every role skips the C++ static destructors. LibTorch's
// deregister each of its thousands of operator kernels one by one; in a
// worker forked from the seed (standby_seed.h) the tables they write are on
// pages shared with the seed, so each write is a copy-on-write fault and a
// TLB flush on every CPU: 0.3-0.5 s of CPU on the 2-core test VMs, after
// the heartbeat thread has stopped, and seconds of silence on a loaded
// host, where the agent took it for a stuck start and the master for a
// hang (issue 54). Nothing is lost: the roles have joined their threads
// and closed their files by the time they return, logs are written
// unbuffered (log.h), and stdio is flushed here.
[[noreturn]] void Exit(int code) {
  std::fflush(nullptr);
  std::_Exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything allocates; a seed's forked workers inherit it.
  ob::launch::KeepFreedMemory();
  if (argc == 2 && std::strcmp(argv[1], "--standby-worker") == 0) Exit(RunStandby());
  if (argc == 2 && std::strcmp(argv[1], ob::launch::kSeedFlag) == 0) Exit(RunSeed());
  Exit(ob::cli::Main(argc, argv, kTool));
}
