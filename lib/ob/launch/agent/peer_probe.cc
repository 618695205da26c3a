#include "ob/launch/agent/peer_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>

#include "ob/clock.h"


namespace ob::launch {
namespace {

// `address`:`port` as a socket address; false when it is not an IP address.
bool ToSockaddr(const std::string& address, int port, sockaddr_storage* addr, socklen_t* len) {
  *addr = {};
  auto* v4 = reinterpret_cast<sockaddr_in*>(addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(addr);
  if (inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    *len = sizeof *v4;
    return true;
  }
  if (inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    *len = sizeof *v6;
    return true;
  }
  return false;
}

}  // namespace

size_t ProbeWindow() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return kProbeInFlight;
  return std::clamp<size_t>(static_cast<size_t>(r.rlim_cur / 4), 1, kProbeInFlight);
}

std::vector<bool> ProbeOnce(const std::vector<Peer>& peers, int port, int timeout_ms) {
  std::vector<bool> reached(peers.size(), false);
  // The attempts in flight: their sockets, which peer each is for, and
  // when each gives up. Each peer has `timeout_ms` of its own from its
  // connect, however long it waited for a slot.
  std::vector<pollfd> fds;
  std::vector<size_t> which;
  std::vector<int64_t> due;
  const size_t window = ProbeWindow();
  size_t next = 0;
  while (next < peers.size() || !fds.empty()) {
    while (next < peers.size() && fds.size() < window) {
      sockaddr_storage addr;
      socklen_t len = 0;
      if (!ToSockaddr(peers[next].address, port, &addr, &len)) {
        reached[next++] = true;  // not an address we can judge: never accuse it
        continue;
      }
      const int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        // Out of descriptors while attempts are in flight: wait for one to
        // end. Otherwise it is our own trouble, not the peer's.
        if ((errno == EMFILE || errno == ENFILE) && !fds.empty()) break;
        reached[next++] = true;
        continue;
      }
      const size_t i = next++;
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 || errno == ECONNREFUSED) {
        reached[i] = true;
        ::close(fd);
      } else if (errno == EINPROGRESS) {
        fds.push_back({fd, POLLOUT, 0});
        which.push_back(i);
        due.push_back(SteadyMs() + timeout_ms);
      } else {
        ::close(fd);  // no route: blackholed, unreachable, the network down
      }
    }
    if (fds.empty()) continue;
    const int64_t wait = *std::min_element(due.begin(), due.end()) - SteadyMs();
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(wait, 0)));
    if (n < 0 && errno != EINTR) {
      for (size_t k = 0; k < fds.size(); ++k) reached[which[k]] = true;  // cannot judge: never accuse
      for (auto& p : fds) ::close(p.fd);
      fds.clear();
      which.clear();
      due.clear();
      continue;
    }
    const int64_t now = SteadyMs();
    size_t kept = 0;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (n > 0 && fds[k].revents != 0) {
        int err = 0;
        socklen_t el = sizeof err;
        ::getsockopt(fds[k].fd, SOL_SOCKET, SO_ERROR, &err, &el);
        reached[which[k]] = err == 0 || err == ECONNREFUSED;
        ::close(fds[k].fd);
      } else if (now >= due[k]) {
        ::close(fds[k].fd);  // silence: not reached
      } else {
        fds[kept] = {fds[k].fd, POLLOUT, 0};
        which[kept] = which[k];
        due[kept] = due[k];
        ++kept;
      }
    }
    fds.resize(kept);
    which.resize(kept);
    due.resize(kept);
  }
  return reached;
}

Result<int> ParseProbePort(const std::string& text) {
  if (text == "off") return 0;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < 1 || v > 65535 || !std::isdigit(static_cast<unsigned char>(text[0]))) {
    return Status::Usage("'" + text + "' is not a port (1-65535) or 'off'");
  }
  return static_cast<int>(v);
}

PeerProbe::PeerProbe(int port) : port_(port), thread_([this] { Loop(); }) {}

PeerProbe::~PeerProbe() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void PeerProbe::SetPeers(std::vector<Peer> peers) {
  std::lock_guard<std::mutex> lock(mu_);
  peers_ = std::move(peers);
  misses_.clear();
}

std::vector<std::string> PeerProbe::Unreachable() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [host, n] : misses_) {
    if (n >= kConfirmRounds) out.push_back(host);
  }
  return out;
}

void PeerProbe::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::milliseconds(kProbeMs), [this] { return stop_; })) {
    const std::vector<Peer> peers = peers_;
    lock.unlock();
    const std::vector<bool> reached = ProbeOnce(peers, port_, kProbeTimeoutMs);
    lock.lock();
    if (peers.size() != peers_.size()) continue;  // SetPeers meanwhile: this round is stale
    for (size_t i = 0; i < peers.size(); ++i) {
      if (peers[i].host != peers_[i].host) break;
      int& n = misses_[peers[i].host];
      n = reached[i] ? 0 : n + 1;
    }
  }
}

}  // namespace ob::launch
