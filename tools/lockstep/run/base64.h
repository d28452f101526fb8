// Base64 (RFC 4648, with padding), as etcd's JSON gateway writes keys and
// values. Pure functions; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace lockstep::cli {

std::string base64_encode(std::string_view bytes);
// nullopt for text that is not padded base64 (a reply that is not etcd's).
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace lockstep::cli
