#include "ob/launch/peer_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "ob/clock.h"


namespace ob::launch {
std::vector<bool> ProbeOnce(const std::vector<Peer>& peers, int port, int timeout_ms) {
  std::vector<bool> reached(peers.size(), false);
  std::vector<pollfd> fds;
  std::vector<size_t> which;
  for (size_t i = 0; i < peers.size(); ++i) {
    sockaddr_storage addr{};
    socklen_t len = 0;
    auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
    if (inet_pton(AF_INET, peers[i].address.c_str(), &v4->sin_addr) == 1) {
      v4->sin_family = AF_INET;
      v4->sin_port = htons(static_cast<uint16_t>(port));
      len = sizeof *v4;
    } else if (inet_pton(AF_INET6, peers[i].address.c_str(), &v6->sin6_addr) == 1) {
      v6->sin6_family = AF_INET6;
      v6->sin6_port = htons(static_cast<uint16_t>(port));
      len = sizeof *v6;
    } else {
      reached[i] = true;  // not an address we can judge: never accuse it
      continue;
    }
    const int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      reached[i] = true;  // our own trouble, not the peer's
      continue;
    }
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 || errno == ECONNREFUSED) {
      reached[i] = true;
      ::close(fd);
    } else if (errno == EINPROGRESS) {
      fds.push_back({fd, POLLOUT, 0});
      which.push_back(i);
    } else {
      ::close(fd);  // no route: blackholed, unreachable, the network down
    }
  }
  const int64_t deadline = SteadyMs() + timeout_ms;
  size_t open = fds.size();
  while (open > 0) {
    const int64_t left = deadline - SteadyMs();
    if (left <= 0) break;
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(left));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].fd < 0 || fds[k].revents == 0) continue;
      int err = 0;
      socklen_t el = sizeof err;
      ::getsockopt(fds[k].fd, SOL_SOCKET, SO_ERROR, &err, &el);
      reached[which[k]] = err == 0 || err == ECONNREFUSED;
      ::close(fds[k].fd);
      fds[k].fd = -1;  // poll ignores it from now on
      --open;
    }
  }
  for (auto& p : fds) {
    if (p.fd >= 0) ::close(p.fd);
  }
  return reached;
}

PeerProbe::PeerProbe() : thread_([this] { Loop(); }) {}

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
    const std::vector<bool> reached = ProbeOnce(peers, kProbePort, kProbeTimeoutMs);
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
