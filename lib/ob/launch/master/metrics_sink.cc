#include "ob/launch/master/metrics_sink.h"

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
#include "ob/io/text.h"
#include "ob/log.h"

namespace ob::launch {
using io::Fixed;

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
    // A restarted or resumed job's same --metrics keeps the earlier run's
    // records (io::OpenNewStream), as a file of their own.
    std::string kept;
    Result<int> fd = io::OpenNewStream(path, 0600, &kept);
    if (!fd.ok()) return Status::IoErr(fd.status().message() + " (--metrics)");
    fd_ = *fd;
    if (!kept.empty()) {
      OB_LOG(Info) << "--metrics " << path << ": the records there before are kept in " << kept;
    }
  }
  out_ = std::make_unique<io::RecordWriter>(fd_, io::DisplayName(path, true));
  return Status::Ok();
}

Status MetricsSink::TakeOver(const std::string& path, const std::string& copy) {
  out_.reset();
  if (fd_ > STDERR_FILENO) ::close(fd_);
  fd_ = -1;
  OB_RETURN_IF_ERROR(Open(path));
  if (fd_ < 0) return Status::Ok();
  Result<std::string> bytes = io::ReadFile(copy);
  if (!bytes.ok()) return bytes.status();
  return WriteRaw(*bytes).WithContext(path);
}

Status MetricsSink::WriteRaw(const std::string& bytes) {
  if (fd_ < 0) return Status::Ok();
  for (size_t at = 0; at < bytes.size();) {
    const ssize_t n = ::write(fd_, bytes.data() + at, bytes.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::IoErr(std::string("cannot write the records so far: ") + std::strerror(errno));
    at += static_cast<size_t>(n);
  }
  return Status::Ok();
}

bool MetricsSink::Seen(const pb::Metrics& m) const {
  auto it = published_.find({m.generation(), m.rank()});
  return it != published_.end() && it->second >= m.step();
}

void MetricsSink::Publish(const pb::Metrics& record) {
  if (!record.heartbeat() && !record.evaluation_only()) {
    uint64_t& newest = published_[{record.generation(), record.rank()}];
    newest = std::max<uint64_t>(newest, record.step());
  }
  pb::Metrics m = record;
  // Not on a worker's heartbeat, two a second a worker and most of the
  // file: a reader takes it for the run of the records around it.
  if (m.heartbeat() && !m.has_hang()) {
    m.clear_run();
  } else if (!run_.empty()) {
    m.set_run(run_);
  }
  m.set_received_unix_ms(UnixMs());
  if (out_ && ToFile(m)) {
    Status st = out_->Write(m);
    if (!st.ok()) {
      lost_ = "--metrics lacks the records from step " + std::to_string(m.step()) + " on: " + st.message();
      OB_LOG(Error) << st.message() << "; no more metrics are written";
      out_.reset();
    }
  }
  if (watchers_ != nullptr && watchers_->watchers() > 0) {
    std::string bytes;
    io::AppendRecord(m, &bytes);
    watchers_->Broadcast(bytes);
  }
}

bool MetricsSink::ToFile(const pb::Metrics& m) {
  if (m.has_exit()) return true;  // the master's own record: never thinned
  const int64_t now = SteadyMs();
  Written& w = written_[{m.generation(), m.rank()}];
  const bool plain_beat = m.heartbeat() && !m.has_hang() && !m.has_checkpoint();
  if (plain_beat && w.at_ms > 0 && now - w.at_ms < kFileBeatMs && m.phase() == w.phase) return false;
  w = {now, static_cast<int>(m.phase())};
  return true;
}

void MetricsSink::NewGeneration() {
  last_.clear();
  // The generations before the last: their late beats are written, and
  // the map stays the size of a generation or two.
  if (!written_.empty()) {
    const uint64_t newest = written_.rbegin()->first.first;
    written_.erase(written_.begin(), written_.lower_bound({newest, 0}));
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
    first_step_ = first_step_ < 0 ? static_cast<int64_t>(m.step()) : std::min<int64_t>(first_step_, m.step());
    step_seconds_sum_ += m.step_seconds();
    recent_step_seconds_.push_back(m.step_seconds());
    if (recent_step_seconds_.size() > kEtaSteps) recent_step_seconds_.pop_front();
    tokens_sum_ += m.tokens_per_second() * m.step_seconds();
    last_loss_ = m.loss();
    if (std::isfinite(m.loss())) {
      last_finite_step_ = static_cast<int64_t>(m.step());
      nonfinite_since_ = -1;
    } else if (nonfinite_since_ < 0 || static_cast<int64_t>(m.step()) < nonfinite_since_) {
      nonfinite_since_ = static_cast<int64_t>(m.step());
    }
    if (m.has_eval_loss()) {
      eval_loss_ = m.eval_loss();
      have_eval_ = true;
    }
  }
}

namespace {

// "45s", "3m05s", "2h07m", "3d04h".
std::string Duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  else if (s < 86400) std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600), static_cast<long long>(s / 60 % 60));
  else std::snprintf(buf, sizeof buf, "%lldd%02lldh", static_cast<long long>(s / 86400), static_cast<long long>(s / 3600 % 24));
  return buf;
}

}  // namespace

