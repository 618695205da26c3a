#include "store_testing.h"

#include <unistd.h>

#include <condition_variable>
#include <stdexcept>

namespace ob::testing {

RelayHarness::RelayHarness() {
  uv_loop_init(&loop_);
  launch::Server::Options o;
  o.secret = "harness-secret";
  Status st = server_.Listen(
      o, nullptr, [this](std::shared_ptr<launch::Connection> c, const pb::Hello&) {
        at_master_ = c;
        c->SetHandlers(
            [this](launch::Connection& conn, pb::Control& m) {
              if (m.has_store_request()) {
                launch::ServeStoreRequest(&store_, at_master_, m.store_request(),
                                          static_cast<int64_t>(uv_now(&loop_)));
              }
            },
            nullptr);
      });
  if (!st.ok()) throw std::runtime_error(st.message());
  relay_ = std::make_unique<launch::StoreRelay>(&loop_, [this](const pb::Control& m) {
    if (at_agent_) at_agent_->Send(m);
  });
  bool done = false;
  pb::Hello hello;
  hello.set_host("harness-agent");
  launch::Connect(&loop_, "127.0.0.1", server_.port(), 5000, o.secret, hello,
                  [&](Result<std::shared_ptr<launch::Connection>> r) {
                    done = true;
                    if (!r.ok()) return;
                    at_agent_ = *r;
                    at_agent_->SetHandlers(
                        [this](launch::Connection&, pb::Control& m) {
                          if (m.has_store_reply()) relay_->Deliver(m.store_reply());
                        },
                        nullptr);
                  });
  while (!done || !at_master_) uv_run(&loop_, UV_RUN_ONCE);
  if (!at_agent_) throw std::runtime_error("the harness agent did not connect");
  // As the master does from its tick: held requests past their deadline.
  uv_timer_init(&loop_, &sweep_);
  sweep_.data = this;
  uv_timer_start(&sweep_, [](uv_timer_t* t) {
    auto* h = static_cast<RelayHarness*>(t->data);
    h->store_.Sweep(static_cast<int64_t>(uv_now(&h->loop_)));
  }, 20, 20);
  uv_async_init(&loop_, &async_, &RelayHarness::OnAsync);
  async_.data = this;
  thread_ = std::thread([this] { uv_run(&loop_, UV_RUN_DEFAULT); });
}

RelayHarness::~RelayHarness() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  uv_async_send(&async_);
  thread_.join();
  uv_walk(&loop_, [](uv_handle_t* h, void*) { if (!uv_is_closing(h)) uv_close(h, nullptr); }, nullptr);
  for (int i = 0; i < 5; ++i) uv_run(&loop_, UV_RUN_NOWAIT);
  uv_loop_close(&loop_);
}

void RelayHarness::OnAsync(uv_async_t* a) {
  auto* h = static_cast<RelayHarness*>(a->data);
  h->Drain();
}

void RelayHarness::Drain() {
  std::vector<std::function<void()>> tasks;
  bool stopping;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks.swap(tasks_);
    stopping = stopping_;
  }
  for (auto& t : tasks) t();
  if (!stopping) return;
  relay_.reset();
  if (at_agent_) at_agent_->Close("harness over");
  if (at_master_) at_master_->Close("harness over");
  at_agent_.reset();
  at_master_.reset();
  server_.Close();
  uv_timer_stop(&sweep_);
  uv_stop(&loop_);
}

void RelayHarness::OnLoop(std::function<void(launch::StoreServer&, launch::StoreRelay&)> fn) {
  std::mutex done_mu;
  std::condition_variable cv;
  bool done = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back([&] {
      fn(store_, *relay_);
      std::lock_guard<std::mutex> l(done_mu);
      done = true;
      cv.notify_all();
    });
  }
  uv_async_send(&async_);
  std::unique_lock<std::mutex> lock(done_mu);
  cv.wait(lock, [&] { return done; });
}

int RelayHarness::RawEndpoint(uint64_t* client) {
  int fd = -1;
  OnLoop([&](launch::StoreServer&, launch::StoreRelay& relay) {
    Result<launch::StoreRelay::Endpoint> ep = relay.Open();
    if (!ep.ok()) return;
    fd = ::dup(ep->child_fd);  // ours now; the relay closes its copy
    relay.Spawned(ep->client);
    *client = ep->client;
  });
  return fd;
}

std::shared_ptr<launch::StoreClient> RelayHarness::NewClient() {
  uint64_t client = 0;
  const int fd = RawEndpoint(&client);
  Result<std::unique_ptr<launch::StoreClient>> c = launch::StoreClient::FromFd(fd);
  if (!c.ok()) throw std::runtime_error(c.status().message());
  return std::shared_ptr<launch::StoreClient>(std::move(c).value());
}

}  // namespace ob::testing
