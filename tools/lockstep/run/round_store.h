// The ranks' store of one round when the launchers meet in etcd
// (--rdzv-backend etcd). The launchers' own keys (rendezvous, heartbeats,
// failures) live in etcd, but lockstep's ranks exchange addresses through a
// TcpStore (LOCKSTEP_STORE_ADDR/PORT): node 0 of each round hosts one, as
// torchrun's agent of group rank 0 hosts the workers' store, and says where
// through etcd. A round whose node 0 dies takes its store along; the next
// round's node 0, a survivor, hosts a fresh one. Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/clock.h"
#include "lockstep/store.h"
#include "run/elastic_rendezvous.h"

namespace lockstep::cli {

struct RoundStore {
  std::string host;
  int port = 0;
  std::string token;
  std::unique_ptr<TcpStoreServer> server;  // node 0 of the round only
};

// Node 0 of `round` listens on every address at a free port, with
// `user_token` (LOCKSTEP_STORE_TOKEN) or a fresh random token, and publishes
// "<host> <port> <token>" under launcher/<round>/rank_store in `control`
// (whose members only the job's launchers reach: etcd's TLS and users
// guard it); `host` is how the other nodes reach this one. The others wait
// for that key until `deadline` (ConfigError past it; Interrupted on a
// signal).
RoundStore open_round_store(Store& control, const Round& round, const std::string& host,
                            const std::optional<std::string>& user_token, Deadline deadline, int signal_fd);

// Sets `key` in the round's store, where its ranks read what their
// launchers say (launcher_stop_key); best effort within a second: a store
// whose host has gone has no ranks left to tell.
void tell_round_ranks(const RoundStore& store, const std::string& key, const std::string& value);
// The same, but the value replaces one already there (a lost node's last
// start, which moves on with each of its generations).
void update_round_ranks(const RoundStore& store, const std::string& key, const std::string& value);
// The same for a count the ranks read with add(key, 0) (launcher_starts_key):
// it only grows, so that two launchers telling of the same rank's starts
// (a node and the one taking its place) never lower it.
void raise_round_count(const RoundStore& store, const std::string& key, std::int64_t count);

// Whether `key` is set in the round's store, where its ranks tell their
// launchers something (launcher_dropped_key); false if it does not answer
// within a second.
bool round_store_has(const RoundStore& store, const std::string& key);

}  // namespace lockstep::cli
