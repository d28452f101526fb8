// open_round_store; see round_store.h.
#include "run/round_store.h"

#include <memory>
#include <sstream>

#include <fmt/format.h>

#include "common/host.h"
#include "lockstep/error.h"
#include "run/interruption.h"

namespace lockstep::cli {

RoundStore open_round_store(Store& control, const Round& round, const std::string& host,
                            const std::optional<std::string>& user_token, Deadline deadline, int signal_fd) {
  const std::string key = fmt::format("launcher/{}/rank_store", round.number);
  RoundStore store;
  TcpStoreOptions options;
  if (round.node_rank == 0) {
    options.token = user_token.value_or(random_hex(16));
    store.server = std::make_unique<TcpStoreServer>("", 0, options);
    store.host = host;
    store.port = store.server->port();
    store.token = options.token;
    control.set(key, fmt::format("{} {} {}", store.host, store.port, store.token));
  } else {
    if (!wait_for_keys(control, {key}, deadline, signal_fd, "node 0 of the round to host the ranks' store"))
      throw ConfigError(fmt::format("node 0 of round {} did not say where the ranks' store is within the join "
                                    "timeout; is its launcher still running?",
                                    round.number));
    std::istringstream where(control.get(key));
    where >> store.host >> store.port >> store.token;
  }
  return store;
}

namespace {

// A connection to the round's store that gives up within a second.
std::unique_ptr<TcpStore> briefly_connected(const RoundStore& store) {
  TcpStoreOptions options;
  options.token = store.token;
  options.connect_timeout = std::chrono::seconds(1);
  options.timeout = std::chrono::seconds(1);
  return std::make_unique<TcpStore>(store.host, static_cast<std::uint16_t>(store.port), options);
}

}  // namespace

void tell_round_ranks(const RoundStore& store, const std::string& key, const std::string& value) {
  try {
    briefly_connected(store)->compare_set(key, "", value);
  } catch (const Error&) {
    // Its host is gone, and with it the ranks that would have read it.
  }
}

void update_round_ranks(const RoundStore& store, const std::string& key, const std::string& value) {
  try {
    briefly_connected(store)->set(key, value);
  } catch (const Error&) {
    // As tell_round_ranks.
  }
}

void raise_round_count(const RoundStore& store, const std::string& key, std::int64_t count) {
  try {
    const auto connection = briefly_connected(store);
    // compare_set against the count read: another launcher's raise in
    // between makes it fail, and the count is read again.
    for (std::int64_t held = connection->add(key, 0); held < count; held = connection->add(key, 0))
      connection->compare_set(key, std::to_string(held), std::to_string(count));
  } catch (const Error&) {
    // As tell_round_ranks.
  }
}

bool round_store_has(const RoundStore& store, const std::string& key) {
  try {
    return briefly_connected(store)->check({key});
  } catch (const Error&) {
    return false;
  }
}

}  // namespace lockstep::cli
