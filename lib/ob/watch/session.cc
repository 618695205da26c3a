#include "ob/watch/session.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "ob/clock.h"
#include "ob/io/file.h"
#include "ob/io/records.h"
#include "ob/log.h"
#include "ob/watch/events.h"
#include "ob/watch/plot.h"
#include "ob/watch/prometheus.h"
#include "ob/watch/records.h"
#include "ob/watch/summary.h"
#include "ob/watch/watcher.h"

namespace ob::watch {
namespace {

constexpr auto kTick = std::chrono::milliseconds(200);   // wall-clock hang checks
constexpr int64_t kRedrawMs = 1000;                       // live terminal summary
constexpr size_t kSummaryEvents = 8;

std::atomic<bool> g_stop{false};

// Records from the reader thread to the session's.
struct Queue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<pb::Metrics> records;
  bool done = false;
  Status status;
};

void ReadLoop(int fd, bool owned, bool socket, std::string name, std::shared_ptr<Queue> q) {
  Status status;
  char first = 0;
  // A master that does not stream answers with one JSON line instead.
  if (socket && ::recv(fd, &first, 1, MSG_PEEK) == 1 && first == '{') {
    std::string line;
    char c;
    while (line.size() < 4096 && ::read(fd, &c, 1) == 1 && c != '\n') line.push_back(c);
    status = Status::Unavailable(name + ": the master does not stream metrics: " + line);
  } else {
    io::RecordReader reader(fd, name);
    for (;;) {
      pb::Metrics m;
      Result<bool> got = reader.Next(&m);
      if (!got.ok()) {
        status = got.status();
        break;
      }
      if (!*got) break;
      std::lock_guard<std::mutex> lock(q->mu);
      q->records.push_back(std::move(m));
      q->cv.notify_one();
    }
  }
  if (owned) ::close(fd);
  std::lock_guard<std::mutex> lock(q->mu);
  q->done = true;
  q->status = status;
  q->cv.notify_one();
}

// Waits up to kTick for records and moves them into *batch. True once the
// stream has ended and nothing is left; *status is then the stream's.
bool NextBatch(Queue& q, std::deque<pb::Metrics>* batch, Status* status) {
  std::unique_lock<std::mutex> lock(q.mu);
  q.cv.wait_for(lock, kTick, [&] { return !q.records.empty() || q.done; });
  batch->swap(q.records);
  const bool done = q.done && batch->empty();
  if (done) *status = q.status;
  return done;
}

Result<int> ConnectAndWatch(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof addr.sun_path) return Status::Usage(path + ": too long for a unix socket path");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Unavailable(path + ": socket: " + std::strerror(errno));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Status::Unavailable(path + ": cannot connect: " + why + " (is ob-launch running there?)");
  }
  const char request[] = "watch\n";
  if (::send(fd, request, sizeof request - 1, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof request - 1)) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Status::Unavailable(path + ": cannot send 'watch': " + why);
  }
  return fd;
}

bool IsAnomaly(const pb::Event& e) {
  return e.kind() != pb::EVENT_ACTION && e.kind() != pb::EVENT_RECOVERY &&
         e.severity() >= pb::SEVERITY_WARNING;
}

}  // namespace

std::string ControlSocketPath(const std::string& run_dir) {
  return run_dir.empty() || run_dir.back() == '/' ? run_dir + "control.sock" : run_dir + "/control.sock";
}

