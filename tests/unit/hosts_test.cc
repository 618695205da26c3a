// Hosts files, Slurm node lists and remote-start argv (design/launch.md).
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "ob/cluster/hosts.h"
#include "ob/cluster/rsh.h"
#include "ob/cluster/slurm.h"

using ob::Code;
using ob::cluster::Host;
using ob::cluster::HostsFromSlurm;
using ob::cluster::ParseHosts;
using ob::cluster::RshArgv;

namespace {

// The message of a refused hosts text (fails the test if it was accepted).
std::string Refusal(const std::string& text) {
  auto r = ParseHosts(text, "hosts.txt");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kConfig);
  return r.status().message();
}

std::vector<std::string> Names(const std::vector<Host>& hosts) {
  std::vector<std::string> n;
  for (const auto& h : hosts) n.push_back(h.name);
  return n;
}

}  // namespace

TEST_CASE("hosts: every field, comments and blank lines", "[hosts]") {
  auto r = ParseHosts(
      "# cluster\n"
      "\n"
      "a\n"
      "  b slots=4 port=29500   # trailing comment\n"
      "c.example-1 addr=10.0.0.3 slots=2\r\n"
      "d_4 addr=fe80::1%eth0\n"
      "\t# indented comment\n",
      "hosts.txt");
  REQUIRE(r.ok());
  const auto& h = *r;
  REQUIRE(h.size() == 4);
  CHECK(h[0].name == "a");
  CHECK(h[0].slots == 1);
  CHECK(h[0].port == 0);
  CHECK(h[0].addr.empty());
  CHECK(h[0].line == 3);
  CHECK(h[1].name == "b");
  CHECK(h[1].slots == 4);
  CHECK(h[1].port == 29500);
  CHECK(h[1].line == 4);
  CHECK(h[2].name == "c.example-1");
  CHECK(h[2].addr == "10.0.0.3");
  CHECK(h[2].slots == 2);
  CHECK(h[3].addr == "fe80::1%eth0");
}

TEST_CASE("hosts: no trailing newline, port bounds", "[hosts]") {
  auto r = ParseHosts("x port=0\ny port=65535", "h");
  REQUIRE(r.ok());
  CHECK(r->size() == 2);
  CHECK((*r)[1].port == 65535);
}

TEST_CASE("hosts: refusals name the file and line", "[hosts]") {
  CHECK(Refusal("a\nb\na\n") == "hosts.txt:3: duplicate host 'a' (first on line 1)");
  CHECK(Refusal("a gpus=2\n") ==
        "hosts.txt:1: host 'a': unknown key 'gpus' (known: slots, port, addr)");
  CHECK(Refusal("\na slots=x\n").rfind("hosts.txt:2: host 'a': bad slots 'x'", 0) == 0);
  CHECK(Refusal("a slots=0\n").rfind("hosts.txt:1: host 'a': bad slots '0'", 0) == 0);
  CHECK(Refusal("a slots=-1\n").rfind("hosts.txt:1: host 'a': bad slots", 0) == 0);
  CHECK(Refusal("a slots=\n").rfind("hosts.txt:1: host 'a': bad slots ''", 0) == 0);
  CHECK(Refusal("a slots=99999999999999999999\n").find("bad slots") != std::string::npos);
  CHECK(Refusal("a port=65536\n") == "hosts.txt:1: host 'a': bad port '65536' (0..65535)");
  CHECK(Refusal("a port=-1\n").find("bad port") != std::string::npos);
  CHECK(Refusal("a port=22x\n").find("bad port") != std::string::npos);
  CHECK(Refusal("a slots=2 slots=3\n") == "hosts.txt:1: host 'a': slots given twice");
  CHECK(Refusal("a addr=1.2.3.4 addr=1.2.3.5\n") == "hosts.txt:1: host 'a': addr given twice");
  CHECK(Refusal("a addr=\n").find("bad addr") != std::string::npos);
  CHECK(Refusal("a addr=$(reboot)\n").find("bad addr") != std::string::npos);
  CHECK(Refusal("a extra\n") == "hosts.txt:1: host 'a': expected key=value, got 'extra'");
  CHECK(Refusal("slots=2\n") == "hosts.txt:1: expected a host name first, got 'slots=2'");
  CHECK(Refusal("") == "hosts.txt: no hosts");
  CHECK(Refusal("# only comments\n\n   \n") == "hosts.txt: no hosts");
}

