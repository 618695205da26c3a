#include "ob/launch/wire/store_server.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>

#include "ob/clock.h"

namespace ob::launch {
namespace {

pb::StoreReply Refuse(const pb::StoreRequest& r, Code code, const std::string& why) {
  pb::StoreReply out;
  out.set_id(r.id());
  out.set_client(r.client());
  out.set_code(static_cast<int>(code));
  out.set_error(why);
  return out;
}

// Strict decimal, as Add writes it; false for anything else.
bool ParseInt(const std::string& text, int64_t* out) {
  if (text.empty() || text.size() > 20) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) return false;
  *out = v;
  return true;
}

std::string Quote(const std::string& key) {
  std::string out = "'";
  for (char c : key.substr(0, 64)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out + (key.size() > 64 ? "...'" : "'");
}

}  // namespace

void StoreServer::Handle(const pb::StoreRequest& request, int64_t now_ms, ReplyFn reply) {
  Ready ready;
  Execute(request, now_ms, std::move(reply), &ready);
  for (auto& [fn, r] : ready) fn(std::move(r));
}

void StoreServer::Execute(const pb::StoreRequest& r, int64_t now_ms, ReplyFn reply, Ready* ready) {
  auto refuse = [&](Code code, const std::string& why) {
    ready->emplace_back(std::move(reply), Refuse(r, code, why));
  };
  const int n = r.keys_size();
  switch (r.op()) {
    case pb::STORE_SET: case pb::STORE_GET: case pb::STORE_ADD: case pb::STORE_COMPARE_SET:
    case pb::STORE_DELETE:
      if (n != 1) return refuse(Code::kDataErr, "store request needs exactly one key");
      break;
    case pb::STORE_CHECK: case pb::STORE_WAIT:
      if (static_cast<size_t>(n) > limits_.max_keys_per_request) {
        return refuse(Code::kDataErr, "store request has " + std::to_string(n) + " keys, over the " +
                                          std::to_string(limits_.max_keys_per_request) + " limit");
      }
      break;
    case pb::STORE_NUM_KEYS:
      break;
    default:
      return refuse(Code::kDataErr, "unknown store operation " + std::to_string(r.op()));
  }
  for (const auto& k : r.keys()) {
    if (k.size() > limits_.max_key_bytes) {
      return refuse(Code::kDataErr, "store key of " + std::to_string(k.size()) + " bytes, over the " +
                                        std::to_string(limits_.max_key_bytes) + "-byte limit");
    }
  }
  if (r.value().size() > limits_.max_value_bytes || r.expected().size() > limits_.max_value_bytes) {
    return refuse(Code::kDataErr, "store value of " +
                                      std::to_string(std::max(r.value().size(), r.expected().size())) +
                                      " bytes for " + (n > 0 ? Quote(r.keys(0)) : "''") +
                                      ", over the " +
                                      std::to_string(limits_.max_value_bytes) + "-byte limit");
  }

  pb::StoreReply out;
  out.set_id(r.id());
  out.set_client(r.client());
  switch (r.op()) {
    case pb::STORE_SET: {
      Status st = Put(r.keys(0), r.value(), ready);
      if (!st.ok()) return refuse(st.code(), st.message());
      break;
    }
    case pb::STORE_GET:
    case pb::STORE_WAIT: {
      if (HasAll(r)) {
        ready->emplace_back(std::move(reply), Answer(r));
        return;
      }
      size_t bytes = 0;
      for (const auto& k : r.keys()) bytes += k.size() + kEntryOverhead;
      if (waiting_.size() >= limits_.max_waiters) {
        return refuse(Code::kDataErr, "the store holds " + std::to_string(waiting_.size()) +
                                          " waiting requests, its limit");
      }
      if (bytes_ + bytes > limits_.max_total_bytes) {
        return refuse(Code::kDataErr, "the store is full (" + std::to_string(bytes_) +
                                          " bytes held); cannot wait for more keys");
      }
      const int64_t wait = r.timeout_ms() <= 0 ? kMaxStoreWaitMs
                                               : std::min<int64_t>(r.timeout_ms(), kMaxStoreWaitMs);
      Waiter w;
      w.request.set_id(r.id());
      w.request.set_client(r.client());
      w.request.set_op(r.op());
      *w.request.mutable_keys() = r.keys();
      w.request.set_timeout_ms(wait);
      w.deadline_ms = now_ms + wait;
      w.bytes = bytes;
      w.reply = std::move(reply);
      bytes_ += bytes;
      waiting_.push_back(std::move(w));
      return;
    }
    case pb::STORE_ADD: {
      int64_t now = 0;
      auto it = data_.find(r.keys(0));
      if (it != data_.end() && !ParseInt(it->second, &now)) {
        return refuse(Code::kDataErr, "store add: " + Quote(r.keys(0)) + " does not hold a number");
      }
      if (__builtin_add_overflow(now, r.delta(), &now)) {
        return refuse(Code::kDataErr, "store add: " + Quote(r.keys(0)) + " would overflow");
      }
      Status st = Put(r.keys(0), std::to_string(now), ready);
      if (!st.ok()) return refuse(st.code(), st.message());
      out.set_number(now);
      break;
    }
    case pb::STORE_COMPARE_SET: {
      auto it = data_.find(r.keys(0));
      const bool absent = it == data_.end();
      if ((absent && r.expected().empty()) || (!absent && it->second == r.expected())) {
        Status st = Put(r.keys(0), r.value(), ready);
        if (!st.ok()) return refuse(st.code(), st.message());
        out.set_value(r.value());
      } else {
        out.set_value(absent ? r.expected() : it->second);
      }
      break;
    }
    case pb::STORE_CHECK:
      out.set_number(HasAll(r) ? 1 : 0);
      break;
    case pb::STORE_DELETE: {
      if (Erase(r.keys(0))) out.set_number(1);
      break;
    }
    case pb::STORE_NUM_KEYS:
      out.set_number(static_cast<int64_t>(data_.size()));
      break;
    default:
      break;
  }
  ready->emplace_back(std::move(reply), std::move(out));
}

Status StoreServer::Put(const std::string& key, std::string value, Ready* ready) {
  auto it = data_.find(key);
  const size_t before = it == data_.end() ? 0 : key.size() + it->second.size() + kEntryOverhead;
  const size_t after = key.size() + value.size() + kEntryOverhead;
  if (after > before && bytes_ - before + after > limits_.max_total_bytes) {
    return Status::DataErr("the store is full: " + std::to_string(bytes_) + " bytes held, " +
                           std::to_string(after) + " more for " + Quote(key) + " would pass the " +
                           std::to_string(limits_.max_total_bytes >> 20) + " MiB limit");
  }
  bytes_ = bytes_ - before + after;
  if (it != data_.end()) {
    it->second = std::move(value);
    if (on_change_) on_change_(key, &it->second);
    return Status::Ok();
  }
  it = data_.emplace(key, std::move(value)).first;
  if (on_change_) on_change_(key, &it->second);
  Wake(key, ready);
  return Status::Ok();
}

bool StoreServer::Erase(const std::string& key) {
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  bytes_ -= it->first.size() + it->second.size() + kEntryOverhead;
  data_.erase(it);
  if (on_change_) on_change_(key, nullptr);
  return true;
}

bool StoreServer::HasAll(const pb::StoreRequest& r) const {
  for (const auto& k : r.keys()) {
    if (data_.count(k) == 0) return false;
  }
  return true;
}

pb::StoreReply StoreServer::Answer(const pb::StoreRequest& r) const {
  pb::StoreReply out;
  out.set_id(r.id());
  out.set_client(r.client());
  if (r.op() == pb::STORE_GET) out.set_value(data_.at(r.keys(0)));
  return out;
}

void StoreServer::Wake(const std::string& key, Ready* ready) {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    const auto& keys = it->request.keys();
    if (std::find(keys.begin(), keys.end(), key) == keys.end() || !HasAll(it->request)) {
      ++it;
      continue;
    }
    ready->emplace_back(std::move(it->reply), Answer(it->request));
    bytes_ -= it->bytes;
    it = waiting_.erase(it);
  }
}