std::string MetricsSink::Progress() {
  if (!fresh_) return "";
  fresh_ = false;
  double loss_sum = 0, tokens = 0, mfu_sum = 0;
  int losses = 0, mfus = 0;
  uint64_t peak = 0;  // the largest peak device memory of any rank, and whose
  uint32_t peak_rank = 0;
  bool nonfinite = false;  // a rank reported a NaN or infinite loss
  for (const auto& [rank, m] : last_) {
    if (m.step() != last_step_) continue;
    if (m.peak_memory_bytes() > peak) {
      peak = m.peak_memory_bytes();
      peak_rank = m.rank();
    }
    if (m.mfu() > 0) {
      mfu_sum += m.mfu();
      ++mfus;
    }
    if (m.evaluation_only()) continue;  // no step trained: its NaN loss is no divergence
    if (!std::isfinite(m.loss())) {
      nonfinite = true;
      continue;
    }
    loss_sum += m.loss();
    tokens += m.tokens_per_second();
    ++losses;
  }
  const int64_t done = static_cast<int64_t>(last_step_) + 1;
  std::string line = "step " + std::to_string(done) + (total_steps_ > 0 ? "/" + std::to_string(total_steps_) : "") +
                     "  loss " + (losses > 0 ? Fixed(loss_sum / losses, 4) : std::string(nonfinite ? "nan" : "-")) + "  tokens/s " +
                     (losses > 0 ? Fixed(tokens / losses, 0) : std::string("-")) + "  MFU " +
                     (mfus > 0 ? Fixed(100 * mfu_sum / mfus, 1) + "%" : std::string("-"));
  if (have_eval_) line.insert(line.find("  tokens/s"), "  eval " + Fixed(eval_loss_, 4));
  if (peak > 0) {
    line += "  GPU memory " + Fixed(static_cast<double>(peak) / (1 << 30), 1) + " GiB (rank " +
            std::to_string(peak_rank) + ")";
  }
  if (total_steps_ > 0 && !recent_step_seconds_.empty()) {
    double mean = 0;
    for (double s : recent_step_seconds_) mean += s;
    mean /= static_cast<double>(recent_step_seconds_.size());
    line += "  ETA " + Duration(mean * static_cast<double>(std::max<int64_t>(0, total_steps_ - done)));
  }
  return line;
}

Status MetricsSink::LossVerdict() const {
  if (total_steps_ == 0 || steps_done_ == 0 || std::isfinite(last_loss_)) return Status::Ok();
  std::string msg = "training ended with a loss that is not finite (" + Fixed(last_loss_, 4) + " since step " +
                    std::to_string(nonfinite_since_) + "): its weights are not usable";
  msg += last_finite_step_ >= 0 ? "; the last finite loss was at step " + std::to_string(last_finite_step_) +
                                      " (resume from a checkpoint before it, e.g. with a lower --lr)"
                                : "; no step had a finite loss";
  return Status::DataErr(msg);
}

std::string MetricsSink::Summary(double predicted, const std::string& priced_for) const {
  if (total_steps_ == 0 && have_eval_) {  // --steps 0: a checkpoint evaluated
    return "evaluated the weights after step " + std::to_string(steps_done_ - 1) + ": eval loss " +
           Fixed(eval_loss_, 4);
  }
  if (steps_done_ == 0 || step_seconds_sum_ <= 0) return "";
  return "trained " + std::to_string(steps_done_) + " steps: final loss " + Fixed(last_loss_, 4) +
         (have_eval_ ? ", eval loss " + Fixed(eval_loss_, 4) : std::string()) + ", " +
         Fixed(tokens_sum_ / step_seconds_sum_, 0) + " tokens/s" +
         (first_step_ > 0 ? " over the " + std::to_string(steps_done_ - static_cast<uint64_t>(first_step_)) +
                                " steps of this run (resumed after step " + std::to_string(first_step_ - 1) + ")"
                          : std::string()) +
         Compared(predicted, priced_for);
}

std::string MetricsSink::Compared(double predicted, const std::string& priced_for) const {
  if (!(predicted > 0) || recent_step_seconds_.empty()) return "";
  std::vector<double> v(recent_step_seconds_.begin(), recent_step_seconds_.end());
  std::sort(v.begin(), v.end());
  const double measured = v[v.size() / 2];
  const std::string step = "; a step " + Fixed(measured, 4) + " s measured (median of the last " +
                           std::to_string(v.size()) + ")";
  if (!priced_for.empty()) return step + "; ob-plan's " + Fixed(predicted, 4) + " s was for " + priced_for;
  return step + " vs " + Fixed(predicted, 4) + " s predicted by ob-plan (" + Fixed(measured / predicted, 2) + "x)";
}

}  // namespace ob::launch
