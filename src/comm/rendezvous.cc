// Group rendezvous; see rendezvous.h.
#include "comm/rendezvous.h"

#include <unistd.h>

#include <fstream>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/host.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

constexpr char kErrorKey[] = "rendezvous/error";

std::string host_key(int rank) { return fmt::format("rendezvous/host/{}", rank); }

[[noreturn]] void fail(Store& store, const std::string& message) {
  store.set(kErrorKey, message);
  throw ConfigError(message);
}

}  // namespace

std::string host_identity() {
  std::string boot_id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot_id);
  return fmt::format("{}/{}", host_name(), boot_id);
}

std::vector<std::string> rendezvous(Store& store, int rank, int world_size, Duration timeout,
                                    const std::string& host_id) {
  if (store.add(fmt::format("rendezvous/claims/{}", rank), 1) > 1)
    fail(store, fmt::format("two processes were started as rank {}; every rank needs a distinct RANK (or the store "
                            "still holds an earlier run's keys: give each run its own MASTER_PORT or LOCKSTEP_RUN_ID)",
                            rank));
  const std::string size_text = std::to_string(world_size);
  const std::string agreed = store.compare_set("rendezvous/world_size", "", size_text);
  if (agreed != size_text)
    fail(store, fmt::format("rank {} was started with world size {} but another rank registered world size {}; "
                            "every rank must get the same WORLD_SIZE",
                            rank, world_size, agreed));
  store.set(host_key(rank), host_id.empty() ? host_identity() : host_id);

  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(host_key(r));
  const Deadline deadline = Deadline::after(timeout);
  for (;;) {
    try {
      store.wait(keys, std::min<Duration>(deadline.remaining(), std::chrono::seconds(1)));
      break;
    } catch (const TimeoutError&) {
      if (store.check({kErrorKey})) throw ConfigError(store.get(kErrorKey));
      if (!deadline.expired()) continue;
      std::string missing;
      int count = 0;
      for (int r = 0; r < world_size; ++r) {
        if (store.check({host_key(r)})) continue;
        if (++count <= 16) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", r);
      }
      throw TimeoutError(fmt::format("rank {}: {} of {} ranks (rank(s) {}) did not join within {:.0f} s; were they "
                                     "started, with the same MASTER_ADDR/MASTER_PORT, and did they fail early?",
                                     rank, count, world_size, missing, static_cast<double>(timeout.count()) / 1000.0));
    }
  }
  std::vector<std::string> hosts;
  hosts.reserve(static_cast<std::size_t>(world_size));
  for (const auto& k : keys) hosts.push_back(store.get(k));
  return hosts;
}

}  // namespace lockstep
