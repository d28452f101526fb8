// The data operations every store shares: a map from key to bytes with the
// Store contract's semantics (add on integers, compare_set). Not thread-safe:
// each store guards it with its own lock or event loop.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep {

class KeyValueMap {
 public:
  void set(std::string_view key, std::string_view value) { map_.insert_or_assign(std::string(key), std::string(value)); }
  std::optional<std::string> get(std::string_view key) const;
  // Throws InvalidArgument if the key holds something that is not an integer,
  // or if the sum does not fit in 64 bits (the key is left unchanged).
  std::int64_t add(std::string_view key, std::int64_t delta);
  std::string compare_set(std::string_view key, std::string_view expected, std::string_view desired);
  bool erase(std::string_view key);
  bool contains(std::string_view key) const { return map_.find(key) != map_.end(); }
  std::vector<std::string> missing(const std::vector<std::string>& keys) const;
  std::int64_t size() const { return static_cast<std::int64_t>(map_.size()); }

 private:
  std::map<std::string, std::string, std::less<>> map_;
};

// "'a', 'b'" for error messages.
std::string quote_keys(const std::vector<std::string>& keys);

}  // namespace lockstep
