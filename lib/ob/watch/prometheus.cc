#include "ob/watch/prometheus.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>

#include "ob/watch/events.h"

namespace ob::watch {
namespace {

std::string LabelValue(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '\\') o += "\\\\";
    else if (c == '"') o += "\\\"";
    else if (c == '\n') o += "\\n";
    else o.push_back(c);
  }
  return o;
}

std::string Value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return FormatDouble(v);
}

void Family(std::string* o, const char* name, const char* type, const char* help) {
  *o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

constexpr pb::EventKind kKinds[] = {
    pb::EVENT_CRASH,          pb::EVENT_HANG,          pb::EVENT_STRAGGLER,
    pb::EVENT_LOSS_NAN,       pb::EVENT_LOSS_SPIKE,    pb::EVENT_THROUGHPUT_DROP,
    pb::EVENT_MEMORY_GROWTH,  pb::EVENT_RECOVERY,      pb::EVENT_ACTION};

}  // namespace

std::string PrometheusText(const RunState& run) {
  std::string o;
  struct PerRank {
    const char* name;
    const char* type;
    const char* help;
    double (*get)(const RankState&, int64_t now_ms);
  };
  static const PerRank kPerRank[] = {
      {"ob_step_seconds", "gauge", "Seconds of the rank's last completed step.",
       [](const RankState& r, int64_t) { return r.step_seconds; }},
      {"ob_compute_seconds", "gauge", "Forward plus backward seconds of the last step.",
       [](const RankState& r, int64_t) { return r.compute_seconds; }},
      {"ob_communication_seconds", "gauge", "Communication (and waiting) seconds of the last step.",
       [](const RankState& r, int64_t) { return r.communication_seconds; }},
      {"ob_tokens_per_second", "gauge", "Tokens per second of the last step, as the rank reported.",
       [](const RankState& r, int64_t) { return r.tokens_per_second; }},
      {"ob_loss", "gauge", "Loss of the last step, as the rank reported.",
       [](const RankState& r, int64_t) { return r.loss; }},
      {"ob_last_step", "gauge", "The rank's last completed step.",
       [](const RankState& r, int64_t) { return static_cast<double>(r.last_step); }},
      {"ob_memory_bytes", "gauge", "Device memory in use after the last step (0: not measured).",
       [](const RankState& r, int64_t) { return static_cast<double>(r.memory_bytes); }},
      {"ob_seconds_since_heard", "gauge", "Seconds since the rank's last record, on the watcher's clock.",
       [](const RankState& r, int64_t now) { return (now - r.last_heard_ms) / 1000.0; }},
      {"ob_straggler_ratio", "gauge",
       "The rank's last compute time over its reference (1: as fast as its peers).",
       [](const RankState& r, int64_t) { return r.recent_ratio.size() ? r.recent_ratio.back() : 1.0; }},
  };
  for (const auto& f : kPerRank) {
    Family(&o, f.name, f.type, f.help);
    for (auto it = run.ranks.lower_bound({run.generation, 0});
         it != run.ranks.end() && it->first.generation == run.generation; ++it) {
      const RankState& r = it->second;
      if (!r.have_step) continue;
      o += std::string(f.name) + "{host=\"" + LabelValue(r.host) + "\",rank=\"" +
           std::to_string(r.rank) + "\",pipeline=\"" + std::to_string(r.pipeline) +
           "\",stage=\"" + std::to_string(r.stage) + "\"} " + Value(f.get(r, run.now_ms)) + "\n";
    }
  }
  size_t ranks = 0;
  for (auto it = run.ranks.lower_bound({run.generation, 0});
       it != run.ranks.end() && it->first.generation == run.generation; ++it)
    ++ranks;
  Family(&o, "ob_generation", "gauge", "The newest process-group generation seen.");
  o += "ob_generation " + std::to_string(run.generation) + "\n";
  Family(&o, "ob_ranks", "gauge", "Ranks of the newest generation heard from.");
  o += "ob_ranks " + std::to_string(ranks) + "\n";
  Family(&o, "ob_watch_records_total", "counter", "Metrics records read.");
  o += "ob_watch_records_total " + std::to_string(run.records) + "\n";
  Family(&o, "ob_watch_events_total", "counter", "Events raised, by kind.");
  for (pb::EventKind k : kKinds) {
    const auto it = run.event_counts.find(k);
    o += std::string("ob_watch_events_total{kind=\"") + KindName(k) + "\"} " +
         std::to_string(it == run.event_counts.end() ? 0 : it->second) + "\n";
  }
  return o;
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                            Render render) {
  std::string host, port;
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size())
    return Status::Usage("--metrics-addr '" + address + "': give HOST:PORT (e.g. 127.0.0.1:9100)");
  host = address.substr(0, colon);
  port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  // (getaddrinfo takes 99999 and binds 99999 mod 65536: 34463.)
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 || std::stoi(port) > 65535)
    return Status::Usage("--metrics-addr '" + address + "': '" + port + "' is not a port (0 to 65535)");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const int gai = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (gai != 0)
    return Status::Unavailable("--metrics-addr " + address + ": " + ::gai_strerror(gai));
  std::unique_ptr<MetricsServer> s(new MetricsServer);
  std::string last_error = "no address";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 16) == 0) {
      s->listen_fd_ = fd;
      break;
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (s->listen_fd_ < 0)
    return Status::Unavailable("--metrics-addr " + address + ": cannot listen: " + last_error);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  char text[INET6_ADDRSTRLEN] = "";
  if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
    s->address_ = "[" + std::string(text) + "]:" + std::to_string(ntohs(in6->sin6_port));
  } else {
    const auto* in4 = reinterpret_cast<sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &in4->sin_addr, text, sizeof text);
    s->address_ = std::string(text) + ":" + std::to_string(ntohs(in4->sin_port));
  }
  if (::pipe2(s->stop_pipe_, O_CLOEXEC) != 0) return Status::Internal("pipe: " + std::string(std::strerror(errno)));
  s->render_ = std::move(render);
  s->thread_ = std::thread([p = s.get()] { p->Serve(); });
  return s;
}