Status RunSession(const SessionOptions& o) {
  const bool attached = !o.attach_dir.empty();
  const Clock clock = o.clock == "wall" || (o.clock.empty() && attached) ? Clock::kWall : Clock::kStream;
  const std::string control = !o.control.empty() ? o.control
                              : attached         ? ControlSocketPath(o.attach_dir)
                                                 : "";
  if (o.act && !o.dry_run && control.empty())
    return Status::Usage("--act needs the master's control socket: --attach RUN_DIR or --control SOCKET");

  // The input.
  int in_fd = STDIN_FILENO;
  bool owned = false;
  std::string name = "<stdin>";
  if (attached) {
    name = ControlSocketPath(o.attach_dir);
    OB_ASSIGN_OR_RETURN(in_fd, ConnectAndWatch(name));
    owned = true;
  } else if (o.input != "-") {
    name = o.input;
    in_fd = ::open(o.input.c_str(), O_RDONLY | O_CLOEXEC);
    if (in_fd < 0) return Status::NoInput(o.input + ": cannot open: " + std::strerror(errno));
    owned = true;
  }

  // The outputs.
  const bool human = o.terminal && o.output == "-" && !o.json;
  int out_fd = STDOUT_FILENO;
  const std::string out_name = io::DisplayName(o.output, true);
  if (o.output != "-") {
    out_fd = ::open(o.output.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out_fd < 0) {
      if (owned) ::close(in_fd);
      return Status::IoErr(o.output + ": cannot create: " + std::strerror(errno));
    }
  }
  struct CloseOut {
    int fd;
    ~CloseOut() { if (fd != STDOUT_FILENO) ::close(fd); }
  } close_out{out_fd};

  g_stop = false;
  struct sigaction sa{};
  sa.sa_handler = [](int) { g_stop = true; };
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int{}, old_term{};
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  struct RestoreSignals {
    struct sigaction *i, *t;
    ~RestoreSignals() {
      ::sigaction(SIGINT, i, nullptr);
      ::sigaction(SIGTERM, t, nullptr);
    }
  } restore_signals{&old_int, &old_term};

  if (!o.records.empty()) {  // every record as text, nothing else
    auto queue = std::make_shared<Queue>();
    std::thread(ReadLoop, in_fd, owned, attached, name, queue).detach();
    Status written = o.records == "csv"
                         ? io::WriteAll(out_fd, RecordCsvHeader(*pb::Metrics::descriptor()) + "\n", out_name)
                         : Status::Ok();
    for (;;) {
      std::deque<pb::Metrics> batch;
      Status stream;
      const bool done = NextBatch(*queue, &batch, &stream);
      std::string text;
      for (const auto& m : batch) text += (o.records == "csv" ? RecordCsvRow(m) : RecordJson(m)) + "\n";
      if (written.ok() && !text.empty()) written = io::WriteAll(out_fd, text, out_name);
      if (done) return stream.ok() ? written : stream;
      if (g_stop || !written.ok()) return written;
    }
  }

  Watcher watcher(o.detectors, clock);
  std::mutex state_mu;  // guards watcher against the Prometheus thread
  std::unique_ptr<MetricsServer> server;
  if (!o.metrics_addr.empty()) {
    auto started = MetricsServer::Start(o.metrics_addr, [&] {
      std::lock_guard<std::mutex> lock(state_mu);
      return PrometheusText(watcher.state());
    });
    if (!started.ok()) {
      if (owned) ::close(in_fd);
      return started.status();
    }
    server = std::move(started).value();
    OB_LOG(Info) << "serving Prometheus metrics at http://" << server->address() << "/metrics";
  }

  auto queue = std::make_shared<Queue>();
  std::thread(ReadLoop, in_fd, owned, attached, name, queue).detach();

  Timeline timeline;
  ActionPolicy policy(o.actions);
  std::map<pb::EventKind, uint64_t> anomalies;
  Status out_status;
  int64_t last_redraw = 0;

  auto emit = [&](const pb::Event& e) {
    if (!o.plot.empty()) timeline.AddEvent(e);
    std::string bytes;
    if (human) bytes = EventLine(e) + "\n";
    else if (o.json) bytes = EventJson(e) + "\n";
    else AppendEventRecord(e, &bytes);
    if (human && clock == Clock::kWall) return;  // the live summary shows it
    if (out_status.ok()) out_status = io::WriteAll(out_fd, bytes, out_name);
  };
  auto act = [&](const pb::Event& e) {
    std::optional<ActionRequest> req = policy.Consider(e, watcher.state().now_ms);
    if (!req) {
      if (!policy.why_not().empty()) {
        OB_LOG(Debug) << "no action after " << KindName(e.kind()) << ": " << policy.why_not();
      }
      return;
    }
    pb::Event done;
    if (o.dry_run) {
      done = ActionEvent(*req, nullptr, watcher.state().now_ms);
    } else {
      Result<ActionAnswer> answer = SendControlRequest(control, req->line, o.answer_timeout_s);
      ActionAnswer failed;
      if (!answer.ok()) failed.error = answer.status().message();
      done = ActionEvent(*req, answer.ok() ? &*answer : &failed, watcher.state().now_ms);
    }
    OB_LOG(Warn) << "action: " << done.message();
    OB_LOG(Debug) << "request: " << req->line << "; answer: " << done.response();
    {
      std::lock_guard<std::mutex> lock(state_mu);
      watcher.Note(done);
    }
    emit(done);
  };
  auto handle = [&](const std::vector<pb::Event>& events) {
    for (const auto& e : events) {
      if (IsAnomaly(e)) anomalies[e.kind()]++;
      OB_LOG(Debug) << EventLine(e);
      emit(e);
      if (o.act) act(e);
    }
  };
  auto redraw = [&] {
    std::string text;
    {
      std::lock_guard<std::mutex> lock(state_mu);
      text = SummaryTable(watcher.state(), o.detectors, name, kSummaryEvents);
    }
    (void)io::WriteAll(STDOUT_FILENO, "\033[H\033[2J" + text, "<stdout>");
  };

  Status stream_status;
  for (;;) {
    std::deque<pb::Metrics> batch;
    const bool done = NextBatch(*queue, &batch, &stream_status);
    std::vector<pb::Event> events;
    {
      std::lock_guard<std::mutex> lock(state_mu);
      for (const auto& m : batch) {
        watcher.Feed(m, UnixMs(), &events);
        if (!o.plot.empty()) timeline.Add(m);
      }
      watcher.Tick(UnixMs(), &events);
    }
    handle(events);
    if (human && clock == Clock::kWall && UnixMs() - last_redraw >= kRedrawMs) {
      redraw();
      last_redraw = UnixMs();
    }
    if (done || g_stop) break;
  }
  {
    std::vector<pb::Event> events;
    {
      std::lock_guard<std::mutex> lock(state_mu);
      watcher.Finish(&events);
    }
    handle(events);
  }
  if (human) {
    std::string text = SummaryTable(watcher.state(), o.detectors, name, kSummaryEvents);
    if (clock == Clock::kWall) text = "\033[H\033[2J" + text;
    (void)io::WriteAll(STDOUT_FILENO, text, "<stdout>");
  }
  if (!o.plot.empty()) {
    const std::string title = "ob-watch: " + (attached ? o.attach_dir : io::DisplayName(o.input));
    OB_RETURN_IF_ERROR(io::WriteFile(o.plot, timeline.Svg(title)));
  }
  server.reset();
  if (!stream_status.ok()) return stream_status;
  if (!out_status.ok()) return out_status;
  if (!anomalies.empty()) {
    uint64_t total = 0;
    std::string what;
    for (const auto& [k, n] : anomalies) {
      total += n;
      what += (what.empty() ? "" : ", ") + std::to_string(n) + " " + KindName(k);
    }
    return Status(Code::kNo, std::to_string(total) + (total == 1 ? " anomaly" : " anomalies") +
                                 " in " + name + ": " + what);
  }
  return Status::Ok();
}

}  // namespace ob::watch
