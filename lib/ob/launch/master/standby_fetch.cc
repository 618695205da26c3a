#include "ob/launch/master/standby_fetch.h"

#include <uv.h>

#include <memory>
#include <utility>

#include "ob/launch/wire/channel.h"

namespace ob::launch {

Result<StandbyStart> FetchStandbyStart(const std::string& master, const std::string& host,
                                       const std::string& secret, int timeout_ms) {
  std::string addr;
  int port = 0;
  OB_RETURN_IF_ERROR(SplitHostPort(master, "--standby-master-of", &addr, &port));
  uv_loop_t loop;
  uv_loop_init(&loop);
  Result<StandbyStart> out = Status::Unavailable("the master at " + master + " sent nothing within " +
                                                 std::to_string(timeout_ms / 1000) + " s");
  std::shared_ptr<Connection> conn;
  uv_timer_t timer;
  uv_timer_init(&loop, &timer);
  uv_timer_start(&timer, [](uv_timer_t* t) { uv_stop(t->loop); }, static_cast<uint64_t>(timeout_ms), 0);
  pb::Hello hello;
  hello.set_host(host);
  hello.set_role(1);
  Connect(&loop, addr, port, timeout_ms, secret, hello, [&](Result<std::shared_ptr<Connection>> r) {
    if (!r.ok()) {
      out = r.status();
      uv_stop(&loop);
      return;
    }
    conn = std::move(r).value();
    conn->SetMaxFrameBytes(256u << 20);
    conn->SetHandlers(
        [&](Connection& c, pb::Control& m) {
          if (!m.has_master_sync()) return;
          StandbyStart s;
          s.sync = std::move(*m.mutable_master_sync());
          s.local_ip = c.local_ip();
          out = std::move(s);
          uv_stop(&loop);
        },
        [&](Connection&, const std::string& why) {
          out = Status::Unavailable("the master at " + master + " closed the connection: " + why);
          uv_stop(&loop);
        });
  });
  uv_run(&loop, UV_RUN_DEFAULT);
  if (conn) {
    conn->SetHandlers(nullptr, nullptr);
    conn->Close("fetched");
    conn.reset();
  }
  uv_walk(&loop, [](uv_handle_t* h, void*) { if (!uv_is_closing(h)) uv_close(h, nullptr); }, nullptr);
  for (int i = 0; i < 3; ++i) uv_run(&loop, UV_RUN_NOWAIT);
  uv_loop_close(&loop);
  return out;
}

}  // namespace ob::launch
