// The two ends of the control channel's start: the master's server, which
// admits agents that prove the secret (and proves it back), and an agent's
// Connect, which retries until the master answers or its time is up.
#include "ob/launch/wire/channel.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>

#include "ob/launch/wire/channel_internal.h"
#include "ob/log.h"

namespace ob::launch {

namespace ci = channel_internal;

// --- Server -------------------------------------------------------------------

struct Server::Pending {
  std::shared_ptr<Connection> conn;
  uv_timer_t* timer = nullptr;
  bool have_hello = false;
  pb::Hello hello;
  std::string nonce;
  ~Pending() { ci::CloseHandle(reinterpret_cast<uv_handle_t*>(timer)); }
};

Server::~Server() { Close(); }

void Server::Close() {
  ci::CloseHandle(reinterpret_cast<uv_handle_t*>(listener_));
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
  if (!ci::ParseIp(options.bind, options.port, &addr)) {
    return Status::Usage("--bind: '" + options.bind + "' is not an IP address");
  }
  listener_ = ci::NewHandle<uv_tcp_t>();
  uv_tcp_init(loop_, listener_);
  listener_->data = this;
  std::string where = options.bind + ":" + std::to_string(options.port);
  int rc = uv_tcp_bind(listener_, reinterpret_cast<sockaddr*>(&addr), 0);
  if (rc == 0) rc = uv_listen(reinterpret_cast<uv_stream_t*>(listener_), 128, &Server::OnConnection);
  if (rc != 0) {
    Close();
    if (rc == UV_EADDRNOTAVAIL) {  // permanent: not an address of this machine
      return Status::Config("--bind " + options.bind + ": not an address of this machine (" + ci::UvError(rc) + ")");
    }
    return Status::Unavailable("cannot listen on " + where + ": " + ci::UvError(rc));
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
    OB_LOG(Warn) << "control channel: accept failed: " << ci::UvError(status);
    return;
  }
  auto* tcp = ci::NewHandle<uv_tcp_t>();
  uv_tcp_init(self->loop_, tcp);
  if (uv_accept(s, reinterpret_cast<uv_stream_t*>(tcp)) != 0) {
    ci::CloseHandle(reinterpret_cast<uv_handle_t*>(tcp));
    return;
  }
  if (self->pending_.size() >= kMaxPendingHandshakes) {  // a flood: not one more
    ++self->rejected_;
    OB_LOG(Debug) << "control channel: " << kMaxPendingHandshakes
                  << " connections already in the handshake; closing a new one";
    ci::CloseHandle(reinterpret_cast<uv_handle_t*>(tcp));
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
  p->timer = ci::NewHandle<uv_timer_t>();
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
              AuthProof(options_.secret, ci::kMasterLabel, p->hello.nonce(), p->hello.host()));
          c.Send(ch);
          return;
        }
        if (m.has_reject()) {
          // The agent could not verify our proof: the secrets differ.
          return Refuse(p->conn, "authentication failed for host '" + p->hello.host() +
                                     "' (wrong secret: " + m.reject().reason() + ")");
        }
        if (!m.has_proof()) return Refuse(p->conn, "expected Proof");
        if (!CheckProof(options_.secret, ci::kAgentLabel, p->nonce, p->hello.host(),
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
    ci::CloseHandle(reinterpret_cast<uv_handle_t*>(timer));
    timer = nullptr;
    if (tcp != nullptr) {
      tcp->data = nullptr;
      ci::CloseHandle(reinterpret_cast<uv_handle_t*>(tcp));
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
      if (!CheckProof(secret, ci::kMasterLabel, hello.nonce(), hello.host(),
                      m.challenge().master_proof())) {
        // Say so before leaving, so the master logs the rejection too.
        pb::Control no;
        no.mutable_reject()->set_reason("the master's proof does not match this agent's secret");
        conn->Send(no);
        return Finish(Status::Config("the master at " + where +
                                     " failed to prove the shared secret (wrong secret?)"));
      }
      pb::Control p;
      p.mutable_proof()->set_hmac(AuthProof(secret, ci::kAgentLabel, m.challenge().nonce(),
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

bool NobodyListens(const Status& s) {
  // Connect's words for it: "cannot connect to ADDR:PORT: " + uv's.
  const std::string& m = s.message();
  const std::string refused = ": " + ci::UvError(UV_ECONNREFUSED);
  return s.code() == Code::kUnavailable && m.rfind("cannot connect to ", 0) == 0 && m.size() > refused.size() &&
         m.compare(m.size() - refused.size(), refused.size(), refused) == 0;
}

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
  a->timer = ci::NewHandle<uv_timer_t>();
  uv_timer_init(loop, a->timer);
  a->timer->data = a.get();

  sockaddr_storage addr;
  if (!ci::ParseIp(host, port, &addr)) {
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

  a->tcp = ci::NewHandle<uv_tcp_t>();
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
                                            ci::UvError(status)));
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
    a->pending_error = Status::Unavailable("cannot connect to " + a->where + ": " + ci::UvError(rc));
    uv_timer_start(a->timer, [](uv_timer_t* t) {
      auto* at = static_cast<ConnectAttempt*>(t->data);
      at->Finish(at->pending_error);
    }, 0, 0);
  }
}

}  // namespace ob::launch
