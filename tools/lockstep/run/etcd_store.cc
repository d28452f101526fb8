// EtcdStore: lockstep's Store on etcd, through EtcdClient; see
// etcd_store.h. In two parts: the job's lease; the Store's operations as
// etcd requests (ranges, puts and transactions on the keys under the
// prefix).
#include "run/etcd_store.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "common/clock.h"
#include "common/env.h"
#include "lockstep/error.h"
#include "run/base64.h"
#include "store/store_errors.h"

namespace lockstep::cli {
namespace {

using Json = EtcdClient::Json;

// etcd's default limit on the operations of one transaction (--max-txn-ops).
constexpr std::size_t kEtcdMaxTxnOps = 128;

void check_etcd_options(const EtcdOptions& o) {
  if (o.endpoints.empty()) throw ConfigError("etcd store: no endpoint given (--rdzv-endpoint host:port,...)");
  if (o.prefix.empty() || o.prefix.back() != '/')
    throw ConfigError(fmt::format("etcd store: the key prefix '{}' must end with '/', so that no job's keys "
                                  "fall under another job's prefix",
                                  o.prefix));
  if (o.request_timeout <= Duration(0)) throw ConfigError("etcd store: the request timeout must be positive");
  if (o.lease_ttl < Duration(0)) throw ConfigError("etcd store: the lease's time to live cannot be negative");
  if (!o.https && (!o.cacert.empty() || !o.cert.empty() || !o.key.empty()))
    throw ConfigError("--rdzv-conf cacert=, cert= and key= are for TLS: add protocol=https to --rdzv-conf, or "
                      "https:// to the endpoints");
  if (!o.key.empty() && o.cert.empty())
    throw ConfigError("--rdzv-conf key= needs cert=, the client certificate of that key");
  for (const auto& [name, path] : {std::pair{"cacert", &o.cacert}, {"cert", &o.cert}, {"key", &o.key}})
    if (!path->empty() && !std::filesystem::exists(*path))
      throw ConfigError(fmt::format("--rdzv-conf {}={}: no such file", name, *path));
  if (o.username.empty() && !o.password.empty())
    throw ConfigError("etcd store: a password without a user name (--rdzv-conf username=)");
}

// The end of etcd's range of every key that starts with `prefix`: the
// prefix with its last byte increased.
std::string etcd_range_end(std::string prefix) {
  while (!prefix.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(prefix.back());
    if (last < 0xff) {
      ++last;
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // etcd: every key
}

// The gateway writes 64-bit integers as JSON strings ("mod_revision":"5")
// and leaves out every field that holds zero, false or "".
std::int64_t etcd_int(const Json& object, const char* name) {
  const auto it = object.find(name);
  if (it == object.end()) return 0;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_string())
    if (const auto value = parse_int(it->get<std::string>())) return *value;
  throw Error(fmt::format("etcd's reply holds {}: {}, which is not an integer", name, it->dump()));
}

std::string etcd_bytes(const Json& object, const char* name) {
  const auto it = object.find(name);
  if (it == object.end()) return {};
  const auto bytes = it->is_string() ? base64_decode(it->get<std::string>()) : std::nullopt;
  if (!bytes) throw Error(fmt::format("etcd's reply holds {}: {}, which is not base64", name, it->dump()));
  return *bytes;
}

const Json& etcd_field(const Json& object, const char* name) {
  const auto it = object.find(name);
  if (it == object.end()) throw Error(fmt::format("etcd's reply {} lacks the field '{}'", object.dump(), name));
  return *it;
}

// A key as a range reply shows it.
struct EtcdKeyValue {
  bool exists = false;
  std::string value;
  std::int64_t mod_revision = 0;  // 0: missing, as etcd compares a missing key
};

EtcdKeyValue etcd_first_key_value(const Json& range_reply) {
  EtcdKeyValue kv;
  const auto kvs = range_reply.find("kvs");
  if (kvs == range_reply.end() || !kvs->is_array() || kvs->empty()) return kv;
  kv.exists = true;
  kv.value = etcd_bytes(kvs->front(), "value");
  kv.mod_revision = etcd_int(kvs->front(), "mod_revision");
  return kv;
}

// The range that ends a transaction's branch (see compare_set and add).
EtcdKeyValue etcd_txn_range_result(const Json& txn_reply) {
  const Json& responses = etcd_field(txn_reply, "responses");
  if (!responses.is_array() || responses.empty()) throw Error(fmt::format("etcd's reply {} has no responses", txn_reply.dump()));
  return etcd_first_key_value(etcd_field(responses.back(), "response_range"));
}

bool etcd_txn_succeeded(const Json& txn_reply) {
  const auto it = txn_reply.find("succeeded");  // left out when false
  return it != txn_reply.end() && it->is_boolean() && it->get<bool>();
}

Json etcd_put_fields(const std::string& key, std::string_view value, std::int64_t lease) {
  Json put = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  return put;
}

Json etcd_put_op(const std::string& key, std::string_view value, std::int64_t lease) {
  return {{"request_put", etcd_put_fields(key, value, lease)}};
}

Json etcd_range_op(const std::string& key, bool count_only = false) {
  Json range = {{"key", base64_encode(key)}};
  if (count_only) range["count_only"] = true;
  return {{"request_range", range}};
}

Json etcd_mod_revision_is(const std::string& key, std::int64_t revision) {
  return {{"key", base64_encode(key)}, {"target", "MOD"}, {"result", "EQUAL"}, {"mod_revision", std::to_string(revision)}};
}

Json etcd_is_missing(const std::string& key) {
  return {{"key", base64_encode(key)}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}};
}

Json etcd_value_is(const std::string& key, std::string_view value) {
  return {{"key", base64_encode(key)}, {"target", "VALUE"}, {"result", "EQUAL"}, {"value", base64_encode(value)}};
}

// Polls `look` until it returns true (true) or `deadline` passes (false):
// 10 ms between looks at first, growing to 100 ms.
bool etcd_poll_until(Deadline deadline, const std::function<bool()>& look) {
  Duration pause(10);
  for (;;) {
    if (look()) return true;
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(std::min(pause, deadline.remaining()));
    pause = std::min<Duration>(pause * 3 / 2, Duration(100));
  }
}

}  // namespace

struct EtcdStore::State {
  explicit State(const EtcdOptions& checked)
      : options(checked),
        range_end(etcd_range_end(options.prefix)),
        lease_key(options.prefix + "lease"),
        client(options) {}

