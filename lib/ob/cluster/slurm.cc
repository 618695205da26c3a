#include "ob/cluster/slurm.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <vector>

#include "ob/clock.h"

extern char** environ;

namespace ob::cluster {
namespace {

constexpr size_t kMaxScriptBytes = 16 << 20;  // Slurm's own limit is 4 MiB by default

bool IsOffValue(std::string_view v) {
  if (v.size() != 3) return false;
  std::string lower;
  for (char c : v) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower == "off";
}

std::vector<std::string_view> DirectiveWords(std::string_view line) {
  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    const size_t start = i;
    while (i < line.size() && !std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    if (i > start) words.push_back(line.substr(start, i - start));
  }
  return words;
}

// `argv`'s standard output, or nullopt when it cannot be run, exits
// non-zero, says more than kMaxScriptBytes, or takes longer than
// `timeout_s` (it is killed then). Its standard error is discarded.
std::optional<std::string> CaptureStdout(const std::vector<std::string>& argv, double timeout_s) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return std::nullopt;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int err = ::posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (err != 0) {
    ::close(fds[0]);
    return std::nullopt;
  }
  std::string out;
  bool complete = false;
  const int64_t end = SteadyMs() + static_cast<int64_t>(timeout_s * 1e3);
  for (;;) {
    const int64_t left = end - SteadyMs();
    if (left <= 0) break;
    pollfd p{fds[0], POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    char buf[65536];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      complete = n == 0;
      break;
    }
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > kMaxScriptBytes) break;
  }
  ::close(fds[0]);
  int status = 0;
  if (!complete) ::kill(pid, SIGKILL);
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!complete || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return out;
}

}  // namespace

std::optional<bool> NoKillDirective(std::string_view script) {
  std::optional<bool> said;
  size_t pos = 0;
  bool first = true;
  while (pos < script.size()) {
    size_t nl = script.find('\n', pos);
    if (nl == std::string_view::npos) nl = script.size();
    std::string_view line = script.substr(pos, nl - pos);
    pos = nl + 1;
    const bool shebang = first && line.substr(0, 2) == "#!";
    first = false;
    const std::vector<std::string_view> words = DirectiveWords(line);
    if (words.empty() || shebang) continue;
    if (words[0][0] != '#') break;  // the first command: sbatch reads no directive past it
    if (words[0] != "#SBATCH") continue;
    for (size_t i = 1; i < words.size() && words[i][0] != '#'; ++i) {
      const std::string_view w = words[i];
      if (w == "-k" || w == "--no-kill") {
        said = true;
      } else if (w.substr(0, 10) == "--no-kill=") {
        said = !IsOffValue(w.substr(10));
      }
    }
  }
  return said;
}

NodeFailPolicy JudgeNodeFail(const char* sbatch_no_kill, const char* salloc_no_kill,
                             const std::optional<std::string>& batch_script) {
  using Kind = NodeFailPolicy::Kind;
  for (const auto& [name, value] : {std::pair{"SBATCH_NO_KILL", sbatch_no_kill}, {"SALLOC_NO_KILL", salloc_no_kill}}) {
    if (value == nullptr) continue;
    if (IsOffValue(value)) return {Kind::kEndsJob, std::string(name) + "=" + value};
    return {Kind::kKeepsJob, std::string(name) + " set"};
  }
  if (batch_script) {
    if (std::optional<bool> d = NoKillDirective(*batch_script)) {
      return *d ? NodeFailPolicy{Kind::kKeepsJob, "#SBATCH --no-kill in the batch script"}
                : NodeFailPolicy{Kind::kEndsJob, "#SBATCH --no-kill=off in the batch script"};
    }
  }
  return {};
}

NodeFailPolicy ReadNodeFailPolicy(const std::string& job_id, double timeout_s) {
  const char* sb = std::getenv("SBATCH_NO_KILL");
  const char* sa = std::getenv("SALLOC_NO_KILL");
  if (sb != nullptr || sa != nullptr) return JudgeNodeFail(sb, sa, std::nullopt);
  return JudgeNodeFail(nullptr, nullptr, CaptureStdout({"scontrol", "write", "batch_script", job_id, "-"}, timeout_s));
}

bool EndJob(const std::string& job_id, double timeout_s) {
  return CaptureStdout({"scancel", job_id}, timeout_s).has_value();
}

std::string NodeFailWarning(const NodeFailPolicy& p, const std::string& job_id) {
  const std::string fix = "submit with sbatch --no-kill (or #SBATCH --no-kill) so that ob recovers from a node "
                          "failure in place";
  if (p.kind == NodeFailPolicy::Kind::kEndsJob) {
    return "Slurm will end job " + job_id + " when one of its nodes fails (" + p.source + "), whatever ob recovers: " +
           fix;
  }
  return "Slurm will end job " + job_id + " when one of its nodes fails, whatever ob recovers, unless it was " +
         "submitted with --no-kill, which neither its #SBATCH lines nor SBATCH_NO_KILL show (Slurm records the flag " +
         "nowhere else): " + fix;
}

}  // namespace ob::cluster
