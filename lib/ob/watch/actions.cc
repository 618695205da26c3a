#include "ob/watch/actions.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include <google/protobuf/util/json_util.h>

#include "ob/control.pb.h"
#include "ob/io/file.h"
#include "ob/watch/events.h"

namespace ob::watch {
namespace {

// Request lines are single lines: the reason must not break them.
std::string OneLine(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace

bool ActionPolicy::Cooling(const std::string& target, int64_t now_ms) {
  auto it = last_action_ms_.find(target);
  if (it == last_action_ms_.end() || now_ms - it->second >= o_.cooldown_s * 1000) return false;
  why_not_ = (target.empty() ? std::string("the job") : target) + " is cooling down (" +
             FormatDouble(std::round((o_.cooldown_s * 1000 - (now_ms - it->second)) / 100) / 10) +
             " s left)";
  return true;
}

std::optional<ActionRequest> ActionPolicy::Consider(const pb::Event& e, int64_t now_ms) {
  why_not_.clear();
  ActionRequest r;
  r.cause = e;
  const std::string reason = std::string(KindName(e.kind())) + ": " + e.message();
  switch (e.kind()) {
    case pb::EVENT_HANG: {
      if (e.rank() < 0 || e.host().empty()) {
        why_not_ = "a job-wide stall names no host to exclude";
        return std::nullopt;
      }
      // A hang the master judged (and recovered from) counts like a crash.
      const auto it = e.evidence().find("host_hang_generations");
      if (it != e.evidence().end()) {
        r.confirmations = static_cast<int>(it->second);
        if (r.confirmations < o_.confirm) {
          why_not_ = "hang in " + std::to_string(r.confirmations) + " of " + std::to_string(o_.confirm) +
                     " generations on " + e.host() + " (the master recovers from a single hang itself)";
          return std::nullopt;
        }
      }
      r.verb = "exclude";
      r.target = e.host();
      break;
    }
    case pb::EVENT_STRAGGLER: {
      if (e.generation() != straggle_generation_) {
        straggles_.clear();  // a new generation: a new layout, fresh evidence
        straggle_generation_ = e.generation();
      }
      auto& steps = straggles_[e.host()];
      steps.push_back(e.step());
      r.confirmations = static_cast<int>(steps.size());
      if (r.confirmations < o_.confirm) {
        why_not_ = "straggler event " + std::to_string(r.confirmations) + " of " +
                   std::to_string(o_.confirm) + " for " + e.host();
        return std::nullopt;
      }
      r.verb = "exclude";
      r.target = e.host();
      break;
    }
    case pb::EVENT_CRASH: {
      const auto it = e.evidence().find("host_crash_generations");
      r.confirmations = it == e.evidence().end() ? 1 : static_cast<int>(it->second);
      if (r.confirmations < o_.confirm) {
        why_not_ = "crash in " + std::to_string(r.confirmations) + " of " +
                   std::to_string(o_.confirm) + " generations on " + e.host() +
                   " (the master recovers from a single crash itself)";
        return std::nullopt;
      }
      r.verb = "exclude";
      r.target = e.host();
      break;
    }
    case pb::EVENT_LOSS_NAN:
      r.verb = "rollback";
      break;
    case pb::EVENT_MEMORY_GROWTH:
      r.verb = "checkpoint";
      break;
    default:
      return std::nullopt;
  }
  if (Cooling(r.verb == "exclude" ? r.target : "", now_ms)) return std::nullopt;
  last_action_ms_[r.verb == "exclude" ? r.target : ""] = now_ms;
  if (r.verb == "exclude") {
    straggles_.erase(r.target);
    // A straggler is slow, not gone: the master weighs its slowdown against
    // running without it (slow=RATIO) and may keep it.
    std::string slow;
    const auto ratio = e.evidence().find("ratio");
    if (e.kind() == pb::EVENT_STRAGGLER && ratio != e.evidence().end() && ratio->second >= 1)
      slow = "slow=" + FormatDouble(std::round(ratio->second * 100) / 100) + " ";
    r.line = OneLine("exclude " + r.target + " " + slow + reason);
  } else {
    r.line = OneLine(r.verb + " " + reason);
  }
  // For the run the evidence came from: a master of another run refuses it.
  if (!e.run().empty()) {
    std::string run = OneLine(e.run()).substr(0, 64);
    for (char& c : run)
      if (c == ' ' || c == '\t') c = '_';  // one word
    r.line = "run=" + run + " " + r.line;
  }
  return r;
}

Result<ActionAnswer> SendControlRequest(const std::string& path, const std::string& line,
                                        double timeout_s) {
  sockaddr_un addr{};
  if (path.size() >= sizeof addr.sun_path)
    return Status::Usage(path + ": too long for a unix socket path");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Unavailable(path + ": socket: " + std::strerror(errno));
  auto fail = [&](const std::string& what) {
    const std::string m = path + ": " + what;
    ::close(fd);
    return Status::Unavailable(m);
  };
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    return fail(std::string("cannot connect: ") + std::strerror(errno));
  const std::string out = line + "\n";
  size_t off = 0;
  while (off < out.size()) {
    const ssize_t n = ::send(fd, out.data() + off, out.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(std::string("cannot send: ") + std::strerror(errno));
    off += static_cast<size_t>(n);
  }
  std::string in;
  const io::ReadEnd end = io::ReadFor(fd, static_cast<int64_t>(timeout_s * 1000), 1 << 20, &in,
                                      [](const std::string& s) { return s.find('\n') != std::string::npos; });
  switch (end) {
    case io::ReadEnd::kDone:
      break;
    case io::ReadEnd::kTimeout:
      return fail("no answer within " + FormatDouble(timeout_s) + " s");
    case io::ReadEnd::kEof:
      return fail("closed without answering");
    case io::ReadEnd::kTooLong:
      return fail("answer line too long");
    case io::ReadEnd::kError:
      return fail(std::string("cannot read the answer: ") + std::strerror(errno));
  }
  ::close(fd);
  ActionAnswer a;
  a.line = in.substr(0, in.find('\n'));
  if (!a.line.empty() && a.line.back() == '\r') a.line.pop_back();
  pb::OperatorResponse resp;
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = true;
  if (!google::protobuf::util::JsonStringToMessage(a.line, &resp, opts).ok())
    return Status::Unavailable(path + ": the answer is not an OperatorResponse: " + a.line.substr(0, 200));
  a.ok = resp.ok();
  a.error = resp.error();
  return a;
}

pb::Event ActionEvent(const ActionRequest& request, const ActionAnswer* answer, int64_t now_ms) {
  const pb::Event& c = request.cause;
  std::string what = request.verb == "exclude" ? "exclude host " + request.target : request.verb;
  std::string msg;
  if (answer == nullptr) {
    msg = "would ask the master to " + what + " (dry run) after " + KindName(c.kind()) + ": " + c.message();
  } else {
    msg = "asked the master to " + what + " after " + KindName(c.kind()) + ": " + c.message() +
          (answer->ok ? "; done" : "; refused: " + answer->error);
  }
  pb::Event e = MakeEvent(pb::EVENT_ACTION,
                          answer != nullptr && !answer->ok ? pb::SEVERITY_CRITICAL : pb::SEVERITY_WARNING,
                          request.verb == "exclude" ? request.target : c.host(), c.rank(), c.step(),
                          c.generation(), now_ms, OneLine(msg));
  *e.mutable_evidence() = c.evidence();
  auto& ev = *e.mutable_evidence();
  ev["cause_kind"] = c.kind();
  ev["confirmations"] = request.confirmations;
  ev["ok"] = answer == nullptr ? -1 : (answer->ok ? 1 : 0);
  e.set_run(c.run());
  e.set_request(request.line);
  if (answer != nullptr) e.set_response(answer->line);
  return e;
}

}  // namespace ob::watch
