#include "ob/launch/metrics_sink.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "ob/clock.h"
#include "ob/io/file.h"
#include "ob/io/message.h"
#include "ob/log.h"

namespace ob::launch {
namespace {

std::string Fixed(double v, int digits) {
  char buf[64];
  snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

}  // namespace

MetricsSink::~MetricsSink() {
  if (fd_ > STDERR_FILENO) ::close(fd_);
}

Status MetricsSink::Open(const std::string& path) {
  if (path.empty()) return Status::Ok();
  if (path == "-") {
    if (io::StdoutIsTerminal()) {
      return Status::Usage("refusing to write binary metrics to a terminal; use --metrics FILE or a pipe");
    }
    fd_ = STDOUT_FILENO;
  } else {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd_ < 0) return Status::IoErr(path + ": cannot write metrics: " + std::strerror(errno));
  }
  out_ = std::make_unique<io::RecordWriter>(fd_, io::DisplayName(path, true));
  return Status::Ok();
}

void MetricsSink::Publish(const pb::Metrics& m) {
  if (out_) {
    Status st = out_->Write(m);
    if (!st.ok()) {
      OB_LOG(Error) << st.message() << "; no more metrics are written";
      out_.reset();
    }
  }
  if (watchers_->watchers() > 0) {
    std::string bytes;
    io::AppendRecord(m, &bytes);
    watchers_->Broadcast(bytes);
  }
}

void MetricsSink::Exited(const std::string& host, const pb::WorkerExited& x, uint64_t generation,
                         uint64_t step) {
  pb::Metrics rec;
  rec.set_format_version(io::kMetricsFormatVersion);
  rec.set_host(host);
  rec.set_rank(x.rank());
  rec.set_generation(generation);
  rec.set_step(step);
  rec.set_unix_ms(x.unix_ms());
  rec.mutable_exit()->set_exit_status(x.exit_status());
  rec.mutable_exit()->set_signal(x.signal());
  rec.mutable_exit()->set_description(x.description());
  Publish(rec);
}

void MetricsSink::Hung(const std::string& host, const HangWatch::Named& n, uint64_t generation,
                       const std::string& line) {
  pb::Metrics rec;
  rec.set_format_version(io::kMetricsFormatVersion);
  rec.set_host(host);
  rec.set_rank(n.rank);
  rec.set_generation(generation);
  rec.set_step(static_cast<uint64_t>(std::max<int64_t>(0, n.step)));
  rec.set_unix_ms(UnixMs());
  rec.set_heartbeat(true);
  rec.set_phase(pb::PHASE_TRAINING);
  rec.set_progress(n.progress);
  rec.set_waiting(n.waiting);
  auto* h = rec.mutable_hang();
  h->set_stalled_seconds(static_cast<double>(n.stalled_ms) / 1e3);
  h->set_progress(n.progress);
  h->set_waiting(n.waiting);
  h->set_description(line);
  Publish(rec);
}

void MetricsSink::Step(const pb::Metrics& m) {
  last_[m.rank()] = m;
  last_step_ = std::max<uint64_t>(last_step_, m.step());
  stepped_ = true;
  fresh_ = true;
  if (m.rank() == 0) {
    steps_done_ = std::max<uint64_t>(steps_done_, m.step() + 1);
    step_seconds_sum_ += m.step_seconds();
    tokens_sum_ += m.tokens_per_second() * m.step_seconds();
    last_loss_ = m.loss();
  }
}

std::string MetricsSink::Progress() {
  if (!fresh_) return "";
  fresh_ = false;
  double loss_sum = 0, tokens = 0;
  int losses = 0;
  for (const auto& [rank, m] : last_) {
    if (m.step() != last_step_ || !std::isfinite(m.loss())) continue;
    loss_sum += m.loss();
    tokens += m.tokens_per_second();
    ++losses;
  }
  return "step " + std::to_string(last_step_) + "  loss " +
         (losses > 0 ? Fixed(loss_sum / losses, 4) : std::string("-")) + "  tokens/s " +
         (losses > 0 ? Fixed(tokens / losses, 0) : std::string("-"));
}

std::string MetricsSink::Summary() const {
  if (steps_done_ == 0 || step_seconds_sum_ <= 0) return "";
  return "trained " + std::to_string(steps_done_) + " steps: final loss " + Fixed(last_loss_, 4) + ", " +
         Fixed(tokens_sum_ / step_seconds_sum_, 0) + " tokens/s";
}

}  // namespace ob::launch
