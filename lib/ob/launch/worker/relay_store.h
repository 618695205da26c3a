// RelayStore: ob's Store (store.h) as a c10d::Store, for process-group
// creation (compat::MakeProcessGroup: ProcessGroupGloo, ProcessGroupNCCL)
// and c10d::PrefixStore. In a worker it wraps the StoreClient its agent's
// socket gives it (store_client.h), so every rendezvous goes through the
// master's StoreServer over the authenticated control channel; tests wrap
// a ServerStore.
//
// Every operation ProcessGroupGloo and PrefixStore use is here: set, get
// (waiting up to the store's timeout, as c10d's do), add, compareSet,
// check, wait (both overloads; c10d's "no timeout" means the store's
// timeout here: nothing waits unbounded), deleteKey, getNumKeys.
//
// Thread-safety: as the wrapped Store (all of ob's are thread-safe).
// Ownership: shares the wrapped Store. Failure: c10d's contract is
// exceptions, so every failure throws c10::Error with the Status's
// one-line message (a timeout names the key it waited for).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ob/launch/wire/store.h"
#include "ob/torch_compat.h"

namespace ob::launch {

class RelayStore : public c10d::Store {
 public:
  RelayStore(std::shared_ptr<launch::Store> store, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  // A second handle on the same store. Declared without `override`: see
  // compat's note on c10d::Store::clone (torch_compat.h).
  virtual c10::intrusive_ptr<c10d::Store> clone();

 private:
  std::shared_ptr<launch::Store> store_;
};

}  // namespace ob::launch