  const EtcdOptions options;
  const std::string range_end;  // of the prefix
  const std::string lease_key;  // <prefix>lease: the job's lease id, in decimal

  std::mutex mutex;  // one request at a time (EtcdClient is not thread-safe); guards everything below
  EtcdClient client;
  std::int64_t lease = 0;  // the job's lease; 0: none (lease_ttl zero)
  Clock::time_point lease_refreshed;

  std::string key(std::string_view user_key) const { return options.prefix + std::string(user_key); }
  std::string endpoints_text() const { return client.endpoints_text(); }
  std::string name() const { return fmt::format("etcd at {} (keys under '{}')", endpoints_text(), options.prefix); }

  // The job's lease.
  bool keep_alive(std::int64_t id);
  std::int64_t grant_lease();
  void revoke_lease(std::int64_t id);
  void adopt_lease(std::int64_t stale);
  void refresh_lease_if_due();
  Json call(const std::string& path, const Json& body);
  Json put_on_lease(const std::string& path, const std::function<Json(std::int64_t lease)>& body);

  std::vector<std::string> missing(const std::vector<std::string>& keys);
};

// ---- The job's lease ----

// Whether etcd still keeps lease `id` (and now for another ttl).
bool EtcdStore::State::keep_alive(std::int64_t id) {
  // A stream in gRPC: the gateway answers each request object with
  // {"result": {"ID", "TTL"}}; TTL left out (zero) for a lease it lost.
  const Json reply = client.request("/v3/lease/keepalive", {{"ID", std::to_string(id)}});
  const auto result = reply.find("result");
  return etcd_int(result != reply.end() ? *result : reply, "TTL") > 0;
}

std::int64_t EtcdStore::State::grant_lease() {
  const auto ttl = std::max<std::int64_t>(1, std::chrono::ceil<std::chrono::seconds>(options.lease_ttl).count());
  const std::int64_t id = etcd_int(client.request("/v3/lease/grant", {{"TTL", ttl}}), "ID");
  if (id == 0) throw Error(fmt::format("etcd at {} granted a lease without an id", endpoints_text()));
  return id;
}

void EtcdStore::State::revoke_lease(std::int64_t id) {
  try {
    client.request("/v3/lease/revoke", {{"ID", std::to_string(id)}});
  } catch (const EtcdClient::LeaseGone&) {
  } catch (const Error&) {
    // It holds no key, and expires after its ttl anyway.
  }
}

// Reads <prefix>lease: a lease recorded there that etcd still keeps is the
// job's. Otherwise grants one and records it, on the condition that the
// record has not changed since it was read, so that clients that start
// together agree on one lease. `stale`: a lease known to be gone (0: none),
// whose record etcd may not have deleted yet.
void EtcdStore::State::adopt_lease(std::int64_t stale) {
  constexpr int kAttempts = 5;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    const EtcdKeyValue record =
        etcd_first_key_value(client.request("/v3/kv/range", {{"key", base64_encode(lease_key)}}));
    if (record.exists) {
      const auto recorded = parse_int(record.value);
      if (!recorded || *recorded <= 0)
        throw ConfigError(fmt::format("etcd at {}: the key '{}' holds '{}', not a lease id: another program writes "
                                      "under '{}'; give this job another --rdzv-id",
                                      endpoints_text(), lease_key, record.value, options.prefix));
      const Clock::time_point asked = Clock::now();
      if (*recorded != stale && keep_alive(*recorded)) {
        lease = *recorded;
        lease_refreshed = asked;
        return;
      }
    }
    const Clock::time_point asked = Clock::now();
    const std::int64_t granted = grant_lease();
    const Json txn = {{"compare", Json::array({etcd_mod_revision_is(lease_key, record.mod_revision)})},
                      {"success", Json::array({etcd_put_op(lease_key, std::to_string(granted), granted)})}};
    bool recorded = false;
    try {
      recorded = etcd_txn_succeeded(client.request("/v3/kv/txn", txn));
    } catch (const EtcdClient::LeaseGone&) {
      // Expired between the grant and the put: only with a ttl shorter than a request; try again.
    }
    if (recorded) {
      lease = granted;
      lease_refreshed = asked;
      return;
    }
    revoke_lease(granted);  // another client recorded its lease first: the next look adopts that one
  }
  throw Error(fmt::format("etcd at {}: the job's lease under '{}' changed {} times while this client tried to "
                          "adopt it",
                          endpoints_text(), lease_key, kAttempts));
}

