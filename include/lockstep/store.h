// The rendezvous key-value store ranks use to find each other and agree on
// small facts (addresses, world size, ready orders). Values are byte strings
// (std::string is used as a byte container; it may hold any bytes).
//
// Implementations:
//   TcpStore     client of a TcpStoreServer (hosted by the launcher or rank 0)
//   FileStore    a file on a filesystem every rank can see
//   HashStore    in-memory, for ranks that are threads of one process (tests)
//   PrefixStore  namespaces another store's keys
//
// Every implementation is thread-safe. Every blocking call waits at most the
// store's timeout (or the one given) and then throws TimeoutError.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/types.h"

namespace lockstep {

class Os;  // the system calls (private: src/common/os.h)

class Store {
 public:
  static constexpr Duration kDefaultTimeout = std::chrono::minutes(5);

  virtual ~Store() = default;

  virtual void set(std::string_view key, std::string_view value) = 0;
  // Waits up to timeout() for the key to exist, then returns its value.
  virtual std::string get(std::string_view key) = 0;
  // Adds `delta` to the integer stored under key (a missing key counts as 0)
  // and returns the new value. add(key, 0) reads a counter.
  virtual std::int64_t add(std::string_view key, std::int64_t delta) = 0;
  // Sets key to `desired` if it holds `expected`, or if it is missing and
  // `expected` is empty. Returns the value the key holds afterwards ("" if it
  // is still missing).
  virtual std::string compare_set(std::string_view key, std::string_view expected,
                                  std::string_view desired) = 0;
  // Waits until every key exists; throws TimeoutError naming the missing ones.
  virtual void wait(const std::vector<std::string>& keys, Duration timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  // True if every key exists now.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Returns whether the key existed.
  virtual bool delete_key(std::string_view key) = 0;
  virtual std::int64_t num_keys() = 0;

  // Another handle on the same data that does not share this one's
  // connection or locks, for a thread that must not wait behind another's
  // blocking request (the watchdog). Same timeout.
  virtual std::shared_ptr<Store> clone() const = 0;

  // An address of this host that the store's server can reach (so most
  // likely every other host can), for backends that must pick a listen
  // address; empty when the store cannot say (in-memory and file stores).
  virtual std::string advertised_address() const { return {}; }

  Duration timeout() const { return Duration(timeout_ms_.load()); }
  void set_timeout(Duration timeout) { timeout_ms_.store(timeout.count()); }

 private:
  std::atomic<std::int64_t> timeout_ms_{kDefaultTimeout.count()};
};

// In-memory store shared by threads of one process.
class HashStore final : public Store {
 public:
  HashStore();
  ~HashStore() override;

  void set(std::string_view key, std::string_view value) override;
  std::string get(std::string_view key) override;
  std::int64_t add(std::string_view key, std::int64_t delta) override;
  std::string compare_set(std::string_view key, std::string_view expected,
                          std::string_view desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  using Store::wait;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(std::string_view key) override;
  std::int64_t num_keys() override;
  std::shared_ptr<Store> clone() const override;

 private:
  struct State;
  std::shared_ptr<State> state_;  // shared by clones
};

// A store in one file that every participant can open (a local or shared
// filesystem). Operations append records under an exclusive file lock; readers
// replay the records they have not seen yet. Good for a few dozen processes.
class FileStore final : public Store {
 public:
  explicit FileStore(std::string path);
  ~FileStore() override;

  void set(std::string_view key, std::string_view value) override;
  std::string get(std::string_view key) override;
  std::int64_t add(std::string_view key, std::int64_t delta) override;
  std::string compare_set(std::string_view key, std::string_view expected,
                          std::string_view desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  using Store::wait;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(std::string_view key) override;
  std::int64_t num_keys() override;
  std::shared_ptr<Store> clone() const override;

  const std::string& path() const { return path_; }

 private:
  struct State;
  std::string path_;
  std::unique_ptr<State> state_;
};

// Prepends "<prefix>/" to every key of another store.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

  void set(std::string_view key, std::string_view value) override;
  std::string get(std::string_view key) override;
  std::int64_t add(std::string_view key, std::int64_t delta) override;
  std::string compare_set(std::string_view key, std::string_view expected,
                          std::string_view desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  using Store::wait;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(std::string_view key) override;
  std::int64_t num_keys() override;  // counts the base store's keys, all prefixes
  std::shared_ptr<Store> clone() const override;
  std::string advertised_address() const override { return base_->advertised_address(); }

  const std::shared_ptr<Store>& base() const { return base_; }
  const std::string& prefix() const { return prefix_; }

 private:
  std::string full(std::string_view key) const;
  std::vector<std::string> full(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> base_;
};

struct TcpStoreOptions {
  // Limits that keep a misbehaving client from making the server allocate
  // without bound. A request larger than this is refused and its connection
  // closed.
  std::size_t max_value_bytes = 64u << 20;
  std::size_t max_key_bytes = 4096;  // also the longest token
  // Server: the bytes it holds for all requests read but not yet answered,
  // together. A client whose request would go over it is disconnected, with
  // the reason in the server's log; while replies not yet taken by their
  // clients exceed it, the server answers nothing more. At least one
  // largest request (max_value_bytes + 2 x max_key_bytes + 64).
  std::size_t max_buffered_bytes = 256u << 20;
  // Server: open connections, authenticated or not. Over it the oldest
  // connection that has not authenticated is closed to make room; when
  // every one has, the new connection is refused with the reason.
  std::size_t max_clients = 16384;
  // Server: how long a connection may stay open without authenticating (a
  // lockstep client does so at once); then it is closed. So connections
  // nobody uses cannot pile up until real clients are refused.
  Duration auth_timeout = std::chrono::seconds(10);
  // Server: connections from one address that have not authenticated yet;
  // over it the oldest of them is closed. A client that authenticates at
  // once always gets in, however many idle connections another user of
  // the same host holds.
  std::size_t max_unauthenticated_per_address = 64;
  // Optional shared secret; clients must present the same token. Empty: none.
  std::string token;
  // How long a client keeps retrying to reach the server before giving up
  // with a ConfigError.
  Duration connect_timeout = std::chrono::seconds(60);
  Duration timeout = Store::kDefaultTimeout;
  // The system calls a client's or a server's socket I/O and clock go
  // through; null is the real ones. Tests inject faults here; it must
  // outlive the client or server.
  Os* os = nullptr;
};

// The server side of TcpStore: a single thread with an event loop serving any
// number of clients. Port 0 picks a free port (see port()).
class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& host, std::uint16_t port, TcpStoreOptions options = {});
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  std::uint16_t port() const;
  std::size_t num_clients() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// A client connection to a TcpStoreServer. Requests on one client are
// serialised; create several clients for concurrency.
class TcpStore final : public Store {
 public:
  TcpStore(const std::string& host, std::uint16_t port, TcpStoreOptions options = {});
  ~TcpStore() override;

  void set(std::string_view key, std::string_view value) override;
  std::string get(std::string_view key) override;
  std::int64_t add(std::string_view key, std::int64_t delta) override;
  std::string compare_set(std::string_view key, std::string_view expected,
                          std::string_view desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  using Store::wait;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(std::string_view key) override;
  std::int64_t num_keys() override;
  std::shared_ptr<Store> clone() const override;

  // The local address of the connection to the server: an address of this
  // host that the server's host can reach, used to pick a listen address.
  std::string local_address() const;
  std::string advertised_address() const override { return local_address(); }
  const std::string& host() const;
  std::uint16_t port() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace lockstep
