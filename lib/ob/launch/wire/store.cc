// The Store operations as StoreRequest/StoreReply messages (store.h).
#include "ob/launch/wire/store.h"

#include <algorithm>

#include "ob/control.pb.h"

namespace ob::launch {
namespace {

int64_t WaitMs(Store::Timeout t) {
  // c10d's "no timeout" (0) still ends: every wait is bounded.
  return t.count() <= 0 ? kMaxStoreWaitMs : std::min<int64_t>(t.count(), kMaxStoreWaitMs);
}

std::string Show(const std::string& key) {
  return key.size() <= 64 ? "'" + key + "'" : "'" + key.substr(0, 64) + "...'";
}

}  // namespace

Status CheckStoreKey(const std::string& key) {
  if (key.size() > kMaxStoreKeyBytes) {
    return Status::DataErr("store key " + Show(key) + " is " + std::to_string(key.size()) +
                           " bytes, over the " + std::to_string(kMaxStoreKeyBytes) + "-byte limit");
  }
  return Status::Ok();
}

Status CheckStoreValue(const std::string& key, const std::string& value) {
  OB_RETURN_IF_ERROR(CheckStoreKey(key));
  if (value.size() > kMaxStoreValueBytes) {
    return Status::DataErr("store value for " + Show(key) + " is " + std::to_string(value.size()) +
                           " bytes, over the " + std::to_string(kMaxStoreValueBytes >> 20) +
                           " MiB limit");
  }
  return Status::Ok();
}

Status StoreReplyStatus(const pb::StoreReply& reply) {
  if (reply.code() == 0) return Status::Ok();
  Code code = Code::kSoftware;
  for (Code c : {Code::kNo, Code::kUsage, Code::kDataErr, Code::kNoInput, Code::kUnavailable,
                 Code::kSoftware, Code::kIoErr, Code::kTempFail, Code::kConfig}) {
    if (reply.code() == static_cast<int>(c)) code = c;
  }
  return Status(code, reply.error().empty() ? "store request failed" : reply.error());
}

Status RequestStore::Set(const std::string& key, const std::string& value) {
  OB_RETURN_IF_ERROR(CheckStoreValue(key, value));
  pb::StoreRequest r;
  r.set_op(pb::STORE_SET);
  r.add_keys(key);
  r.set_value(value);
  OB_ASSIGN_OR_RETURN(pb::StoreReply reply, Call(r, Timeout(0)));
  return StoreReplyStatus(reply);
}

Result<std::string> RequestStore::Get(const std::string& key, Timeout timeout) {
  OB_RETURN_IF_ERROR(CheckStoreKey(key));
  pb::StoreRequest r;
  r.set_op(pb::STORE_GET);
  r.add_keys(key);
  r.set_timeout_ms(WaitMs(timeout));
  OB_ASSIGN_OR_RETURN(pb::StoreReply reply, Call(r, Timeout(r.timeout_ms())));
  OB_RETURN_IF_ERROR(StoreReplyStatus(reply));
  return std::move(*reply.mutable_value());
}

Result<int64_t> RequestStore::Add(const std::string& key, int64_t delta) {
  OB_RETURN_IF_ERROR(CheckStoreKey(key));
  pb::StoreRequest r;
  r.set_op(pb::STORE_ADD);
  r.add_keys(key);
  r.set_delta(delta);
  OB_ASSIGN_OR_RETURN(pb::StoreReply reply, Call(r, Timeout(0)));
  OB_RETURN_IF_ERROR(StoreReplyStatus(reply));
  return reply.number();
}

Result<std::string> RequestStore::CompareSet(const std::string& key, const std::string& expected,
                                             const std::string& desired) {
  OB_RETURN_IF_ERROR(CheckStoreValue(key, desired));
  OB_RETURN_IF_ERROR(CheckStoreValue(key, expected));
  pb::StoreRequest r;
  r.set_op(pb::STORE_COMPARE_SET);
  r.add_keys(key);
  r.set_expected(expected);
  r.set_value(desired);
  OB_ASSIGN_OR_RETURN(pb::StoreReply reply, Call(r, Timeout(0)));
  OB_RETURN_IF_ERROR(StoreReplyStatus(reply));
  return std::move(*reply.mutable_value());
}

Result<bool> RequestStore::Check(const std::vector<std::string>& keys) {
  if (keys.size() > kMaxStoreKeysPerRequest) return Status::DataErr("store check: too many keys");
  pb::StoreRequest r;
  r.set_op(pb::STORE_CHECK);
  for (const auto& k : keys) {
    OB_RETURN_IF_ERROR(CheckStoreKey(k));
    r.add_keys(k);
  }
  OB_ASSIGN_OR_RETURN(pb::StoreReply reply, Call(r, Timeout(0)));
  OB_RETURN_IF_ERROR(StoreReplyStatus(reply));
  return reply.number() != 0;
}

Status RequestStore::Wait(const std::vector<std::string>& keys, Timeout timeout) {
  if (keys.size() > kMaxStoreKeysPerRequest) return Status::DataErr("store wait: too many keys");
  pb::StoreRequest r;
  r.set_op(pb::STORE_WAIT);
  for (const auto& k : keys) {
    OB_RETURN_IF_ERROR(CheckStoreKey(k));
    r.add_keys(k);
  }
  r.set_timeout_ms(WaitMs(timeout));
  OB_ASSIGN_OR_RETURN(pb::StoreReply reply, Call(r, Timeout(r.timeout_ms())));
  return StoreReplyStatus(reply);
}

Result<bool> RequestStore::DeleteKey(const std::string& key) {
  OB_RETURN_IF_ERROR(CheckStoreKey(key));
  pb::StoreRequest r;
  r.set_op(pb::STORE_DELETE);
  r.add_keys(key);
  OB_ASSIGN_OR_RETURN(pb::StoreReply reply, Call(r, Timeout(0)));
  OB_RETURN_IF_ERROR(StoreReplyStatus(reply));
  return reply.number() != 0;
}

Result<int64_t> RequestStore::NumKeys() {
  pb::StoreRequest r;
  r.set_op(pb::STORE_NUM_KEYS);
  OB_ASSIGN_OR_RETURN(pb::StoreReply reply, Call(r, Timeout(0)));
  OB_RETURN_IF_ERROR(StoreReplyStatus(reply));
  return reply.number();
}

}  // namespace ob::launch