MetricsServer::~MetricsServer() {
  if (thread_.joinable()) {
    const char c = 'x';
    (void)!::write(stop_pipe_[1], &c, 1);
    thread_.join();
  }
  for (int fd : {listen_fd_, stop_pipe_[0], stop_pipe_[1]})
    if (fd >= 0) ::close(fd);
}

void MetricsServer::Serve() {
  for (;;) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents != 0) return;
    if ((p[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Answer(fd);
    ::close(fd);
  }
}

void MetricsServer::Answer(int fd) {
  // One deadline for the whole exchange, and the stop watched throughout:
  // the server answers one connection at a time, so a client that trickles
  // a byte a second (each within any per-read timeout) would otherwise hold
  // every scrape, and ob-watch's exit, for as long as it liked.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  // Waits until fd is ready for `events`: false at the deadline, on an
  // error, or when the server is being stopped.
  bool stopping = false;
  auto ready = [&](short events) {
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p[2] = {{fd, events, 0}, {stop_pipe_[0], POLLIN, 0}};
      const int r = ::poll(p, 2, static_cast<int>(left.count()));
      if (r < 0 && errno == EINTR) continue;
      stopping = r > 0 && p[1].revents != 0;
      return r > 0 && !stopping && p[0].revents != 0;
    }
  };
  std::string req;
  char buf[2048];
  while (req.find("\r\n\r\n") == std::string::npos && req.find("\n\n") == std::string::npos &&
         req.size() < 8192) {
    if (!ready(POLLIN)) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;
    req.append(buf, static_cast<size_t>(n));
  }
  if (stopping) return;
  const size_t sp1 = req.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? sp1 : req.find(' ', sp1 + 1);
  const std::string method = req.substr(0, sp1);
  std::string path = sp1 == std::string::npos ? "" : req.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  int code = 200;
  std::string body, type = "text/plain; version=0.0.4; charset=utf-8";
  if (method != "GET") {
    code = 405;
    body = "only GET\n";
    type = "text/plain; charset=utf-8";
  } else if (path != "/metrics") {
    code = 404;
    body = "not found: try /metrics\n";
    type = "text/plain; charset=utf-8";
  } else {
    body = render_();
  }
  const char* reason = code == 200 ? "OK" : code == 404 ? "Not Found" : "Method Not Allowed";
  std::string out = "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
                    "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n";
  if (code == 405) out += "Allow: GET\r\n";
  out += "\r\n" + body;
  size_t off = 0;
  while (off < out.size()) {
    if (!ready(POLLOUT)) return;
    const ssize_t n = ::send(fd, out.data() + off, out.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

}  // namespace ob::watch
