#include "ob/launch/operator_socket.h"

#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>

#include <google/protobuf/util/json_util.h>

#include "ob/log.h"

namespace ob::launch {
namespace {

constexpr size_t kMaxRequestLine = 4096;

struct Client {
  uv_pipe_t pipe;   // first: the handle's address is the Client's
  std::string buf;
  OperatorSocket::Handler* handler;
};

void Reply(Client* c, const std::string& line) {
  struct WriteReq {
    uv_write_t req;
    std::string data;
  };
  auto* w = new WriteReq;
  w->data = line + "\n";
  uv_buf_t b = uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
  if (uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&c->pipe), &b, 1,
               [](uv_write_t* r, int) { delete reinterpret_cast<WriteReq*>(r); }) != 0) {
    delete w;
  }
}

void CloseClient(Client* c) {
  if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(&c->pipe))) {
    uv_close(reinterpret_cast<uv_handle_t*>(&c->pipe),
             [](uv_handle_t* h) { delete reinterpret_cast<Client*>(h); });
  }
}

}  // namespace

Result<pb::OperatorRequest> ParseOperatorRequest(const std::string& line) {
  std::istringstream in(line);
  std::string word, arg;
  in >> word;
  std::getline(in >> std::ws, arg);
  pb::OperatorRequest r;
  if (word == "status") {
    r.set_command(pb::OPERATOR_STATUS);
  } else if (word == "stop") {
    r.set_command(pb::OPERATOR_STOP);
    r.set_reason(arg.empty() ? "an operator asked to stop" : arg);
  } else if (word == "exclude" || word == "drain") {
    if (arg.empty()) return Status::Usage(word + ": which host?");
    r.set_command(word == "exclude" ? pb::OPERATOR_EXCLUDE_HOST : pb::OPERATOR_DRAIN);
    r.set_host(arg);
  } else if (word == "checkpoint") {
    r.set_command(pb::OPERATOR_CHECKPOINT_NOW);
  } else {
    return Status::Usage("unknown request '" + word +
                         "' (status, stop, exclude HOST, drain HOST, checkpoint)");
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

void OperatorSocket::Close() {
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
  c->handler = &self->handler_;
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
          if (line.empty()) continue;
          Result<pb::OperatorRequest> req = ParseOperatorRequest(line);
          pb::OperatorResponse resp;
          if (!req.ok()) {
            resp.set_ok(false);
            resp.set_error(req.status().message());
          } else {
            resp = (*c->handler)(*req);
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