TEST_CASE("hosts: names with shell or odd characters are refused", "[hosts]") {
  for (const char* bad : {"a;reboot", "a$b", "a`b`", "a|b", "a&b", "a>b", "a<b", "a'b", "a\"b",
                          "a\\b", "a(b)", "a*", "a?", "a/b", "a:b", "a@b", "-oProxyCommand",
                          "h\xc3\xa9"}) {
    INFO(bad);
    std::string m = Refusal(std::string(bad) + "\n");
    CHECK(m.rfind("hosts.txt:1: bad host name", 0) == 0);
  }
  // A control character other than tab/CR is not a separator: refused too.
  CHECK(Refusal(std::string("a\x01") + "b\n").find("bad host name 'a\\x01b'") != std::string::npos);
}

TEST_CASE("hosts: LoadHosts reads a file and names it", "[hosts]") {
  std::string path = "/tmp/ob_hosts_test_" + std::to_string(::getpid()) + ".txt";
  {
    std::ofstream out(path);
    out << "n1 slots=2\nn1\n";
  }
  auto r = ob::cluster::LoadHosts(path);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == path + ":2: duplicate host 'n1' (first on line 1)");
  std::remove(path.c_str());

  auto missing = ob::cluster::LoadHosts(path);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == Code::kNoInput);
  CHECK(missing.status().message() == path + ": cannot open: No such file or directory");

  // A directory was read as an empty file: "/tmp: no hosts".
  auto dir = ob::cluster::LoadHosts("/tmp");
  REQUIRE_FALSE(dir.ok());
  CHECK(dir.status().code() == Code::kNoInput);
  CHECK(dir.status().message() == "/tmp: is a directory");
}

TEST_CASE("hosts: slurm node lists", "[hosts][slurm]") {
  auto r = HostsFromSlurm("node[01-03,7],gpu5");
  REQUIRE(r.ok());
  CHECK(Names(*r) == std::vector<std::string>{"node01", "node02", "node03", "node7", "gpu5"});
  CHECK((*r)[0].slots == 1);

  r = HostsFromSlurm("r[1-2]-n[08-10]");
  REQUIRE(r.ok());
  CHECK(Names(*r) == std::vector<std::string>{"r1-n08", "r1-n09", "r1-n10", "r2-n08", "r2-n09",
                                              "r2-n10"});
  r = HostsFromSlurm("single");
  REQUIRE(r.ok());
  CHECK(Names(*r) == std::vector<std::string>{"single"});
  r = HostsFromSlurm("a[9-11]");
  REQUIRE(r.ok());
  CHECK(Names(*r) == std::vector<std::string>{"a9", "a10", "a11"});
  r = HostsFromSlurm("tux[0-1023]");
  REQUIRE(r.ok());
  CHECK(r->size() == 1024);

  for (const char* bad : {"", "a,,b", "a[", "a]", "a[]", "a[3-1]", "a[x]", "a[1-]", "a[1,2",
                          "a[1-2],a1", "a;b", "a[0-999999999]", "a[1-2][[3]]"}) {
    INFO(bad);
    auto e = HostsFromSlurm(bad);
    REQUIRE_FALSE(e.ok());
    CHECK(e.status().code() == Code::kConfig);
    CHECK(e.status().message().rfind("slurm node list '", 0) == 0);
  }
  CHECK(HostsFromSlurm("a[1-2],a1").status().message() ==
        "slurm node list 'a[1-2],a1': duplicate host 'a1'");
}

TEST_CASE("rsh: argv for local, ssh, prefixes and {host}", "[rsh]") {
  Host h;
  h.name = "node7";
  std::vector<std::string> cmd = {"/opt/ob/bin/ob-profile", "--net-agent"};
  CHECK(RshArgv("local", h, cmd) == cmd);
  CHECK(RshArgv("ssh", h, cmd) == std::vector<std::string>{"ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "node7",
                                                           "/opt/ob/bin/ob-profile", "--net-agent"});
  CHECK(RshArgv("/usr/bin/ssh -p 2222", h, cmd) ==
        std::vector<std::string>{"/usr/bin/ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-p", "2222", "node7",
                                 "/opt/ob/bin/ob-profile", "--net-agent"});
  CHECK(RshArgv("ip netns exec", h, cmd) ==
        std::vector<std::string>{"ip", "netns", "exec", "node7", "/opt/ob/bin/ob-profile",
                                 "--net-agent"});
  CHECK(RshArgv("  srun  -w {host} --  ", h, cmd) ==
        std::vector<std::string>{"srun", "-w", "node7", "--", "/opt/ob/bin/ob-profile",
                                 "--net-agent"});
  // slurm: a step of one task on the host, in the current job.
  CHECK(RshArgv("slurm", h, cmd) ==
        std::vector<std::string>{"srun", "--overlap", "-N1", "-n1", "-w", "node7", "--kill-on-bad-exit=0",
                                 "--cpu-bind=none", "--quiet", "--job-name=ob-agent", "/opt/ob/bin/ob-profile",
                                 "--net-agent"});
  CHECK(RshArgv("docker exec ob-{host}", h, {"x"}) ==
        std::vector<std::string>{"docker", "exec", "ob-node7", "x"});
  // ssh hands the command to the remote shell: words that need it are quoted.
  CHECK(RshArgv("ssh", h, {"/opt/my dir/ob", "it's"}) ==
        std::vector<std::string>{"ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "node7", "'/opt/my dir/ob'",
                                 "'it'\\''s'"});
  // No shell for other prefixes: words are passed through as they are.
  CHECK(RshArgv("ip netns exec", h, {"/opt/my dir/ob"}).back() == "/opt/my dir/ob");
}

