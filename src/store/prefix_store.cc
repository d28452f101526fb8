// Namespacing wrapper; as thread-safe as the store it wraps.
#include "lockstep/store.h"

namespace lockstep {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  set_timeout(base_->timeout());
}

std::string PrefixStore::full(std::string_view key) const { return prefix_ + "/" + std::string(key); }

std::vector<std::string> PrefixStore::full(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(full(k));
  return out;
}

void PrefixStore::set(std::string_view key, std::string_view value) { base_->set(full(key), value); }

std::string PrefixStore::get(std::string_view key) {
  base_->wait({full(key)}, timeout());
  return base_->get(full(key));
}

std::int64_t PrefixStore::add(std::string_view key, std::int64_t delta) { return base_->add(full(key), delta); }

std::string PrefixStore::compare_set(std::string_view key, std::string_view expected,
                                     std::string_view desired) {
  return base_->compare_set(full(key), expected, desired);
}

void PrefixStore::wait(const std::vector<std::string>& keys, Duration timeout) { base_->wait(full(keys), timeout); }

bool PrefixStore::check(const std::vector<std::string>& keys) { return base_->check(full(keys)); }

bool PrefixStore::delete_key(std::string_view key) { return base_->delete_key(full(key)); }

std::int64_t PrefixStore::num_keys() { return base_->num_keys(); }

std::shared_ptr<Store> PrefixStore::clone() const {
  auto copy = std::make_shared<PrefixStore>(prefix_, base_->clone());
  copy->set_timeout(timeout());
  return copy;
}

}  // namespace lockstep
