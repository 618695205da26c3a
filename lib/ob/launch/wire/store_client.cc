#include "ob/launch/wire/store_client.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "ob/control.pb.h"

namespace ob::launch {
namespace {

using Clock = std::chrono::steady_clock;

int MsUntil(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

}  // namespace

Result<std::unique_ptr<StoreClient>> StoreClient::FromFd(int fd) {
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) {
    if (fd >= 0) ::close(fd);
    return Status::Config("store descriptor " + std::to_string(fd) + " is not a socket");
  }
  // Not for the worker's own children, and never a blocking read or write.
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return std::unique_ptr<StoreClient>(new StoreClient(fd));
}

Result<std::unique_ptr<StoreClient>> StoreClient::FromEnvironment() {
  const char* text = std::getenv("OB_STORE_FD");
  if (text == nullptr || *text == '\0') {
    return Status::Config("no $OB_STORE_FD: a worker is started by an ob-launch agent");
  }
  char* end = nullptr;
  const long fd = std::strtol(text, &end, 10);
  if (*end != '\0' || fd < 0 || fd > 1 << 20) {
    return Status::Config("$OB_STORE_FD: '" + std::string(text) + "' is not a descriptor");
  }
  return FromFd(static_cast<int>(fd));
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

void StoreClient::set_op_timeout(Timeout t) {
  std::lock_guard<std::mutex> lock(mu_);
  op_timeout_ = t;
}

Status StoreClient::WriteAll(const std::string& bytes, Clock::time_point deadline) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      const int wait = MsUntil(deadline);
      if (wait > 0 && ::poll(&p, 1, wait) >= 0) continue;
      broken_ = done > 0;  // half a frame sent: the stream is lost
      return Status::Unavailable("store: the agent takes no request (timed out)");
    }
    broken_ = true;
    return Status::Unavailable(std::string("store: cannot send to the agent: ") +
                               (n < 0 ? std::strerror(errno) : "closed"));
  }
  return Status::Ok();
}

Result<pb::StoreReply> StoreClient::Call(pb::StoreRequest& request, Timeout wait) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_) return Status::Unavailable("store: the connection to the agent is closed");
  const Clock::time_point deadline =
      Clock::now() + (wait.count() > 0 ? wait + std::chrono::milliseconds(kReplyGraceMs) : op_timeout_);
  const uint64_t id = next_id_++;
  pb::Control c;
  pb::StoreRequest* r = c.mutable_store_request();
  r->Swap(&request);
  r->set_id(id);
  r->set_client(0);  // the agent's to set
  std::string frame;
  AppendFrame(c, &frame);
  if (frame.size() - 4 > kMaxRelayFrameBytes) {
    return Status::DataErr("store request of " + std::to_string(frame.size() - 4) +
                           " bytes exceeds the " + std::to_string(kMaxRelayFrameBytes) +
                           "-byte relay limit");
  }
  OB_RETURN_IF_ERROR(WriteAll(frame, deadline));
  char buf[65536];
  for (;;) {
    for (size_t i = 0; i < pending_.size(); ++i) {
      if (pending_[i].has_store_reply() && pending_[i].store_reply().id() == id) {
        pb::StoreReply reply = std::move(*pending_[i].mutable_store_reply());
        pending_.erase(pending_.begin(), pending_.begin() + static_cast<long>(i) + 1);
        return reply;
      }
    }
    pending_.clear();  // replies to calls that gave up
    const int left = MsUntil(deadline);
    if (left <= 0) return Status::Unavailable("store: no reply from the agent in time");
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, left);
    if (ready < 0 && errno != EINTR) {
      broken_ = true;
      return Status::Unavailable(std::string("store: poll: ") + std::strerror(errno));
    }
    if (ready <= 0) continue;
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) {
      broken_ = true;
      return Status::Unavailable(n == 0 ? "store: the agent closed the connection"
                                        : std::string("store: read: ") + std::strerror(errno));
    }
    Status st = decoder_.Feed(buf, static_cast<size_t>(n), &pending_);
    if (!st.ok()) {
      broken_ = true;
      return Status::Unavailable("store: from the agent: " + st.message());
    }
  }
}

}  // namespace ob::launch
