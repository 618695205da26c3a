// Prometheus for ob-watch: the text exposition format (version 0.0.4) of a
// run's state, and a small HTTP server that serves it at /metrics.
//
// The server is one thread of its own. It binds exactly the address it is
// given (no default, no wildcard unless asked for), answers GET /metrics
// with the page, GET of anything else with 404 and other methods with 405,
// one request per connection, a connection at a time; each has 2 s in all
// to send its request and take the answer, so a slow or silent client
// delays a scrape by at most that and the stop not at all. It renders the page by calling the function
// it was given on its own thread: that function must lock whatever it reads.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "ob/status.h"
#include "ob/watch/state.h"

namespace ob::watch {

// The page: per rank of the newest generation (labels host, rank, pipeline,
// stage) ob_step_seconds, ob_compute_seconds, ob_communication_seconds,
// ob_tokens_per_second, ob_loss, ob_last_step, ob_memory_bytes,
// ob_seconds_since_heard, ob_straggler_ratio; job-wide ob_generation,
// ob_ranks, ob_watch_records_total and ob_watch_events_total{kind} (every
// kind, zeros included).
std::string PrometheusText(const RunState& run);

class MetricsServer {
 public:
  using Render = std::function<std::string()>;
  // Binds "HOST:PORT" ("[::1]:9100" for IPv6; port 0 picks a free one) and
  // starts serving. kUsage for a malformed address, kUnavailable when it
  // cannot be bound.
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& address, Render render);
  ~MetricsServer();  // stops the thread and closes the socket
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The bound address, "127.0.0.1:9100" / "[::1]:9100".
  const std::string& address() const { return address_; }

 private:
  MetricsServer() = default;
  void Serve();
  void Answer(int fd);

  int listen_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  std::string address_;
  Render render_;
  std::thread thread_;
};

}  // namespace ob::watch