TEST_CASE("rsh: spawn with pipes, exit status, exec failure, kill", "[rsh]") {
  auto child = ob::cluster::SpawnWithPipes({"cat"});
  REQUIRE(child.ok());
  std::string msg = "hello\n";
  REQUIRE(::write(child->stdin_fd(), msg.data(), msg.size()) == static_cast<ssize_t>(msg.size()));
  child->CloseStdin();
  char buf[16] = {};
  ssize_t n = ::read(child->stdout_fd(), buf, sizeof buf);
  CHECK(std::string(buf, n > 0 ? n : 0) == msg);
  CHECK(child->Wait() == 0);

  auto fail = ob::cluster::SpawnWithPipes({"sh", "-c", "exit 3"});
  REQUIRE(fail.ok());
  CHECK(fail->Wait() == 3);

  auto missing = ob::cluster::SpawnWithPipes({"/nonexistent/ob-nothing"});
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == Code::kUnavailable);
  CHECK(missing.status().message() ==
        "cannot run '/nonexistent/ob-nothing': No such file or directory");

  auto sleeper = ob::cluster::SpawnWithPipes({"sleep", "30"});
  REQUIRE(sleeper.ok());
  CHECK(sleeper->WaitFor(0.05) == -1);
  sleeper->Kill();
  CHECK(sleeper->Wait() == 128 + 9);

  // The destructor kills and reaps: no child is left behind.
  pid_t pid;
  {
    auto s = ob::cluster::SpawnWithPipes({"sleep", "30"});
    REQUIRE(s.ok());
    pid = s->pid();
  }
  CHECK(::kill(pid, 0) != 0);
}

