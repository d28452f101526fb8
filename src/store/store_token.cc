// shared_store_token(); see store_token.h.
#include "store/store_token.h"

#include <cstdint>

#include <fmt/format.h>

namespace lockstep {
namespace {

// FNV-1a over the text, then a splitmix64 finaliser: the same on every
// node and platform. Not a cryptographic hash: the token is only as secret
// as the facts it comes from (see the header).
std::uint64_t digest(const std::string& text, std::uint64_t seed) {
  std::uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

}  // namespace

std::string shared_store_token(const std::optional<std::string>& user_token, const std::string& shared_facts) {
  if (user_token && !user_token->empty()) return *user_token;
  const std::string text = "lockstep-store/" + shared_facts;
  return fmt::format("{:016x}{:016x}", digest(text, 1), digest(text, 2));
}

}  // namespace lockstep
