// The network-profile agent (ob-profile --net-agent): see network.h.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <mutex>
#include <thread>

#include "ob/profile/net_io.h"
#include "ob/profile/network.h"

namespace ob::profile {
namespace {

using namespace net_io;  // NOLINT: this file's own helpers

constexpr uint64_t kPingBytes = 64;              // "small message" for latency
constexpr uint64_t kChunk = 1 << 20;             // socket I/O buffer
constexpr uint64_t kWarmupMaxBytes = 1 << 20;    // warm-up transfer before each size
// A data connection's first bytes are the run's token (network.h): whoever
// else connects is closed before it gets a thread, a buffer or an answer,
// and skews no link. At most this many proven connections at once (a run
// opens one per peer at a time).
constexpr double kTokenSeconds = 2;
constexpr size_t kMaxConnections = 256;

// Reads exactly n bytes (into buf, or discarded when buf is null). False on
// end of stream, error or socket timeout.
bool ReadFull(int fd, char* buf, uint64_t n, std::vector<char>* scratch = nullptr) {
  while (n > 0) {
    char* dst = buf;
    size_t want = static_cast<size_t>(n);
    if (!buf) {
      dst = scratch->data();
      want = static_cast<size_t>(std::min<uint64_t>(n, scratch->size()));
    }
    ssize_t r = ::read(fd, dst, want);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    n -= static_cast<uint64_t>(r);
    if (buf) buf += r;
  }
  return true;
}

// Wire header of one data-connection request: op ('B' bulk, 'P' ping) + size.
struct Header {
  char op;
  uint64_t size;
};
constexpr size_t kHeaderBytes = 9;

void EncodeHeader(const Header& h, char out[kHeaderBytes]) {
  out[0] = h.op;
  for (int i = 0; i < 8; ++i) out[1 + i] = static_cast<char>((h.size >> (8 * i)) & 0xff);
}

Header DecodeHeader(const char in[kHeaderBytes]) {
  Header h{in[0], 0};
  for (int i = 0; i < 8; ++i) h.size |= static_cast<uint64_t>(static_cast<unsigned char>(in[1 + i])) << (8 * i);
  return h;
}

void SetSocketTimeouts(int fd, double seconds) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(seconds);
  tv.tv_usec = static_cast<suseconds_t>((seconds - std::floor(seconds)) * 1e6);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// Serves one data connection until the peer closes it.
void ServeConnection(int fd) {
  std::vector<char> scratch(kChunk);
  char hb[kHeaderBytes];
  while (ReadFull(fd, hb, kHeaderBytes)) {
    Header h = DecodeHeader(hb);
    if (h.op == 'B') {
      if (!ReadFull(fd, nullptr, h.size, &scratch)) return;
      char ack = 'A';
      if (::send(fd, &ack, 1, MSG_NOSIGNAL) != 1) return;
    } else if (h.op == 'P' && h.size <= kChunk) {
      if (!ReadFull(fd, scratch.data(), h.size)) return;
      if (::send(fd, scratch.data(), h.size, MSG_NOSIGNAL) != static_cast<ssize_t>(h.size)) return;
    } else {
      return;  // not our protocol
    }
  }
}

class Listener {
 public:
  ~Listener() { Stop(); }

  // Binds addr:port; returns "ADDR PORT" as bound, numerically. A data
  // connection must send `token` first.
  Result<std::string> Start(const std::string& addr, int port, const std::string& token) {
    if (fd_ >= 0) return Status::Config("already listening");
    if (token.empty()) return Status::Usage("listen: no token");
    token_ = token;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
    addrinfo* res = nullptr;
    std::string port_s = std::to_string(port);
    int rc = ::getaddrinfo(addr.c_str(), port_s.c_str(), &hints, &res);
    if (rc != 0) return Status::Unavailable("cannot resolve '" + addr + "': " + gai_strerror(rc));
    int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      ::freeaddrinfo(res);
      return Status::Unavailable(Errno("socket"));
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, 64) != 0) {
      std::string m = Errno("cannot listen on " + addr + " port " + port_s);
      ::freeaddrinfo(res);
      ::close(fd);
      return Status::Unavailable(m);
    }
    ::freeaddrinfo(res);
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    if (::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, serv, sizeof serv,
                      NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
      ::close(fd);
      return Status::Unavailable("cannot name the bound address");
    }
    fd_ = fd;
    acceptor_ = std::thread([this] { AcceptLoop(); });
    return std::string(host) + " " + serv;
  }

  void Stop() {
    if (fd_ < 0) return;
    stopping_ = true;
    ::shutdown(fd_, SHUT_RDWR);  // wakes accept()
    acceptor_.join();
    ::close(fd_);
    fd_ = -1;
    std::lock_guard<std::mutex> lock(mu_);
    for (int c : conns_) ::shutdown(c, SHUT_RDWR);  // wakes blocked reads
    for (auto& t : threads_) t.join();
    for (int c : conns_) ::close(c);
    conns_.clear();
    threads_.clear();
  }