size_t StoreServer::Sweep(int64_t now_ms) {
  Ready ready;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (it->deadline_ms > now_ms) {
      ++it;
      continue;
    }
    std::string missing;
    for (const auto& k : it->request.keys()) {
      if (data_.count(k) == 0) {
        missing = k;
        break;
      }
    }
    ready.emplace_back(std::move(it->reply),
                       Refuse(it->request, Code::kUnavailable,
                              "store: timed out after " + std::to_string(it->request.timeout_ms()) +
                                  " ms waiting for key " + Quote(missing)));
    bytes_ -= it->bytes;
    it = waiting_.erase(it);
  }
  for (auto& [fn, r] : ready) fn(std::move(r));
  return ready.size();
}

Status StoreServer::Set(const std::string& key, const std::string& value) {
  pb::StoreRequest r;
  r.set_op(pb::STORE_SET);
  r.add_keys(key);
  r.set_value(value);
  Status result;
  Handle(r, 0, [&result](pb::StoreReply reply) { result = StoreReplyStatus(reply); });
  return result;
}

std::optional<std::string> StoreServer::Get(const std::string& key) const {
  auto it = data_.find(key);
  if (it == data_.end()) return std::nullopt;
  return it->second;
}

size_t StoreServer::ErasePrefix(const std::string& prefix) {
  size_t n = 0;
  auto it = data_.lower_bound(prefix);
  while (it != data_.end() && it->first.compare(0, prefix.size(), prefix) == 0) {
    bytes_ -= it->first.size() + it->second.size() + kEntryOverhead;
    if (on_change_) on_change_(it->first, nullptr);
    it = data_.erase(it);
    ++n;
  }
  return n;
}

// --- ServerStore -------------------------------------------------------------

Result<pb::StoreReply> ServerStore::Call(pb::StoreRequest& request, Timeout wait) {
  struct Slot {
    bool done = false;
    pb::StoreReply reply;
  };
  auto slot = std::make_shared<Slot>();
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t now = SteadyMs();
  server_.Handle(request, now, [this, slot](pb::StoreReply r) {
    slot->reply = std::move(r);
    slot->done = true;
    cv_.notify_all();  // under mu_: every caller of the server holds it
  });
  const auto deadline = std::chrono::steady_clock::now() + wait + std::chrono::milliseconds(2);
  while (!slot->done) {
    if (cv_.wait_until(lock, deadline) != std::cv_status::timeout) continue;
    server_.Sweep(SteadyMs());
    if (!slot->done) return Status::Unavailable("store: no reply within the timeout");
  }
  return std::move(slot->reply);
}

}  // namespace ob::launch
