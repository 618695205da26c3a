#include "ob/launch/worker/relay_store.h"

namespace ob::launch {
namespace {

std::string Text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> Bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// c10d reports failures by exception.
void ThrowIf(const Status& st) { TORCH_CHECK(st.ok(), st.message()); }
template <typename T>
T ValueOrThrow(Result<T> r) {
  ThrowIf(r.status());
  return std::move(r).value();
}

}  // namespace

RelayStore::RelayStore(std::shared_ptr<launch::Store> store, std::chrono::milliseconds timeout)
    : c10d::Store(timeout), store_(std::move(store)) {}

void RelayStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  ThrowIf(store_->Set(key, Text(value)));
}

std::vector<uint8_t> RelayStore::compareSet(const std::string& key,
                                            const std::vector<uint8_t>& expected,
                                            const std::vector<uint8_t>& desired) {
  return Bytes(ValueOrThrow(store_->CompareSet(key, Text(expected), Text(desired))));
}

std::vector<uint8_t> RelayStore::get(const std::string& key) {
  return Bytes(ValueOrThrow(store_->Get(key, timeout_)));
}

int64_t RelayStore::add(const std::string& key, int64_t value) {
  return ValueOrThrow(store_->Add(key, value));
}

bool RelayStore::deleteKey(const std::string& key) { return ValueOrThrow(store_->DeleteKey(key)); }

bool RelayStore::check(const std::vector<std::string>& keys) {
  return ValueOrThrow(store_->Check(keys));
}

int64_t RelayStore::getNumKeys() { return ValueOrThrow(store_->NumKeys()); }

void RelayStore::wait(const std::vector<std::string>& keys) { ThrowIf(store_->Wait(keys, timeout_)); }

void RelayStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  ThrowIf(store_->Wait(keys, timeout == kNoTimeout ? timeout_ : timeout));
}

c10::intrusive_ptr<c10d::Store> RelayStore::clone() {
  return c10::make_intrusive<RelayStore>(store_, timeout_);
}

}  // namespace ob::launch
