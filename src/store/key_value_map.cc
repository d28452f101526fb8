// Shared store semantics; see key_value_map.h. Not thread-safe.
#include "store/key_value_map.h"

#include <fmt/format.h>

#include "common/env.h"
#include "lockstep/error.h"

namespace lockstep {

std::optional<std::string> KeyValueMap::get(std::string_view key) const {
  auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  return it->second;
}

std::int64_t KeyValueMap::add(std::string_view key, std::int64_t delta) {
  auto it = map_.find(key);
  std::int64_t value = 0;
  if (it != map_.end()) {
    auto parsed = parse_int(it->second);
    if (!parsed)
      throw InvalidArgument(fmt::format("store add('{}'): the key holds '{}', which is not an integer; "
                                        "use a separate key for counters", key, it->second));
    value = *parsed;
  }
  // Checked: wrapping a counter around would hand out a duplicate or
  // negative value (and signed overflow is undefined behaviour).
  std::int64_t sum = 0;
  if (__builtin_add_overflow(value, delta, &sum))
    throw InvalidArgument(fmt::format("store add('{}', {}): the key holds {}, and the sum would overflow a 64-bit "
                                      "integer; the counter is left unchanged. Reset it with set() or use a "
                                      "new key", key, delta, value));
  set(key, std::to_string(sum));
  return sum;
}

std::string KeyValueMap::compare_set(std::string_view key, std::string_view expected,
                                     std::string_view desired) {
  auto it = map_.find(key);
  if ((it == map_.end() && expected.empty()) || (it != map_.end() && it->second == expected)) {
    set(key, desired);
    return std::string(desired);
  }
  return it == map_.end() ? std::string() : it->second;
}

bool KeyValueMap::erase(std::string_view key) {
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  map_.erase(it);
  return true;
}

std::vector<std::string> KeyValueMap::missing(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  for (const auto& k : keys)
    if (!contains(k)) out.push_back(k);
  return out;
}

std::string quote_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i == 8) {
      out += fmt::format(", ... ({} more)", keys.size() - 8);
      break;
    }
    out += fmt::format("{}'{}'", i ? ", " : "", keys[i]);
  }
  return out;
}

}  // namespace lockstep
