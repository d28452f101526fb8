#include "survival.h"

#include "lockstep/error.h"

namespace lockstep::torch::survival {

std::uint64_t shard_seed(std::uint64_t seed, std::uint64_t step, int shard) {
  std::uint64_t x = seed ^ (step * 0x9e3779b97f4a7c15ull) ^ (static_cast<std::uint64_t>(shard + 1) << 32);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return (x ^ (x >> 31)) & 0x7fffffffffffffffull;
}

std::vector<int> named_lost(const std::exception_ptr& failure, const ProcessGroup& group) {
  try {
    std::rethrow_exception(failure);
  } catch (const PeerError& e) {
    if (e.peer() == group.rank()) throw;
    if (e.peer() >= 0 && e.peer() < group.size()) return {e.peer()};
  } catch (const TimeoutError&) {
  }
  return {};
}

bool survived(const std::function<void()>& collective,
              const std::function<void(const std::exception_ptr&)>& recover) {
  std::exception_ptr failure;
  try {
    collective();
    return true;
  } catch (const PeerError&) {
    failure = std::current_exception();
  } catch (const TimeoutError&) {
    failure = std::current_exception();
  }
  recover(failure);
  return false;
}

std::optional<std::vector<int>> ReplacementLook::waiting(ProcessGroup& group) {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_) return std::nullopt;
  next_ = now + std::chrono::milliseconds(50);
  try {
    return group.replacements_waiting();
  } catch (const Error&) {
    return std::nullopt;
  }
}

}  // namespace lockstep::torch::survival
