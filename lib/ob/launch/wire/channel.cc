#include "ob/launch/wire/channel.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sodium.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "ob/launch/wire/channel_internal.h"
#include "ob/log.h"

namespace ob::launch {

namespace ci = channel_internal;

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
  ci::EnsureSodium();
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
  ci::EnsureSodium();
  std::string nonce(kNonceBytes, '\0');
  randombytes_buf(nonce.data(), nonce.size());
  return nonce;
}

// --- Connection -----------------------------------------------------------

std::shared_ptr<Connection> Connection::Adopt(uv_loop_t* loop, uv_tcp_t* tcp) {
  std::shared_ptr<Connection> c(new Connection());
  c->loop_ = loop;
  c->tcp_ = tcp;
  c->peer_ = ci::PeerName(tcp);
  c->local_ip_ = ci::LocalIp(tcp);
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
  if (rc != 0) c->Fail("cannot read: " + ci::UvError(rc));
  return c;
}

Connection::~Connection() {
  if (tcp_ != nullptr) {
    tcp_->data = nullptr;
    uv_read_stop(reinterpret_cast<uv_stream_t*>(tcp_));
    ci::CloseHandle(reinterpret_cast<uv_handle_t*>(tcp_));
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
  if (n < 0) self->Fail(n == UV_EOF ? "closed by peer" : ci::UvError(static_cast<int>(n)));
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
    Fail("cannot send: " + ci::UvError(rc));
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
        ci::CloseHandle(reinterpret_cast<uv_handle_t*>(r->handle));
        delete r;
      }) != 0) {
    delete req;
    ci::CloseHandle(reinterpret_cast<uv_handle_t*>(tcp));
  }
  CloseFn cb = std::move(on_close_);
  on_message_ = nullptr;
  if (cb) cb(*this, reason);
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
