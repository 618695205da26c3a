#include "ob/launch/master/operator_socket.h"

#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <vector>

#include <google/protobuf/util/json_util.h>

#include "ob/log.h"

namespace ob::launch {

struct OperatorClient {
  uv_pipe_t pipe;   // first: the handle's address is the client's
  std::string buf;
  OperatorSocket* owner = nullptr;
  bool watching = false;

  static void Close(OperatorClient* c) {
    if (c->owner != nullptr) c->owner->watchers_.erase(c);
    c->owner = nullptr;
    if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(&c->pipe))) {
      uv_close(reinterpret_cast<uv_handle_t*>(&c->pipe),
               [](uv_handle_t* h) { delete reinterpret_cast<OperatorClient*>(h); });
    }
  }
};

namespace {

using Client = OperatorClient;
constexpr size_t kMaxRequestLine = 4096;

void Send(Client* c, std::string data) {
  struct WriteReq {
    uv_write_t req;
    std::string data;
  };
  auto* w = new WriteReq;
  w->data = std::move(data);
  uv_buf_t b = uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
  if (uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&c->pipe), &b, 1,
               [](uv_write_t* r, int) { delete reinterpret_cast<WriteReq*>(r); }) != 0) {
    delete w;
  }
}

void Reply(Client* c, const std::string& line) { Send(c, line + "\n"); }

}  // namespace

namespace {
void CloseClient(Client* c) { OperatorClient::Close(c); }
}  // namespace

Result<pb::OperatorRequest> ParseOperatorRequest(const std::string& line) {
  std::istringstream in(line);
  std::string word, arg;
  in >> word;
  pb::OperatorRequest r;
  // "run=ID REQUEST": for that run only (OperatorRequest.run).
  if (word.rfind("run=", 0) == 0) {
    r.set_run(word.substr(4));
    if (r.run().empty()) return Status::Usage("run=: which run? (run=ID REQUEST, ID as in 'status')");
    word.clear();
    in >> word;
  }
  std::getline(in >> std::ws, arg);
  if (word == "status") {
    r.set_command(pb::OPERATOR_STATUS);
  } else if (word == "stop") {
    r.set_command(pb::OPERATOR_STOP);
    r.set_reason(arg.empty() ? "an operator asked to stop" : arg);
  } else if (word == "exclude" || word == "drain") {
    std::istringstream rest(arg);
    std::string host, reason;
    rest >> host;
    std::getline(rest >> std::ws, reason);
    if (host.empty()) return Status::Usage(word + ": which host?");
    if (reason.rfind("slow=", 0) == 0) {
      const size_t end = std::min(reason.find(' '), reason.size());
      const std::string ratio = reason.substr(5, end - 5);
      char* stop = nullptr;
      const double x = std::strtod(ratio.c_str(), &stop);
      if (ratio.empty() || *stop != '\0' || !(x >= 1) || !std::isfinite(x))
        return Status::Usage(word + " " + host + ": slow=" + ratio + " is not a ratio >= 1");
      r.set_slowdown(x);
      const size_t next = reason.find_first_not_of(' ', end);
      reason = next == std::string::npos ? "" : reason.substr(next);
    }
    r.set_command(word == "exclude" ? pb::OPERATOR_EXCLUDE_HOST : pb::OPERATOR_DRAIN);
    r.set_host(host);
    r.set_reason(reason.empty() ? "an operator asked to " + word + " it" : reason);
  } else if (word == "checkpoint") {
    r.set_command(pb::OPERATOR_CHECKPOINT_NOW);
    r.set_reason(arg);
  } else if (word == "rollback") {
    r.set_command(pb::OPERATOR_ROLLBACK);
    r.set_reason(arg.empty() ? "an operator asked to roll back" : arg);
  } else if (word == "watch") {
    r.set_command(pb::OPERATOR_WATCH);
  } else {
    return Status::Usage("unknown request '" + word +
                         "' (status, stop, exclude HOST [slow=RATIO], drain HOST [slow=RATIO], checkpoint, "
                         "rollback, watch)");
  }
  return r;
}

