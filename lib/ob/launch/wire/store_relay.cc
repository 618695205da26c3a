#include "ob/launch/wire/store_relay.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ob/launch/wire/store_client.h"
#include "ob/launch/wire/store_keys.h"
#include "ob/log.h"

namespace ob::launch {

struct StoreRelay::Ep {
  StoreRelay* relay = nullptr;
  uint64_t client = 0;
  uv_pipe_t* pipe = nullptr;  // the agent's end; freed by the loop after uv_close
  int child_fd = -1;          // the worker's end until Spawned
  FrameDecoder decoder{kMaxRelayFrameBytes};
};

StoreRelay::StoreRelay(uv_loop_t* loop, ForwardFn forward)
    : loop_(loop), forward_(std::move(forward)) {}

StoreRelay::~StoreRelay() {
  while (!endpoints_.empty()) Close(endpoints_.begin()->first);
}

Result<StoreRelay::Endpoint> StoreRelay::Open() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return Status::Unavailable(std::string("cannot make a store socket for a worker: ") +
                               std::strerror(errno));
  }
  auto ep = std::make_unique<Ep>();
  ep->relay = this;
  ep->client = next_client_++;
  ep->child_fd = sv[1];
  ep->pipe = static_cast<uv_pipe_t*>(std::calloc(1, sizeof(uv_pipe_t)));
  uv_pipe_init(loop_, ep->pipe, 0);
  int rc = uv_pipe_open(ep->pipe, sv[0]);
  if (rc != 0) ::close(sv[0]);  // else the pipe owns it
  if (rc == 0) {
    ep->pipe->data = ep.get();
    rc = uv_read_start(
        reinterpret_cast<uv_stream_t*>(ep->pipe),
        [](uv_handle_t*, size_t suggested, uv_buf_t* b) {
          b->base = static_cast<char*>(std::malloc(suggested));
          b->len = b->base != nullptr ? suggested : 0;
        },
        &StoreRelay::OnRead);
  }
  if (rc != 0) {
    ep->pipe->data = nullptr;
    uv_close(reinterpret_cast<uv_handle_t*>(ep->pipe), [](uv_handle_t* h) { std::free(h); });
    ::close(sv[1]);
    return Status::Unavailable(std::string("cannot watch a worker's store socket: ") + uv_strerror(rc));
  }
  Endpoint out{ep->client, ep->child_fd};
  endpoints_.emplace(ep->client, std::move(ep));
  return out;
}

void StoreRelay::Spawned(uint64_t client) {
  auto it = endpoints_.find(client);
  if (it == endpoints_.end() || it->second->child_fd < 0) return;
  ::close(it->second->child_fd);
  it->second->child_fd = -1;
}

void StoreRelay::Close(uint64_t client) {
  auto it = endpoints_.find(client);
  if (it == endpoints_.end()) return;
  Ep& ep = *it->second;
  if (ep.pipe != nullptr) {
    ep.pipe->data = nullptr;
    // Queued writes are cancelled (their callbacks free them).
    uv_close(reinterpret_cast<uv_handle_t*>(ep.pipe), [](uv_handle_t* h) { std::free(h); });
  }
  if (ep.child_fd >= 0) ::close(ep.child_fd);
  endpoints_.erase(it);
}

void StoreRelay::OnRead(uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
  auto* ep = static_cast<Ep*>(s->data);
  if (ep != nullptr && n > 0) {
    ep->relay->OnFrames(ep->client, buf->base, static_cast<size_t>(n));
  } else if (ep != nullptr && n < 0) {
    ep->relay->Close(ep->client);  // the worker is gone (or closed its end)
  }
  std::free(buf->base);
}

void StoreRelay::OnFrames(uint64_t client, const char* data, size_t n) {
  auto it = endpoints_.find(client);
  if (it == endpoints_.end()) return;
  std::vector<pb::Control> msgs;
  Status st = it->second->decoder.Feed(data, n, &msgs);
  for (auto& m : msgs) {
    if (!m.has_store_request()) {
      st = Status::DataErr("a control message that is not a store request");
      break;
    }
    m.mutable_store_request()->set_client(client);
    if (!Shared(m)) forward_(m);
  }
  if (!st.ok()) {
    OB_LOG(Warn) << "store relay: worker connection " << client << ": " << st.message()
                 << "; closing it";
    Close(client);
  }
}

bool StoreRelay::Shared(const pb::Control& m) {
  const pb::StoreRequest& r = m.store_request();
  if (r.op() != pb::STORE_GET || r.keys_size() != 1) return false;
  const std::optional<uint64_t> g = GenerationOfKey(r.keys(0));
  if (!g) return false;
  if (auto k = kept_.find(*g); k != kept_.end()) {
    pb::StoreReply reply;
    reply.set_id(r.id());
    reply.set_client(r.client());
    reply.set_value(k->second);
    ++answered_here_;
    Send(reply);
    return true;
  }
  if (auto a = asked_.find(*g); a != asked_.end()) {
    a->second.waiting.push_back(m);
    return true;
  }
  asked_[*g].sent = {r.client(), r.id()};
  return false;
}

void StoreRelay::Settle(const pb::StoreReply& reply) {
  for (auto a = asked_.begin(); a != asked_.end(); ++a) {
    if (a->second.sent != std::make_pair(reply.client(), reply.id())) continue;
    const uint64_t g = a->first;
    std::vector<pb::Control> waiting = std::move(a->second.waiting);
    asked_.erase(a);
    if (reply.code() == 0) {
      kept_[g] = reply.value();
      while (kept_.size() > kKeptGenerations) kept_.erase(kept_.begin());
    }
    // Answered from what was kept; or, when the master refused the one
    // sent, each sent on for itself (the first of them goes out, the rest
    // wait for it again).
    for (const pb::Control& w : waiting) {
      if (!Shared(w)) forward_(w);
    }
    return;
  }
}

void StoreRelay::Deliver(const pb::StoreReply& reply) {
  if (!asked_.empty()) Settle(reply);
  Send(reply);
}

void StoreRelay::Send(const pb::StoreReply& reply) {
  auto it = endpoints_.find(reply.client());
  if (it == endpoints_.end() || it->second->pipe == nullptr) {
    ++dropped_;  // that worker is gone
    return;
  }
  auto* stream = reinterpret_cast<uv_stream_t*>(it->second->pipe);
  if (uv_stream_get_write_queue_size(stream) > kMaxRelayBacklogBytes) {
    OB_LOG(Warn) << "store relay: worker connection " << reply.client()
                 << " does not read its replies; closing it";
    ++dropped_;
    return Close(reply.client());
  }
  struct WriteReq {
    uv_write_t req;
    std::string data;
  };
  auto* w = new WriteReq;
  pb::Control m;
  *m.mutable_store_reply() = reply;
  AppendFrame(m, &w->data);
  uv_buf_t b = uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
  if (uv_write(&w->req, stream, &b, 1, [](uv_write_t* r, int) { delete reinterpret_cast<WriteReq*>(r); }) != 0) {
    delete w;
    ++dropped_;
    Close(reply.client());
  }
}

void ServeStoreRequest(StoreServer* server, const std::shared_ptr<Connection>& conn,
                       const pb::StoreRequest& request, int64_t now_ms) {
  std::weak_ptr<Connection> weak = conn;
  server->Handle(request, now_ms, [weak](pb::StoreReply reply) {
    std::shared_ptr<Connection> c = weak.lock();
    if (!c || !c->open()) return;  // the agent is gone, and with it the worker that asked
    pb::Control m;
    *m.mutable_store_reply() = std::move(reply);
    c->Send(m);
  });
}

}  // namespace ob::launch