TEST_CASE("rsh: descriptors passed to a child land on 3, 4, ... whatever their numbers", "[rsh]") {
  // Two pipes whose write ends sit at 3 and 4 in this process and are
  // passed swapped ({4, 3}): moving them naively, the first dup2 would
  // overwrite the second's source.
  auto high = [](int fd) {
    int h = ::fcntl(fd, F_DUPFD_CLOEXEC, 100);
    ::close(fd);
    return h;
  };
  int a[2], b[2];
  REQUIRE(::pipe2(a, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(b, O_CLOEXEC) == 0);
  for (int* fd : {&a[0], &a[1], &b[0], &b[1]}) *fd = high(*fd);
  const int saved3 = ::fcntl(3, F_DUPFD_CLOEXEC, 100), saved4 = ::fcntl(4, F_DUPFD_CLOEXEC, 100);
  REQUIRE(::dup3(a[1], 3, O_CLOEXEC) == 3);
  REQUIRE(::dup3(b[1], 4, O_CLOEXEC) == 4);
  ::close(a[1]);
  ::close(b[1]);
  auto child = ob::cluster::SpawnWithPipes({"sh", "-c", "echo three >&3; echo four >&4"}, nullptr,
                                           {4, 3});
  ::close(3);
  ::close(4);
  if (saved3 >= 0) ::dup3(saved3, 3, O_CLOEXEC), ::close(saved3);
  if (saved4 >= 0) ::dup3(saved4, 4, O_CLOEXEC), ::close(saved4);
  REQUIRE(child.ok());
  CHECK(child->Wait() == 0);
  char buf[32] = {};
  ssize_t n = ::read(b[0], buf, sizeof buf);  // ours at 4 became the child's 3
  CHECK(std::string(buf, n > 0 ? static_cast<size_t>(n) : 0) == "three\n");
  n = ::read(a[0], buf, sizeof buf);
  CHECK(std::string(buf, n > 0 ? static_cast<size_t>(n) : 0) == "four\n");
  ::close(a[0]);
  ::close(b[0]);

  // -1 leaves a number unused; the next still lands on 4.
  int c[2];
  REQUIRE(::pipe2(c, O_CLOEXEC) == 0);
  auto gap = ob::cluster::SpawnWithPipes({"sh", "-c", "echo ok >&4"}, nullptr, {-1, c[1]});
  REQUIRE(gap.ok());
  ::close(c[1]);
  CHECK(gap->Wait() == 0);
  n = ::read(c[0], buf, sizeof buf);
  CHECK(std::string(buf, n > 0 ? static_cast<size_t>(n) : 0) == "ok\n");
  ::close(c[0]);
}

// --- What Slurm does on a node failure (cluster/slurm.h) -------------------

TEST_CASE("slurm: --no-kill is read from the #SBATCH lines as sbatch reads them") {
  using ob::cluster::NoKillDirective;
  CHECK(NoKillDirective("#!/bin/bash\n#SBATCH -N4\n#SBATCH --no-kill\nsrun x\n") == true);
  CHECK(NoKillDirective("#!/bin/bash\n#SBATCH -N4 -k --exclusive\n") == true);
  CHECK(NoKillDirective("#!/bin/sh\n\n# a comment\n#SBATCH --no-kill=yes\n") == true);
  CHECK(NoKillDirective("#!/bin/bash\n#SBATCH --no-kill=off\n") == false);
  CHECK(NoKillDirective("#!/bin/bash\n#SBATCH --no-kill=OFF\n") == false);
  // A later directive wins.
  CHECK(NoKillDirective("#SBATCH --no-kill\n#SBATCH --no-kill=off\n") == false);
  CHECK(NoKillDirective("#SBATCH --no-kill=off\n#SBATCH -k\n") == true);
  // None: no directive, one past the first command, one commented out, or
  // another option that merely looks alike.
  CHECK_FALSE(NoKillDirective("#!/bin/bash\nsrun hostname\n").has_value());
  CHECK_FALSE(NoKillDirective("#!/bin/bash\nset -u\n#SBATCH --no-kill\n").has_value());
  CHECK_FALSE(NoKillDirective("#!/bin/bash\n##SBATCH --no-kill\n").has_value());
  CHECK_FALSE(NoKillDirective("#!/bin/bash\n#SBATCH -N2 # --no-kill later\n").has_value());
  CHECK_FALSE(NoKillDirective("#!/bin/bash\n#SBATCH --kill-on-invalid-dep=yes\n#SBATCH --no-killer\n").has_value());
  CHECK_FALSE(NoKillDirective("").has_value());
  // contrib/ob-train.sbatch asks for it.
  std::ifstream in(std::string(OB_SOURCE_DIR) + "/contrib/ob-train.sbatch");
  REQUIRE(in);
  std::string script((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(NoKillDirective(script) == true);
}

TEST_CASE("slurm: the environment over the script, and unknown when neither says") {
  using ob::cluster::JudgeNodeFail;
  using Kind = ob::cluster::NodeFailPolicy::Kind;
  const std::string keeps = "#!/bin/bash\n#SBATCH --no-kill\n", plain = "#!/bin/bash\necho\n";
  CHECK(JudgeNodeFail(nullptr, nullptr, keeps).kind == Kind::kKeepsJob);
  CHECK(JudgeNodeFail(nullptr, nullptr, plain).kind == Kind::kUnknown);
  CHECK(JudgeNodeFail(nullptr, nullptr, std::nullopt).kind == Kind::kUnknown);
  CHECK(JudgeNodeFail("1", nullptr, plain).kind == Kind::kKeepsJob);
  CHECK(JudgeNodeFail("", nullptr, std::nullopt).kind == Kind::kKeepsJob);
  CHECK(JudgeNodeFail(nullptr, "yes", std::nullopt).kind == Kind::kKeepsJob);
  auto off = JudgeNodeFail("off", nullptr, keeps);
  CHECK(off.kind == Kind::kEndsJob);
  CHECK(off.source == "SBATCH_NO_KILL=off");
  auto w = ob::cluster::NodeFailWarning(off, "12");
  CHECK(w.find('\n') == std::string::npos);
  CHECK(w.find("job 12") != std::string::npos);
  CHECK(w.find("--no-kill") != std::string::npos);
  auto u = ob::cluster::NodeFailWarning(JudgeNodeFail(nullptr, nullptr, plain), "7");
  CHECK(u.find('\n') == std::string::npos);
  CHECK(u.find("sbatch --no-kill") != std::string::npos);
}
