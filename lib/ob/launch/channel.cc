#include "ob/launch/channel.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sodium.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "ob/log.h"

namespace ob::launch {
namespace {

// The two directions prove themselves over different labels, so a proof
// cannot be reflected back to its sender.
constexpr char kAgentLabel[] = "ob-launch agent";
constexpr char kMasterLabel[] = "ob-launch master";

void EnsureSodium() {
  static std::once_flag once;
  std::call_once(once, [] {
    int rc = sodium_init();
    assert(rc >= 0 && "libsodium cannot initialise");
    (void)rc;
  });
}

std::string UvError(int rc) { return uv_strerror(rc); }

void FreeHandle(uv_handle_t* h) { std::free(h); }

template <typename T>
T* NewHandle() {
  return static_cast<T*>(std::calloc(1, sizeof(T)));
}

void CloseHandle(uv_handle_t* h) {
  if (h != nullptr && !uv_is_closing(h)) uv_close(h, FreeHandle);
}

// The IP of this end of `tcp` ("" if unknown).
std::string LocalIp(uv_tcp_t* tcp) {
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

std::string PeerName(uv_tcp_t* tcp) {
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
bool ParseIp(const std::string& ip, int port, sockaddr_storage* out) {
  std::memset(out, 0, sizeof *out);
  if (uv_ip4_addr(ip.c_str(), port, reinterpret_cast<sockaddr_in*>(out)) == 0) return true;
  return uv_ip6_addr(ip.c_str(), port, reinterpret_cast<sockaddr_in6*>(out)) == 0;
}

}  // namespace

// --- framing ----------------------------------------------------------------

void AppendFrame(const pb::Control& msg, std::string* out) {
  std::string body = msg.SerializeAsString();
  uint32_t n = static_cast<uint32_t>(body.size());
  char head[4] = {static_cast<char>(n >> 24), static_cast<char>(n >> 16),
                  static_cast<char>(n >> 8), static_cast<char>(n)};
  out->append(head, 4);
  out->append(body);
}

Status FrameDecoder::Feed(const char* data, size_t size, std::vector<pb::Control>* out) {
  if (failed_) return Status::DataErr("malformed frame: stream already failed");
  buf_.append(data, size);
  while (buf_.size() - pos_ >= 4) {
    const auto* p = reinterpret_cast<const unsigned char*>(buf_.data() + pos_);
    uint32_t n = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
    if (n > max_) {
      failed_ = true;
      return Status::DataErr("frame of " + std::to_string(n) + " bytes exceeds the " +
                             (max_ % (1u << 20) == 0 ? std::to_string(max_ >> 20) + " MiB"
                                                 : std::to_string(max_) + "-byte") +
                             " limit");
    }
    if (buf_.size() - pos_ - 4 < n) break;
    pb::Control msg;
    if (!msg.ParseFromArray(buf_.data() + pos_ + 4, static_cast<int>(n))) {
      failed_ = true;
      return Status::DataErr("malformed frame: " + std::to_string(n) +
                             " bytes that are not a Control message");
    }
    if (msg.kind_case() == pb::Control::KIND_NOT_SET) {
      failed_ = true;
      return Status::DataErr("malformed frame: a Control message with no known kind");
    }
    pos_ += 4 + n;
    out->push_back(std::move(msg));
  }
  if (pos_ > (1u << 16) && pos_ * 2 > buf_.size()) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  return Status::Ok();
}

// --- authentication ---------------------------------------------------------

std::string AuthProof(const std::string& secret, const std::string& label,
                      const std::string& nonce, const std::string& host) {
  EnsureSodium();
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, reinterpret_cast<const unsigned char*>(secret.data()),
                              secret.size());
  for (const std::string* part : {&label, &nonce, &host}) {
    // Length-prefix each part so ("ab","c") and ("a","bc") differ.
    unsigned char len[4] = {static_cast<unsigned char>(part->size() >> 24),
                            static_cast<unsigned char>(part->size() >> 16),
                            static_cast<unsigned char>(part->size() >> 8),
                            static_cast<unsigned char>(part->size())};
    crypto_auth_hmacsha256_update(&st, len, 4);
    crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(part->data()),
                                  part->size());
  }
  unsigned char mac[crypto_auth_hmacsha256_BYTES];
  crypto_auth_hmacsha256_final(&st, mac);
  return std::string(reinterpret_cast<char*>(mac), sizeof mac);
}

bool CheckProof(const std::string& secret, const std::string& label, const std::string& nonce,
                const std::string& host, const std::string& proof) {
  std::string want = AuthProof(secret, label, nonce, host);
  return proof.size() == want.size() && sodium_memcmp(proof.data(), want.data(), want.size()) == 0;
}

std::string RandomNonce() {
  EnsureSodium();
  std::string nonce(kNonceBytes, '\0');
  randombytes_buf(nonce.data(), nonce.size());
  return nonce;
}

// --- Connection -----------------------------------------------------------

std::shared_ptr<Connection> Connection::Adopt(uv_loop_t* loop, uv_tcp_t* tcp) {
  std::shared_ptr<Connection> c(new Connection());
  c->loop_ = loop;
  c->tcp_ = tcp;
  c->peer_ = PeerName(tcp);
  c->local_ip_ = LocalIp(tcp);
  c->last_rx_ms_ = static_cast<int64_t>(uv_now(loop));
  c->open_ = true;
  tcp->data = c.get();
  uv_tcp_nodelay(tcp, 1);
  int rc = uv_read_start(
      reinterpret_cast<uv_stream_t*>(tcp),
      [](uv_handle_t*, size_t suggested, uv_buf_t* buf) {
        buf->base = static_cast<char*>(std::malloc(suggested));
        buf->len = buf->base != nullptr ? suggested : 0;
      },
      &Connection::OnRead);
  if (rc != 0) c->Fail("cannot read: " + UvError(rc));
  return c;
}

Connection::~Connection() {
  if (tcp_ != nullptr) {
    tcp_->data = nullptr;
    uv_read_stop(reinterpret_cast<uv_stream_t*>(tcp_));
    CloseHandle(reinterpret_cast<uv_handle_t*>(tcp_));
  }
}

int64_t Connection::peer_ack_age_ms() const {
  uv_os_fd_t fd;
  if (!open_ || tcp_ == nullptr || uv_fileno(reinterpret_cast<const uv_handle_t*>(tcp_), &fd) != 0) return -1;
  struct tcp_info info {};
  socklen_t len = sizeof info;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return -1;
  return static_cast<int64_t>(info.tcpi_last_ack_recv);
}

void Connection::SetHandlers(MessageFn on_message, CloseFn on_close) {
  on_message_ = std::move(on_message);
  on_close_ = std::move(on_close);
}

void Connection::OnRead(uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
  auto* self_raw = static_cast<Connection*>(s->data);
  if (self_raw == nullptr || !self_raw->open_) {
    std::free(buf->base);
    return;
  }
  // Callbacks may drop the owner's reference; keep ourselves alive until done.
  std::shared_ptr<Connection> self = self_raw->shared_from_this();
  if (n > 0) {
    std::vector<pb::Control> msgs;
    Status st = self->decoder_.Feed(buf->base, static_cast<size_t>(n), &msgs);
    std::free(buf->base);
    if (!msgs.empty()) self->last_rx_ms_ = static_cast<int64_t>(uv_now(self->loop_));
    for (auto& m : msgs) {
      if (!self->open_) return;
      // A copy: the handler may replace itself (e.g. when a handshake ends).
      MessageFn fn = self->on_message_;
      if (fn) fn(*self, m);
    }
    if (!st.ok() && self->open_) {
      OB_LOG(Warn) << "control channel from " << self->peer_ << ": " << st.message()
                   << "; closing the connection";
      self->Fail(st.message());
    }
    return;
  }
  std::free(buf->base);
  if (n < 0) self->Fail(n == UV_EOF ? "closed by peer" : UvError(static_cast<int>(n)));
}

void Connection::Send(const pb::Control& msg) {
  if (!open_) return;
  struct WriteReq {
    uv_write_t req;
    std::string data;
  };
  auto* w = new WriteReq;
  AppendFrame(msg, &w->data);
  uv_buf_t b = uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
  int rc = uv_write(&w->req, reinterpret_cast<uv_stream_t*>(tcp_), &b, 1,
                    [](uv_write_t* r, int) { delete reinterpret_cast<WriteReq*>(r); });
  if (rc != 0) {
    delete w;
    Fail("cannot send: " + UvError(rc));
  }
}

void Connection::Fail(const std::string& reason) { Close(reason); }

void Connection::Close(const std::string& reason) {
  if (!open_) return;
  open_ = false;
  uv_tcp_t* tcp = tcp_;
  tcp_ = nullptr;
  tcp->data = nullptr;
  uv_read_stop(reinterpret_cast<uv_stream_t*>(tcp));
  // Flush what is queued (a Reject, a Stop), then close.
  auto* req = new uv_shutdown_t;
  if (uv_shutdown(req, reinterpret_cast<uv_stream_t*>(tcp), [](uv_shutdown_t* r, int) {
        CloseHandle(reinterpret_cast<uv_handle_t*>(r->handle));
        delete r;
      }) != 0) {
    delete req;
    CloseHandle(reinterpret_cast<uv_handle_t*>(tcp));
  }
  CloseFn cb = std::move(on_close_);
  on_message_ = nullptr;
  if (cb) cb(*this, reason);
}

// --- Server -------------------------------------------------------------------

struct Server::Pending {
  std::shared_ptr<Connection> conn;
  uv_timer_t* timer = nullptr;
  bool have_hello = false;
  pb::Hello hello;
  std::string nonce;
  ~Pending() { CloseHandle(reinterpret_cast<uv_handle_t*>(timer)); }
};

Server::~Server() { Close(); }

void Server::Close() {
  CloseHandle(reinterpret_cast<uv_handle_t*>(listener_));
  listener_ = nullptr;
  auto pending = std::move(pending_);
  pending_.clear();
  for (const auto& p : pending) p->conn->Close("master shutting down");
}

Status Server::Listen(const Options& options, AdmitFn admit, ReadyFn ready) {
  assert(!options.secret.empty());
  options_ = options;
  admit_ = std::move(admit);
  ready_ = std::move(ready);
  sockaddr_storage addr;
  if (!ParseIp(options.bind, options.port, &addr)) {
    return Status::Usage("--bind: '" + options.bind + "' is not an IP address");
  }
  listener_ = NewHandle<uv_tcp_t>();
  uv_tcp_init(loop_, listener_);
  listener_->data = this;
  std::string where = options.bind + ":" + std::to_string(options.port);
  int rc = uv_tcp_bind(listener_, reinterpret_cast<sockaddr*>(&addr), 0);
  if (rc == 0) rc = uv_listen(reinterpret_cast<uv_stream_t*>(listener_), 128, &Server::OnConnection);
  if (rc != 0) {
    Close();
    if (rc == UV_EADDRNOTAVAIL) {  // permanent: not an address of this machine
      return Status::Config("--bind " + options.bind + ": not an address of this machine (" + UvError(rc) + ")");
    }
    return Status::Unavailable("cannot listen on " + where + ": " + UvError(rc));
  }
  sockaddr_storage bound{};
  int len = sizeof bound;
  uv_tcp_getsockname(listener_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return Status::Ok();
}

void Server::OnConnection(uv_stream_t* s, int status) {
  auto* self = static_cast<Server*>(s->data);
  if (status < 0) {
    OB_LOG(Warn) << "control channel: accept failed: " << UvError(status);
    return;
  }
  auto* tcp = NewHandle<uv_tcp_t>();
  uv_tcp_init(self->loop_, tcp);
  if (uv_accept(s, reinterpret_cast<uv_stream_t*>(tcp)) != 0) {
    CloseHandle(reinterpret_cast<uv_handle_t*>(tcp));
    return;
  }
  if (self->pending_.size() >= kMaxPendingHandshakes) {  // a flood: not one more
    ++self->rejected_;
    OB_LOG(Debug) << "control channel: " << kMaxPendingHandshakes
                  << " connections already in the handshake; closing a new one";
    CloseHandle(reinterpret_cast<uv_handle_t*>(tcp));
    return;
  }
  std::shared_ptr<Connection> conn = Connection::Adopt(self->loop_, tcp);
  conn->SetMaxFrameBytes(kMaxHandshakeFrameBytes);  // until the peer proved the secret
  self->Handshake(std::move(conn));
}

void Server::Refuse(const std::shared_ptr<Connection>& conn, const std::string& reason) {
  ++rejected_;
  // The reason may quote the peer (its host name, its reject reason).
  const std::string why = log::Printable(reason, 256);
  OB_LOG(Warn) << "rejected agent connection from " << conn->peer() << ": " << why;
  pb::Control m;
  m.mutable_reject()->set_reason(why);
  conn->Send(m);
  conn->Close("rejected: " + why);
}

void Server::Handshake(std::shared_ptr<Connection> conn) {
  auto p = std::make_shared<Pending>();
  p->conn = conn;
  pending_.insert(p);
  std::weak_ptr<Pending> weak = p;
  p->timer = NewHandle<uv_timer_t>();
  uv_timer_init(loop_, p->timer);
  p->timer->data = this;
  uv_timer_start(p->timer, [](uv_timer_t* t) {
    auto* server = static_cast<Server*>(t->data);
    for (const auto& q : server->pending_) {
      if (q->timer == t) {
        auto keep = q;
        server->Refuse(keep->conn, "no handshake within " +
                                       std::to_string(kHandshakeTimeoutMs / 1000) + " s");
        return;
      }
    }
  }, kHandshakeTimeoutMs, 0);

  conn->SetHandlers(
      [this, weak](Connection& c, pb::Control& m) {
        auto p = weak.lock();
        if (!p) return;
        if (!p->have_hello) {
          if (!m.has_hello()) return Refuse(p->conn, "expected Hello first");
          p->hello = m.hello();
          p->have_hello = true;
          if (p->hello.protocol_version() != kProtocolVersion) {
            return Refuse(p->conn, "protocol version " +
                                       std::to_string(p->hello.protocol_version()) +
                                       ", this master speaks " + std::to_string(kProtocolVersion));
          }
          if (p->hello.nonce().size() != kNonceBytes) return Refuse(p->conn, "bad nonce in Hello");
          p->nonce = RandomNonce();
          pb::Control ch;
          ch.mutable_challenge()->set_nonce(p->nonce);
          ch.mutable_challenge()->set_master_proof(
              AuthProof(options_.secret, kMasterLabel, p->hello.nonce(), p->hello.host()));
          c.Send(ch);
          return;
        }
        if (m.has_reject()) {
          // The agent could not verify our proof: the secrets differ.
          return Refuse(p->conn, "authentication failed for host '" + p->hello.host() +
                                     "' (wrong secret: " + m.reject().reason() + ")");
        }
        if (!m.has_proof()) return Refuse(p->conn, "expected Proof");
        if (!CheckProof(options_.secret, kAgentLabel, p->nonce, p->hello.host(),
                        m.proof().hmac())) {
          return Refuse(p->conn, "authentication failed for host '" + p->hello.host() +
                                     "' (wrong secret)");
        }
        std::string why = admit_ ? admit_(p->hello) : "";
        if (!why.empty()) return Refuse(p->conn, why);
        auto keep = p;
        pending_.erase(p);
        pb::Control ok;
        ok.mutable_accept();
        c.Send(ok);
        c.SetMaxFrameBytes(kMaxFrameBytes);
        c.SetHandlers(nullptr, nullptr);
        ready_(keep->conn, keep->hello);
      },
      [this, weak](Connection& c, const std::string& reason) {
        auto p = weak.lock();
        if (!p) return;
        if (reason.rfind("rejected:", 0) != 0) {
          OB_LOG(Info) << "connection from " << c.peer() << " ended during the handshake: "
                       << reason;
        }
        pending_.erase(p);
      });
}

// --- Connect --------------------------------------------------------------------

namespace {

struct ConnectAttempt : std::enable_shared_from_this<ConnectAttempt> {
  uv_loop_t* loop = nullptr;
  std::string where, secret;
  pb::Hello hello;
  std::function<void(Result<std::shared_ptr<Connection>>)> done;
  std::shared_ptr<ConnectAttempt> self;   // alive until Finish
  uv_tcp_t* tcp = nullptr;                // until connected; then the Connection owns it
  uv_timer_t* timer = nullptr;
  std::shared_ptr<Connection> conn;
  Status pending_error;                    // reported by the timer when set early
  bool finished = false;

  void Finish(Result<std::shared_ptr<Connection>> r) {
    if (finished) return;
    finished = true;
    auto keep = std::move(self);
    CloseHandle(reinterpret_cast<uv_handle_t*>(timer));
    timer = nullptr;
    if (tcp != nullptr) {
      tcp->data = nullptr;
      CloseHandle(reinterpret_cast<uv_handle_t*>(tcp));
      tcp = nullptr;
    }
    if (conn) {
      conn->SetHandlers(nullptr, nullptr);
      if (!r.ok()) conn->Close(r.status().message());
      conn.reset();
    }
    auto cb = std::move(done);
    cb(std::move(r));
  }

  void OnMessage(pb::Control& m) {
    if (m.has_reject()) {
      return Finish(Status::Config("the master at " + where + " rejected this agent: " +
                                   log::Printable(m.reject().reason(), 256)));
    }
    if (m.has_challenge()) {
      if (!CheckProof(secret, kMasterLabel, hello.nonce(), hello.host(),
                      m.challenge().master_proof())) {
        // Say so before leaving, so the master logs the rejection too.
        pb::Control no;
        no.mutable_reject()->set_reason("the master's proof does not match this agent's secret");
        conn->Send(no);
        return Finish(Status::Config("the master at " + where +
                                     " failed to prove the shared secret (wrong secret?)"));
      }
      pb::Control p;
      p.mutable_proof()->set_hmac(AuthProof(secret, kAgentLabel, m.challenge().nonce(),
                                            hello.host()));
      conn->Send(p);
      return;
    }
    if (m.has_accept()) {
      auto c = conn;
      return Finish(c);
    }
    Finish(Status::Unavailable("unexpected message during the handshake with " + where));
  }
};

}  // namespace

void Connect(uv_loop_t* loop, const std::string& host, int port, int timeout_ms,
             const std::string& secret, pb::Hello hello,
             std::function<void(Result<std::shared_ptr<Connection>>)> done) {
  auto a = std::make_shared<ConnectAttempt>();
  a->self = a;
  a->loop = loop;
  a->where = host + ":" + std::to_string(port);
  a->secret = secret;
  hello.set_protocol_version(kProtocolVersion);
  hello.set_nonce(RandomNonce());
  a->hello = std::move(hello);
  a->done = std::move(done);
  a->timer = NewHandle<uv_timer_t>();
  uv_timer_init(loop, a->timer);
  a->timer->data = a.get();

  sockaddr_storage addr;
  if (!ParseIp(host, port, &addr)) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) {
      a->pending_error = Status::Unavailable("cannot resolve '" + host + "'");
    } else {
      std::memcpy(&addr, res->ai_addr, res->ai_addrlen);
      if (addr.ss_family == AF_INET6) {
        reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(static_cast<uint16_t>(port));
      } else {
        reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(static_cast<uint16_t>(port));
      }
      freeaddrinfo(res);
    }
  }
  // Errors found now are reported from the loop, as promised.
  uv_timer_start(a->timer, [](uv_timer_t* t) {
    auto* at = static_cast<ConnectAttempt*>(t->data);
    if (!at->pending_error.ok()) return at->Finish(at->pending_error);
    at->Finish(Status::Unavailable("no connection to " + at->where + " within the timeout"));
  }, a->pending_error.ok() ? static_cast<uint64_t>(timeout_ms) : 0, 0);
  if (!a->pending_error.ok()) return;