// Every request refreshes the lease once a third of its ttl has passed
// since the last refresh, so the lease lives as long as any client of the
// job makes requests. A lease that expired all the same (every client
// silent for the ttl: etcd deleted the job's keys with it) is replaced:
// the store goes on working, its earlier keys gone, as for a job that
// starts anew; the rendezvous protocol above it sees its rounds vanish.
void EtcdStore::State::refresh_lease_if_due() {
  if (lease == 0 || Clock::now() - lease_refreshed < options.lease_ttl / 3) return;
  const Clock::time_point asked = Clock::now();
  if (keep_alive(lease)) {
    lease_refreshed = asked;
    return;
  }
  adopt_lease(lease);
}

Json EtcdStore::State::call(const std::string& path, const Json& body) {
  refresh_lease_if_due();
  return client.request(path, body);
}

// A request that puts keys, built for the current lease: put again on the
// new lease when the current one turns out to be gone.
Json EtcdStore::State::put_on_lease(const std::string& path, const std::function<Json(std::int64_t lease)>& body) {
  refresh_lease_if_due();
  try {
    return client.request(path, body(lease));
  } catch (const EtcdClient::LeaseGone&) {
    adopt_lease(lease);
  }
  try {
    return client.request(path, body(lease));
  } catch (const EtcdClient::LeaseGone&) {
    throw Error(fmt::format("etcd at {} lost the job's lease {} right after this client adopted it",
                            endpoints_text(), lease));
  }
}

// The keys that do not exist, from one transaction of count-only ranges
// per kEtcdMaxTxnOps keys.
std::vector<std::string> EtcdStore::State::missing(const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  for (std::size_t first = 0; first < keys.size(); first += kEtcdMaxTxnOps) {
    const std::size_t count = std::min(kEtcdMaxTxnOps, keys.size() - first);
    Json ranges = Json::array();
    for (std::size_t i = 0; i < count; ++i) ranges.push_back(etcd_range_op(key(keys[first + i]), /*count_only=*/true));
    const Json reply = call("/v3/kv/txn", {{"success", ranges}});
    const Json& responses = etcd_field(reply, "responses");
    if (!responses.is_array() || responses.size() != count)
      throw Error(fmt::format("etcd at {} answered {} ranges with {}", endpoints_text(), count, responses.dump()));
    for (std::size_t i = 0; i < count; ++i)
      if (etcd_int(etcd_field(responses[i], "response_range"), "count") == 0) out.push_back(keys[first + i]);
  }
  return out;
}

// ---- The Store ----

EtcdStore::EtcdStore(EtcdOptions options) {
  check_etcd_options(options);
  state_ = std::make_unique<State>(options);
  std::lock_guard lock(state_->mutex);
  if (state_->options.lease_ttl > Duration(0)) {
    state_->adopt_lease(0);
  } else {
    state_->client.request("/v3/kv/range", {{"key", base64_encode(state_->lease_key)}, {"count_only", true}});
  }
}

EtcdStore::~EtcdStore() = default;

void EtcdStore::set(std::string_view key, std::string_view value) {
  std::lock_guard lock(state_->mutex);
  const std::string full = state_->key(key);
  state_->put_on_lease("/v3/kv/put", [&](std::int64_t lease) { return etcd_put_fields(full, value, lease); });
}