std::string OperatorResponseJson(const pb::OperatorResponse& response) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(response, &out, opts);
  return out;
}

Status OperatorSocket::Listen(const std::string& path, Handler handler) {
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return Status::IoErr(path + ": too long for a unix socket path");
  }
  handler_ = std::move(handler);
  ::unlink(path.c_str());
  server_ = new uv_pipe_t;
  uv_pipe_init(loop_, server_, 0);
  server_->data = this;
  int rc = uv_pipe_bind(server_, path.c_str());
  if (rc == 0) {
    ::chmod(path.c_str(), 0600);
    rc = uv_listen(reinterpret_cast<uv_stream_t*>(server_), 16, &OperatorSocket::OnConnection);
  }
  if (rc != 0) {
    Close();
    return Status::IoErr(path + ": cannot listen: " + uv_strerror(rc));
  }
  path_ = path;
  return Status::Ok();
}

void OperatorSocket::Broadcast(const std::string& bytes) {
  std::vector<Client*> drop;
  for (Client* c : watchers_) {
    if (uv_stream_get_write_queue_size(reinterpret_cast<uv_stream_t*>(&c->pipe)) > kMaxWatchBacklog) {
      drop.push_back(c);
    } else {
      Send(c, bytes);
    }
  }
  for (Client* c : drop) {
    OB_LOG(Warn) << "dropping a watcher of the control socket: it fell " << (kMaxWatchBacklog >> 20)
                 << " MiB behind";
    CloseClient(c);
  }
}

void OperatorSocket::Close() {
  for (Client* c : std::vector<Client*>(watchers_.begin(), watchers_.end())) CloseClient(c);
  if (server_ != nullptr) {
    server_->data = nullptr;
    uv_close(reinterpret_cast<uv_handle_t*>(server_),
             [](uv_handle_t* h) { delete reinterpret_cast<uv_pipe_t*>(h); });
    server_ = nullptr;
  }
  if (!path_.empty()) ::unlink(path_.c_str());
  path_.clear();
}

void OperatorSocket::OnConnection(uv_stream_t* server, int status) {
  auto* self = static_cast<OperatorSocket*>(server->data);
  if (self == nullptr || status < 0) return;
  auto* c = new Client;
  c->owner = self;
  uv_pipe_init(self->loop_, &c->pipe, 0);
  if (uv_accept(server, reinterpret_cast<uv_stream_t*>(&c->pipe)) != 0) {
    CloseClient(c);
    return;
  }
  uv_read_start(
      reinterpret_cast<uv_stream_t*>(&c->pipe),
      [](uv_handle_t*, size_t suggested, uv_buf_t* b) {
        b->base = static_cast<char*>(std::malloc(suggested));
        b->len = b->base ? suggested : 0;
      },
      [](uv_stream_t* s, ssize_t n, const uv_buf_t* b) {
        auto* c = reinterpret_cast<Client*>(s);
        if (n < 0) {
          std::free(b->base);
          return CloseClient(c);
        }
        c->buf.append(b->base, static_cast<size_t>(n));
        std::free(b->base);
        size_t nl;
        while ((nl = c->buf.find('\n')) != std::string::npos) {
          std::string line = c->buf.substr(0, nl);
          c->buf.erase(0, nl + 1);
          if (!line.empty() && line.back() == '\r') line.pop_back();
          if (line.empty() || c->watching || c->owner == nullptr) continue;
          Result<pb::OperatorRequest> req = ParseOperatorRequest(line);
          if (req.ok() && req->command() == pb::OPERATOR_WATCH) {  // no answer: the stream
            c->watching = true;
            c->owner->watchers_.insert(c);
            continue;
          }
          pb::OperatorResponse resp;
          if (!req.ok()) {
            resp.set_ok(false);
            resp.set_error(req.status().message());
          } else {
            resp = c->owner->handler_(*req);
          }
          Reply(c, OperatorResponseJson(resp));
        }
        if (c->buf.size() > kMaxRequestLine) {
          pb::OperatorResponse resp;
          resp.set_error("request line too long");
          Reply(c, OperatorResponseJson(resp));
          CloseClient(c);
        }
      });
}

}  // namespace ob::launch