  a->tcp = NewHandle<uv_tcp_t>();
  uv_tcp_init(loop, a->tcp);
  auto* req = new uv_connect_t;
  req->data = new std::weak_ptr<ConnectAttempt>(a);
  int rc = uv_tcp_connect(req, a->tcp, reinterpret_cast<sockaddr*>(&addr),
                          [](uv_connect_t* r, int status) {
    auto* weak = static_cast<std::weak_ptr<ConnectAttempt>*>(r->data);
    auto at = weak->lock();
    delete weak;
    delete r;
    if (!at || at->finished) return;
    if (status < 0) {
      return at->Finish(Status::Unavailable("cannot connect to " + at->where + ": " +
                                            UvError(status)));
    }
    at->conn = Connection::Adopt(at->loop, at->tcp);
    at->tcp = nullptr;
    ConnectAttempt* raw = at.get();
    at->conn->SetHandlers(
        [raw](Connection&, pb::Control& m) { raw->OnMessage(m); },
        [raw](Connection&, const std::string& reason) {
          raw->Finish(Status::Unavailable("connection to " + raw->where +
                                          " ended during the handshake: " + reason));
        });
    pb::Control h;
    *h.mutable_hello() = at->hello;
    at->conn->Send(h);
  });
  if (rc != 0) {
    delete static_cast<std::weak_ptr<ConnectAttempt>*>(req->data);
    delete req;
    a->pending_error = Status::Unavailable("cannot connect to " + a->where + ": " + UvError(rc));
    uv_timer_start(a->timer, [](uv_timer_t* t) {
      auto* at = static_cast<ConnectAttempt*>(t->data);
      at->Finish(at->pending_error);
    }, 0, 0);
  }
}

// --- addresses -------------------------------------------------------------------

Status SplitHostPort(const std::string& text, const std::string& flag, std::string* host,
                     int* port) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    return Status::Usage(flag + ": '" + text + "' is not HOST:PORT");
  }
  std::string h = text.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  else if (h.find(':') != std::string::npos) {
    return Status::Usage(flag + ": write an IPv6 address as [ADDR]:PORT");
  }
  const std::string digits = text.substr(colon + 1);
  char* end = nullptr;
  long p = std::strtol(digits.c_str(), &end, 10);
  if (*end != '\0' || p < 0 || p > 65535 || digits.empty()) {
    return Status::Usage(flag + ": bad port '" + digits + "'");
  }
  *host = h;
  *port = static_cast<int>(p);
  return Status::Ok();
}

}  // namespace ob::launch
