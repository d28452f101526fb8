// lockstep's Store over a c10d::Store. c10d's blocking calls wait up to the
// c10d store's own timeout; lockstep's wait up to this adapter's, so every
// blocking call sets the c10d timeout from ours first. c10d reports its
// timeouts as c10::DistStoreError; lockstep's callers expect TimeoutError.
#include "c10d_store.h"

#include <string>

#include <c10/util/Exception.h>

#include "lockstep/error.h"
#include "torch_compat.h"

namespace lockstep_torch {
namespace {

std::vector<std::uint8_t> bytes_of(std::string_view text) { return {text.begin(), text.end()}; }
std::string text_of(const std::vector<std::uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

// Runs a blocking c10d call, turning its timeout into lockstep's.
template <typename Call>
auto translate_timeout(std::string_view what, Call&& call) {
  try {
    return call();
  } catch (const c10::DistStoreError& e) {
    const std::string message = e.what_without_backtrace();
    if (message.find("imeout") != std::string::npos || message.find("imed out") != std::string::npos)
      throw lockstep::TimeoutError(std::string("store: ") + std::string(what) + ": " + message);
    throw lockstep::Error(std::string("store: ") + std::string(what) + ": " + message);
  } catch (const c10::Error& e) {
    throw lockstep::Error(std::string("store: ") + std::string(what) + ": " + e.what_without_backtrace());
  }
}

}  // namespace

C10dStore::C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {
  set_timeout(std::chrono::duration_cast<lockstep::Duration>(store_->getTimeout()));
}

void C10dStore::set(std::string_view key, std::string_view value) {
  translate_timeout("set", [&] { store_->set(std::string(key), bytes_of(value)); return 0; });
}

std::string C10dStore::get(std::string_view key) {
  return translate_timeout("get " + std::string(key), [&] {
    store_->setTimeout(timeout());
    return text_of(store_->get(std::string(key)));
  });
}

std::int64_t C10dStore::add(std::string_view key, std::int64_t delta) {
  return translate_timeout("add", [&] { return store_->add(std::string(key), delta); });
}

// c10d's compareSet returns `expected` for a missing key with a non-empty
// expectation; lockstep's contract is the value held afterwards ("" when
// still missing), so that case is answered without asking.
std::string C10dStore::compare_set(std::string_view key, std::string_view expected, std::string_view desired) {
  return translate_timeout("compare_set", [&] {
    const std::string k(key);
    if (!expected.empty() && !store_->check({k})) return std::string();
    return text_of(store_->compareSet(k, bytes_of(expected), bytes_of(desired)));
  });
}

void C10dStore::wait(const std::vector<std::string>& keys, lockstep::Duration timeout) {
  translate_timeout("wait", [&] { store_->wait(keys, timeout); return 0; });
}

bool C10dStore::check(const std::vector<std::string>& keys) {
  return translate_timeout("check", [&] { return store_->check(keys); });
}

bool C10dStore::delete_key(std::string_view key) {
  return translate_timeout("delete_key", [&] { return store_->deleteKey(std::string(key)); });
}

std::int64_t C10dStore::num_keys() {
  return translate_timeout("num_keys", [&] { return store_->getNumKeys(); });
}

// A store that cannot clone (c10d's default throws) is shared: its calls
// are serialized, which only delays the watchdog behind a blocking get.
std::shared_ptr<lockstep::Store> C10dStore::clone() const {
  auto cloned = std::make_shared<C10dStore>(clone_or_share(store_));
  cloned->set_timeout(timeout());
  return cloned;
}

}  // namespace lockstep_torch
