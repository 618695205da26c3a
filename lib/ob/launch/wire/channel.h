// The master↔agent control channel (design/launch.md): framed, authenticated Control
// messages over TCP on a libuv loop.
//
// Framing: each message is a 4-byte big-endian length and that many bytes of
// a serialised pb::Control (control.proto). A length over kMaxFrameBytes,
// bytes that do not parse, or a Control with no message set is a malformed
// frame: the connection is closed and the reason logged with the peer's
// address. Text a peer sends (its host name, a reject reason) reaches log
// lines only through log::Printable.
//
// Authentication: a mutual HMAC-SHA256 challenge-response on a shared secret
// (control.proto describes the exchange). Server hands a connection to its
// owner only after the peer proved the secret; Connect hands one back only
// after the server proved it. A wrong proof is rejected, logged with the
// peer's address, and the connection closed. Unauthenticated peers get
// kHandshakeTimeoutMs to finish, frames of at most kMaxHandshakeFrameBytes,
// and at most kMaxPendingHandshakes of them at once, so strangers cannot
// grow the master.
//
// Thread model: everything here runs on the one uv loop the caller passes;
// no method may be called from another thread, and every callback runs on
// the loop thread (docs/threads.md). Ownership: Connection is held by
// shared_ptr; callbacks may drop the last reference (the socket is then
// closed after the callback returns). Failures are values (Status) or close
// callbacks with a one-line reason; nothing throws.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <uv.h>

#include "ob/control.pb.h"
#include "ob/status.h"

namespace ob::launch {

inline constexpr uint32_t kProtocolVersion = 1;
// Largest frame accepted; a Control carries argv, env or one step's metrics.
inline constexpr uint32_t kMaxFrameBytes = 4u << 20;
inline constexpr int kHandshakeTimeoutMs = 5000;
// How often the master and each agent send a heartbeat on an idle
// connection (each side judges the other's silence against it).
inline constexpr int kHeartbeatMs = 200;
// The most time the master or an agent spends flushing its channels on the
// way out.
inline constexpr int kDrainMs = 300;
// Largest frame a peer may send before it proved the secret (a Hello or a
// Proof is tiny): a stranger cannot make the master hold more than this
// per connection.
inline constexpr uint32_t kMaxHandshakeFrameBytes = 16u << 10;
// Connections in the handshake at once; more are closed on arrival.
inline constexpr size_t kMaxPendingHandshakes = 256;
inline constexpr size_t kNonceBytes = 32;

// --- framing (pure; usable without a loop) --------------------------------

// Appends the frame for `msg` to `out`.
void AppendFrame(const pb::Control& msg, std::string* out);

// Incremental decoder: Feed bytes as they arrive; complete messages are
// appended to `out`. After an error the decoder stays failed.
class FrameDecoder {
 public:
  // Frames longer than `max_frame_bytes` fail the stream (a relay that adds
  // to what it forwards takes less than the channel does).
  explicit FrameDecoder(uint32_t max_frame_bytes = kMaxFrameBytes) : max_(max_frame_bytes) {}
  // kDataErr "frame of N bytes exceeds the 4 MiB limit", "malformed frame:
  // ...": the stream cannot be trusted past this point.
  Status Feed(const char* data, size_t size, std::vector<pb::Control>* out);
  size_t buffered() const { return buf_.size() - pos_; }
  void set_max_frame_bytes(uint32_t n) { max_ = n; }

 private:
  uint32_t max_;
  std::string buf_;
  size_t pos_ = 0;
  bool failed_ = false;
};

// --- authentication (pure) -------------------------------------------------

// HMAC-SHA256(secret, label | nonce | host), 32 bytes.
std::string AuthProof(const std::string& secret, const std::string& label,
                      const std::string& nonce, const std::string& host);
// Constant-time comparison of `proof` with the expected one.
bool CheckProof(const std::string& secret, const std::string& label, const std::string& nonce,
                const std::string& host, const std::string& proof);
std::string RandomNonce();

// --- connections -----------------------------------------------------------

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using MessageFn = std::function<void(Connection&, pb::Control&)>;
  // Called once, with why the connection ended ("closed by peer", "malformed
  // frame: ...", the reason given to Close()).
  using CloseFn = std::function<void(Connection&, const std::string& reason)>;

  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Replaces the callbacks (e.g. after the handshake).
  void SetHandlers(MessageFn on_message, CloseFn on_close);
  // The largest frame accepted from now on (kMaxFrameBytes unless set).
  void SetMaxFrameBytes(uint32_t n) { decoder_.set_max_frame_bytes(n); }
  // Queues `msg`; a no-op once closed. Frames go out in order.
  void Send(const pb::Control& msg);
  // Flushes queued frames, then closes; calls the close callback now.
  // Idempotent.
  void Close(const std::string& reason);