std::string EtcdStore::get(std::string_view key) {
  const std::string full = state_->key(key);
  const Clock::time_point start = Clock::now();
  EtcdKeyValue kv;
  const bool found = etcd_poll_until(Deadline::starting_at(start, timeout()), [&] {
    std::lock_guard lock(state_->mutex);
    kv = etcd_first_key_value(state_->call("/v3/kv/range", {{"key", base64_encode(full)}}));
    return kv.exists;
  });
  if (!found)
    throw store_wait_timeout(state_->name(), {std::string(key)},
                             std::chrono::duration_cast<Duration>(Clock::now() - start));
  return kv.value;
}

// A transaction on the key's mod_revision: put the sum if nobody changed
// the key since it was read, else read it again (the failure branch) and
// retry. The first try assumes the key is missing, so that a new counter
// takes one round trip.
std::int64_t EtcdStore::add(std::string_view key, std::int64_t delta) {
  std::lock_guard lock(state_->mutex);
  const std::string full = state_->key(key);
  EtcdKeyValue seen;
  for (;;) {
    std::int64_t value = 0;
    if (seen.exists) {
      const auto parsed = parse_int(seen.value);
      if (!parsed)
        throw InvalidArgument(fmt::format("store add('{}'): the key holds '{}', which is not an integer; "
                                          "use a separate key for counters",
                                          key, seen.value));
      value = *parsed;
    }
    std::int64_t sum = 0;
    if (__builtin_add_overflow(value, delta, &sum))
      throw InvalidArgument(fmt::format("store add('{}', {}): the key holds {}, and the sum would overflow a 64-bit "
                                        "integer; the counter is left unchanged. Reset it with set() or use a "
                                        "new key",
                                        key, delta, value));
    const Json reply = state_->put_on_lease("/v3/kv/txn", [&](std::int64_t lease) {
      return Json{{"compare", Json::array({etcd_mod_revision_is(full, seen.mod_revision)})},
                  {"success", Json::array({etcd_put_op(full, std::to_string(sum), lease)})},
                  {"failure", Json::array({etcd_range_op(full)})}};
    });
    if (etcd_txn_succeeded(reply)) return sum;
    seen = etcd_txn_range_result(reply);
  }
}

// One transaction: compare, put `desired` and read the key back, or only
// read it. etcd's value comparison fails on a missing key whatever the
// value, so an empty `expected` is two: the key missing (one transaction),
// or holding "" (a second, on the mod_revision just seen).
std::string EtcdStore::compare_set(std::string_view key, std::string_view expected, std::string_view desired) {
  std::lock_guard lock(state_->mutex);
  const std::string full = state_->key(key);
  const auto put_if = [&](const Json& compare) {
    return etcd_txn_range_result(state_->put_on_lease("/v3/kv/txn", [&](std::int64_t lease) {
      return Json{{"compare", Json::array({compare})},
                  {"success", Json::array({etcd_put_op(full, desired, lease), etcd_range_op(full)})},
                  {"failure", Json::array({etcd_range_op(full)})}};
    }));
  };
  if (!expected.empty()) return put_if(etcd_value_is(full, expected)).value;
  const EtcdKeyValue after = put_if(etcd_is_missing(full));
  if (!after.exists || !after.value.empty() || desired.empty()) return after.value;
  return put_if(etcd_mod_revision_is(full, after.mod_revision)).value;
}

void EtcdStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  const Clock::time_point start = Clock::now();
  std::vector<std::string> missing;
  const bool all = etcd_poll_until(Deadline::starting_at(start, timeout), [&] {
    std::lock_guard lock(state_->mutex);
    missing = state_->missing(keys);
    return missing.empty();
  });
  if (!all)
    throw store_wait_timeout(state_->name(), missing, std::chrono::duration_cast<Duration>(Clock::now() - start));
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(state_->mutex);
  return state_->missing(keys).empty();
}

bool EtcdStore::delete_key(std::string_view key) {
  std::lock_guard lock(state_->mutex);
  return etcd_int(state_->call("/v3/kv/deleterange", {{"key", base64_encode(state_->key(key))}}), "deleted") > 0;
}

std::int64_t EtcdStore::num_keys() {
  std::lock_guard lock(state_->mutex);
  const Json range = {{"key", base64_encode(state_->options.prefix)},
                      {"range_end", base64_encode(state_->range_end)},
                      {"count_only", true}};
  return etcd_int(state_->call("/v3/kv/range", range), "count");
}

std::shared_ptr<Store> EtcdStore::clone() const {
  auto copy = std::make_shared<EtcdStore>(state_->options);
  copy->set_timeout(timeout());
  return copy;
}

std::string EtcdStore::advertised_address() const {
  std::lock_guard lock(state_->mutex);
  return state_->client.local_address();
}

bool EtcdStore::reachable(Duration within) {
  std::lock_guard lock(state_->mutex);
  return state_->client.reachable(within);
}

std::string EtcdStore::endpoints_text() const { return state_->endpoints_text(); }

}  // namespace lockstep::cli
