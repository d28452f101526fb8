// lockstep's Store interface on an etcd cluster (`lockstep run
// --rdzv-backend etcd`): the rendezvous of an elastic job then lives in
// etcd, which outlives any node of the job, instead of in node 0's launcher.
// Its requests go through EtcdClient (etcd_client.h): etcd's v3 HTTP/JSON
// gateway, failover across the members, TLS and authentication.
//
// Semantics, as every Store (include/lockstep/store.h):
//   add          a transaction on the key's mod_revision (or its absence),
//                retried when another client changed it in between
//   compare_set  one transaction: value == expected (or the key missing,
//                when expected is empty) -> put desired; either way the
//                value after it. A key that holds "" also matches an empty
//                expected: a second transaction, on its mod_revision.
//   get / wait   poll the keys until they exist or the timeout passes
//                (TimeoutError naming the missing keys)
// Every key is put under `prefix` (one job's keys under one directory) and
// attached to the job's lease: the first client of a prefix grants it (ttl
// `lease_ttl`) and records its id under <prefix>lease (a transaction on that
// record, so clients that start together agree on one); every client
// refreshes it on any request once a third of the ttl has passed since its
// last refresh, so a job whose launchers all died leaves nothing behind in
// etcd once the ttl passes. A lease that expired all the same (every client
// silent for the ttl) took the job's keys with it: the next request grants
// and records a new one and goes on, as for a job that starts anew.
//
// A request that no member answers within request_timeout x members is a
// TimeoutError (the cluster may come back: the caller decides how long to
// wait, reachable()); wrong credentials, TLS or an endpoint that is not
// etcd, a ConfigError (etcd_client.h). A write whose reply was lost may be
// applied twice: add() may then count one too many.
// Thread-safe: requests on one handle are serialised; clone() for a
// second connection (the heartbeat's thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/store.h"
#include "run/etcd_client.h"

namespace lockstep::cli {

class EtcdStore final : public Store {
 public:
  // Checks the options (ConfigError) and reaches one member (TimeoutError
  // when none answers within request_timeout x members; ConfigError when
  // one answers but refuses: credentials, TLS, not etcd).
  explicit EtcdStore(EtcdOptions options);
  ~EtcdStore() override;

  void set(std::string_view key, std::string_view value) override;
  std::string get(std::string_view key) override;
  std::int64_t add(std::string_view key, std::int64_t delta) override;
  std::string compare_set(std::string_view key, std::string_view expected, std::string_view desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  using Store::wait;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(std::string_view key) override;
  // Keys under the prefix (the lease's record included).
  std::int64_t num_keys() override;
  std::shared_ptr<Store> clone() const override;
  // This host's address on its connection to the member that answered last.
  std::string advertised_address() const override;

  // Waits up to `within` for any member to answer; false if none did.
  bool reachable(Duration within);
  // "a:2379,b:2379", for messages.
  std::string endpoints_text() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace lockstep::cli
