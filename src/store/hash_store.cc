// In-memory store for thread ranks. One mutex guards the map; waiters sleep
// on a condition variable that every write notifies. Thread-safe.
#include <condition_variable>
#include <mutex>

#include "lockstep/store.h"
#include "store/key_value_map.h"
#include "store/store_errors.h"

namespace lockstep {

struct HashStore::State {
  std::mutex mutex;
  std::condition_variable changed;
  KeyValueMap map;
};

HashStore::HashStore() : state_(std::make_shared<State>()) {}
HashStore::~HashStore() = default;

void HashStore::set(std::string_view key, std::string_view value) {
  std::lock_guard lock(state_->mutex);
  state_->map.set(key, value);
  state_->changed.notify_all();
}

std::string HashStore::get(std::string_view key) {
  const std::string k(key);
  wait({k});
  std::lock_guard lock(state_->mutex);
  return *state_->map.get(k);
}

std::int64_t HashStore::add(std::string_view key, std::int64_t delta) {
  std::lock_guard lock(state_->mutex);
  const auto v = state_->map.add(key, delta);
  state_->changed.notify_all();
  return v;
}

std::string HashStore::compare_set(std::string_view key, std::string_view expected,
                                   std::string_view desired) {
  std::lock_guard lock(state_->mutex);
  auto v = state_->map.compare_set(key, expected, desired);
  state_->changed.notify_all();
  return v;
}

void HashStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  std::unique_lock lock(state_->mutex);
  const bool all = state_->changed.wait_for(lock, timeout, [&] { return state_->map.missing(keys).empty(); });
  if (!all) throw store_wait_timeout("HashStore", state_->map.missing(keys), timeout);
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(state_->mutex);
  return state_->map.missing(keys).empty();
}

bool HashStore::delete_key(std::string_view key) {
  std::lock_guard lock(state_->mutex);
  return state_->map.erase(key);
}

std::shared_ptr<Store> HashStore::clone() const {
  auto copy = std::make_shared<HashStore>();
  copy->state_ = state_;
  copy->set_timeout(timeout());
  return copy;
}

std::int64_t HashStore::num_keys() {
  std::lock_guard lock(state_->mutex);
  return state_->map.size();
}

}  // namespace lockstep