  bool open() const { return open_; }
  const std::string& peer() const { return peer_; }   // "127.0.0.1:4711"
  // This end's address ("10.0.0.2"; "" if unknown): where this host faces the peer.
  const std::string& local_ip() const { return local_ip_; }
  int64_t last_receive_ms() const { return last_rx_ms_; }  // uv_now of the last frame
  // Milliseconds since the peer's kernel last acknowledged anything we sent
  // (TCP_INFO's tcpi_last_ack_recv), or -1 when unknown: a second signal
  // beside silence. A peer host that still acknowledges is reachable, so a
  // silence there is its process (stopped, starved), not the network.
  int64_t peer_ack_age_ms() const;

  // Internal: adopts a connected stream (server accept, client connect).
  static std::shared_ptr<Connection> Adopt(uv_loop_t* loop, uv_tcp_t* tcp);

 private:
  Connection() = default;
  static void OnRead(uv_stream_t* s, ssize_t n, const uv_buf_t* buf);
  void Fail(const std::string& reason);

  uv_loop_t* loop_ = nullptr;
  uv_tcp_t* tcp_ = nullptr;   // owned; freed in its close callback
  bool open_ = false;
  std::string peer_;
  std::string local_ip_;
  int64_t last_rx_ms_ = 0;
  FrameDecoder decoder_;
  MessageFn on_message_;
  CloseFn on_close_;
};

// The master's listener: binds only to the address it is given.
class Server {
 public:
  struct Options {
    std::string bind = "127.0.0.1";  // an IPv4/IPv6 literal; "0.0.0.0" only when asked
    int port = 0;                    // 0: the OS chooses; see port()
    std::string secret;              // REQUIRES: not empty
  };
  // Decides whether an authenticated peer may join: "" admits, anything else
  // is the reason it is rejected (sent to the peer and logged).
  using AdmitFn = std::function<std::string(const pb::Hello&)>;
  using ReadyFn = std::function<void(std::shared_ptr<Connection>, const pb::Hello&)>;

  explicit Server(uv_loop_t* loop) : loop_(loop) {}
  ~Server();  // closes the listener and every connection still in handshake
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // kConfig for an address that is not an IP literal, kUnavailable when the
  // bind or listen fails (naming the address).
  Status Listen(const Options& options, AdmitFn admit, ReadyFn ready);
  int port() const { return port_; }
  const std::string& address() const { return options_.bind; }
  // Peers rejected so far (wrong secret, wrong version, refused by AdmitFn).
  int rejected() const { return rejected_; }
  void Close();

 private:
  struct Pending;
  static void OnConnection(uv_stream_t* s, int status);
  void Handshake(std::shared_ptr<Connection> conn);
  void Refuse(const std::shared_ptr<Connection>& conn, const std::string& why);

  uv_loop_t* loop_;
  uv_tcp_t* listener_ = nullptr;
  Options options_;
  int port_ = 0;
  int rejected_ = 0;
  AdmitFn admit_;
  ReadyFn ready_;
  std::set<std::shared_ptr<Pending>> pending_;
};

// Connects to host:port, proves the secret as `hello.host`, checks the
// server's proof, and calls `done` exactly once, on the loop (never before
// Connect returns): with the connection after Accept (its handlers are
// no-ops until the caller sets its own), kConfig when the server rejects us
// or fails its own proof (a wrong secret on either side), kUnavailable when
// there is no connection within `timeout_ms` or it breaks during the
// handshake. `hello.nonce` and `hello.protocol_version` are filled in here.
void Connect(uv_loop_t* loop, const std::string& host, int port, int timeout_ms,
             const std::string& secret, pb::Hello hello,
             std::function<void(Result<std::shared_ptr<Connection>>)> done);

// Whether a Connect error is a refused connection: the machine answered
// and no process listens there, as opposed to one that is slow, stopped
// or cut off (a timeout, an unreachable network).
bool NobodyListens(const Status& s);

// An agent that lost its master asks the standby master and the master in
// turn (agent.h), each this long to answer: both are running processes
// when they can answer at all.
inline constexpr int kFailoverConnectMs = 1000;
// It asks them for this long: at least kFailoverMs, or twice
// --master-timeout. A standby that finds the master gone waits no longer
// than that for the hosts to come (master_follow.cc).
inline constexpr int64_t kFailoverMs = 5000;
inline int64_t FailoverWindowMs(double master_timeout_s) {
  const int64_t twice = static_cast<int64_t>(2e3 * master_timeout_s);
  return twice > kFailoverMs ? twice : kFailoverMs;
}

// "HOST:PORT" → host, port; IPv6 as "[::1]:4711". kUsage naming `flag`.
Status SplitHostPort(const std::string& text, const std::string& flag, std::string* host,
                     int* port);

}  // namespace ob::launch
