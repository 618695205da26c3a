// What channel.cc (framing, authentication, a connection) and
// channel_server.cc (the master's server, an agent's connect) share: libuv
// handles, addresses, and the labels of the two directions' proofs.
#pragma once

#include <netinet/in.h>
#include <sodium.h>
#include <uv.h>

#include <cassert>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace ob::launch::channel_internal {

// The two directions prove themselves over different labels, so a proof
// cannot be reflected back to its sender.
inline constexpr char kAgentLabel[] = "ob-launch agent";
inline constexpr char kMasterLabel[] = "ob-launch master";

inline void EnsureSodium() {
  static std::once_flag once;
  std::call_once(once, [] {
    int rc = sodium_init();
    assert(rc >= 0 && "libsodium cannot initialise");
    (void)rc;
  });
}

inline std::string UvError(int rc) { return uv_strerror(rc); }

inline void FreeHandle(uv_handle_t* h) { std::free(h); }

template <typename T>
T* NewHandle() {
  return static_cast<T*>(std::calloc(1, sizeof(T)));
}

inline void CloseHandle(uv_handle_t* h) {
  if (h != nullptr && !uv_is_closing(h)) uv_close(h, FreeHandle);
}

// The IP of this end of `tcp` ("" if unknown).
inline std::string LocalIp(uv_tcp_t* tcp) {
  sockaddr_storage ss{};
  int len = sizeof ss;
  if (uv_tcp_getsockname(tcp, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  char ip[64] = {0};
  if (ss.ss_family == AF_INET6) {
    uv_ip6_name(reinterpret_cast<sockaddr_in6*>(&ss), ip, sizeof ip);
  } else {
    uv_ip4_name(reinterpret_cast<sockaddr_in*>(&ss), ip, sizeof ip);
  }
  return ip;
}

inline std::string PeerName(uv_tcp_t* tcp) {
  sockaddr_storage ss{};
  int len = sizeof ss;
  if (uv_tcp_getpeername(tcp, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char ip[64] = {0};
  int port = 0;
  if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    uv_ip6_name(a, ip, sizeof ip);
    port = ntohs(a->sin6_port);
    return "[" + std::string(ip) + "]:" + std::to_string(port);
  }
  auto* a = reinterpret_cast<sockaddr_in*>(&ss);
  uv_ip4_name(a, ip, sizeof ip);
  port = ntohs(a->sin_port);
  return std::string(ip) + ":" + std::to_string(port);
}

// An IPv4 or IPv6 literal; false otherwise.
inline bool ParseIp(const std::string& ip, int port, sockaddr_storage* out) {
  std::memset(out, 0, sizeof *out);
  if (uv_ip4_addr(ip.c_str(), port, reinterpret_cast<sockaddr_in*>(out)) == 0) return true;
  return uv_ip6_addr(ip.c_str(), port, reinterpret_cast<sockaddr_in6*>(out)) == 0;
}


}  // namespace ob::launch::channel_internal