 private:
  void AcceptLoop() {
    while (!stopping_) {
      int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) {
        if (stopping_) return;
        if (errno == EINTR || errno == ECONNABORTED) continue;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // EMFILE and friends
        continue;
      }
      // The token, within kTokenSeconds, or the connection is closed.
      SetSocketTimeouts(c, kTokenSeconds);
      std::string got(token_.size(), '\0');
      if (!ReadFull(c, got.data(), got.size()) || got != token_ || live_ >= kMaxConnections) {
        ::close(c);
        continue;
      }
      SetSocketTimeouts(c, 0);  // a proven peer waits as long as its requests take
      int one = 1;
      ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      std::lock_guard<std::mutex> lock(mu_);
      conns_.push_back(c);
      ++live_;
      threads_.emplace_back([this, c] {
        ServeConnection(c);
        --live_;
      });
    }
  }

  int fd_ = -1;
  std::string token_;
  std::atomic<size_t> live_{0};      // connections being served
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<int> conns_;           // GUARDED_BY(mu_); closed in Stop()
  std::vector<std::thread> threads_; // GUARDED_BY(mu_)
};

Result<int> Connect(const std::string& addr, const std::string& port, double timeout_s) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(addr.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) return Status::Unavailable("cannot resolve '" + addr + "': " + gai_strerror(rc));
  int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ::freeaddrinfo(res);
    return Status::Unavailable(Errno("socket"));
  }
  SetSocketTimeouts(fd, timeout_s);  // bounds connect() too on Linux
  rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
  ::freeaddrinfo(res);
  if (rc != 0) {
    std::string m = Errno("cannot connect to " + addr + " port " + port);
    ::close(fd);
    return Status::Unavailable(m);
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// One timed request on a data connection; seconds until the reply is complete.
Result<double> Request(int fd, char op, uint64_t size, std::vector<char>& buf) {
  char hb[kHeaderBytes];
  EncodeHeader({op, size}, hb);
  auto t0 = Clock::now();
  if (::send(fd, hb, kHeaderBytes, MSG_NOSIGNAL) != static_cast<ssize_t>(kHeaderBytes)) {
    return Status::Unavailable(Errno("send"));
  }
  for (uint64_t left = size; left > 0;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
    ssize_t w = ::send(fd, buf.data(), n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Status::Unavailable(Errno("send"));
    left -= static_cast<uint64_t>(w);
  }
  uint64_t reply = op == 'P' ? size : 1;
  errno = 0;
  if (!ReadFull(fd, nullptr, reply, &buf)) {
    return Status::Unavailable(errno ? Errno("no reply") : "connection closed by the receiver");
  }
  return Seconds(Clock::now() - t0);
}

// "measure ADDR PORT TOKEN PINGS REPEATS TIMEOUT_S SIZE..." -> "RTT T..."
Result<std::string> Measure(const std::vector<std::string>& w) {
  if (w.size() < 8) return Status::Usage("measure: expected ADDR PORT TOKEN PINGS REPEATS TIMEOUT SIZE...");
  int pings = std::atoi(w[4].c_str()), repeats = std::atoi(w[5].c_str());
  double timeout_s = std::atof(w[6].c_str());
  if (pings < 1 || repeats < 1 || !(timeout_s > 0)) return Status::Usage("measure: bad numbers");
  std::vector<uint64_t> sizes;
  for (size_t i = 7; i < w.size(); ++i) {
    uint64_t s = std::strtoull(w[i].c_str(), nullptr, 10);
    if (s == 0) return Status::Usage("measure: bad size '" + w[i] + "'");
    sizes.push_back(s);
  }
  OB_ASSIGN_OR_RETURN(int fd, Connect(w[1], w[2], timeout_s));
  if (::send(fd, w[3].data(), w[3].size(), MSG_NOSIGNAL) != static_cast<ssize_t>(w[3].size())) {
    ::close(fd);
    return Status::Unavailable(Errno("cannot send the token to " + w[1] + " port " + w[2]));
  }
  std::vector<char> buf(kChunk, 'x');
  std::ostringstream out;
  out.precision(9);
  Status st;
  {
    std::vector<double> rtt;
    for (int i = 0; i < pings + 2 && st.ok(); ++i) {  // two untimed
      Result<double> t = Request(fd, 'P', kPingBytes, buf);
      if (!t.ok()) st = t.status();
      else if (i >= 2) rtt.push_back(*t);
    }
    out << watch::Median(rtt);
  }
  for (uint64_t size : sizes) {
    if (!st.ok()) break;
    Result<double> warm = Request(fd, 'B', std::min(size, kWarmupMaxBytes), buf);
    if (!warm.ok()) st = warm.status();
    std::vector<double> times;
    for (int i = 0; i < repeats && st.ok(); ++i) {
      Result<double> t = Request(fd, 'B', size, buf);
      if (!t.ok()) st = t.status();
      else times.push_back(*t);
    }
    out << " " << watch::Median(times);
  }
  ::close(fd);
  if (!st.ok()) return st;
  return out.str();
}

}  // namespace

int RunNetAgent(int in_fd, int out_fd) {
  Listener listener;
  LineReader reader(in_fd);
  std::string line;
  // No deadline: the agent lives as long as its coordinator keeps stdin open.
  while (reader.Read(&line, Clock::time_point::max()) == LineReader::kLine) {
    std::vector<std::string> w = Words(line);
    Result<std::string> reply = Status::Usage("unknown command '" + line + "'");
    if (w.size() == 4 && w[0] == "listen") {
      reply = listener.Start(w[1], std::atoi(w[2].c_str()), w[3]);
    } else if (!w.empty() && w[0] == "measure") {
      reply = Measure(w);
    }
    std::string text = reply.ok() ? "ok " + *reply : "error " + reply.status().message();
    std::replace(text.begin(), text.end(), '\n', ' ');
    if (!WriteLine(out_fd, text)) break;
  }
  listener.Stop();
  return 0;
}

}  // namespace ob::profile
