// The master's control socket for operators and ob-watch: a unix socket
// (run-dir/control.sock, mode 0600) that takes one text request per line
//   status | stop [REASON] | exclude HOST [REASON] | drain HOST [REASON] |
//   checkpoint [REASON] | rollback [REASON] | watch
// each optionally behind "run=ID " (OperatorRequest.run: the master acts
// only when ID is its own run's)
// and answers each with one line: an OperatorResponse (control.proto) in
// protobuf's JSON mapping. `echo status | socat - UNIX:run/control.sock`.
// "watch" turns the connection into a stream: Broadcast's bytes go to it
// (ob-watch --attach reads the metrics so); a watcher that falls more than
// kMaxWatchBacklog bytes behind is dropped rather than let grow the master.
//
// Thread model: runs on the master's uv loop; the handler is called there.
// Failure: Listen returns kIoErr naming the path; a bad request gets
// {"ok":false,"error":"..."} and the connection stays usable.
#pragma once

#include <functional>
#include <set>
#include <string>

#include <uv.h>

#include "ob/control.pb.h"
#include "ob/status.h"

namespace ob::launch {

struct OperatorClient;

// "status" → OPERATOR_STATUS, ...; kUsage naming the unknown command.
Result<pb::OperatorRequest> ParseOperatorRequest(const std::string& line);
// One line of JSON, no newline.
std::string OperatorResponseJson(const pb::OperatorResponse& response);

class OperatorSocket {
 public:
  using Handler = std::function<pb::OperatorResponse(const pb::OperatorRequest&)>;

  explicit OperatorSocket(uv_loop_t* loop) : loop_(loop) {}
  ~OperatorSocket() { Close(); }
  OperatorSocket(const OperatorSocket&) = delete;
  OperatorSocket& operator=(const OperatorSocket&) = delete;

  // Binds `path` (replacing a stale socket there). kIoErr when the path is
  // too long for a unix socket or cannot be bound.
  Status Listen(const std::string& path, Handler handler);
  // Stops listening and removes the socket file. Idempotent.
  void Close();
  // Writes `bytes` to every watching connection.
  void Broadcast(const std::string& bytes);
  size_t watchers() const { return watchers_.size(); }

  static constexpr size_t kMaxWatchBacklog = 16u << 20;

 private:
  friend struct OperatorClient;
  static void OnConnection(uv_stream_t* server, int status);
  std::set<OperatorClient*> watchers_;

  uv_loop_t* loop_;
  uv_pipe_t* server_ = nullptr;
  std::string path_;
  Handler handler_;
};

}  // namespace ob::launch
