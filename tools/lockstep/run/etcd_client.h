// EtcdClient: requests to an etcd cluster through its v3 HTTP/JSON gateway
// (POST /v3/kv/range, /v3/kv/put, /v3/kv/txn, /v3/kv/deleterange,
// /v3/lease/grant, /v3/lease/keepalive, /v3/auth/authenticate; keys and
// values base64 in the JSON), with libcurl for HTTP and TLS. etcd 3.4
// (Debian 12's) serves the gateway on its client port. EtcdStore
// (etcd_store.h) builds lockstep's Store on it.
//
// Several endpoints (the members of the cluster): a request goes to the
// member that answered last, and to the next one when that fails to answer
// within `request_timeout` or answers that it cannot serve now (no leader);
// the members are tried again after a pause until request_timeout x
// members have passed, then TimeoutError (the cluster may come back: the
// caller decides how long to wait, reachable()). A write whose reply was
// lost may be applied twice.
// Wrong credentials, a certificate either side rejects or an endpoint that
// is not etcd: ConfigError naming the cause and the fix. (etcd 3.4's
// gateway refuses every client certificate that carries a Common Name once
// authentication is on: a client certificate for it has none.)
// Not thread-safe: one libcurl handle, one request at a time; its owner
// serialises the calls (EtcdStore holds its mutex around every one).
#pragma once

#include <curl/curl.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/clock.h"

namespace lockstep::cli {

struct EtcdOptions {
  // "host:port" of each member (port 2379 when left out).
  std::vector<std::string> endpoints;
  // Every key goes under it; ends with "/", e.g. "/lockstep/<rdzv-id>/".
  std::string prefix;
  // TLS: https to the members, the CA that signed their certificates, and
  // this client's certificate and key when the cluster asks for one
  // (--client-cert-auth). Empty: the system's CAs, no client certificate.
  bool https = false;
  std::string cacert;
  std::string cert;
  std::string key;
  // etcd's authentication (`etcdctl auth enable`): a user and its password;
  // the client asks for a token and sends it with every request.
  std::string username;
  std::string password;
  // One request to one member before the next member is tried.
  Duration request_timeout = std::chrono::seconds(3);
  // The job's lease; zero: keys are put without one (they stay).
  Duration lease_ttl = std::chrono::seconds(60);
};

// One HTTP exchange with one member, as it went (etcd_client.cc).
struct EtcdTransfer;

class EtcdClient {
 public:
  using Json = nlohmann::json;

  // Thrown by request() when etcd no longer knows the lease a request
  // names (a put on it, a keep-alive, a revoke); EtcdStore catches it
  // where it renews the job's lease, so it never leaves the store.
  struct LeaseGone {};

  // `options` as EtcdStore checked them (at least one endpoint, a positive
  // request_timeout). Opens the connection, and authenticates when they
  // name a user: ConfigError when etcd refuses, TimeoutError when no member
  // answers within request_timeout x members.
  explicit EtcdClient(EtcdOptions options);
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // POST `path` with `body`; etcd's reply (not an error). Renews the
  // authentication token when it expired. TimeoutError when no member
  // answered by `deadline` (the two-argument form: request_timeout x
  // members), ConfigError for credentials, TLS or a server that is not
  // etcd, LeaseGone, Error for any other refusal.
  Json request(const std::string& path, const Json& body, Deadline deadline);
  Json request(const std::string& path, const Json& body);

  // Waits up to `within` for any member to answer; false if none did.
  bool reachable(Duration within);
  // This host's address on its connection to the member that answered last.
  const std::string& local_address() const { return local_ip_; }
  // "a:2379,b:2379", for messages. Reads only the options, which never
  // change: any thread may call it.
  std::string endpoints_text() const;

 private:
  Deadline request_deadline() const;
  EtcdTransfer transfer(std::size_t m, const std::string& path, const std::string& body, Duration timeout);
  Json exchange(const std::string& path, const std::string& body, Deadline deadline);
  [[noreturn]] void throw_refusal(const std::string& path, const Json& reply) const;
  std::string tls_refusal(std::size_t m, const EtcdTransfer& t) const;
  void authenticate();

  const EtcdOptions options_;
  // libcurl's handle: it keeps its connections to the members open between requests.
  std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> curl_;
  std::size_t member_ = 0;  // the endpoint that answered last
  std::string token_;       // etcd's authentication token; empty: none
  std::string local_ip_;    // of the last answered request
};

// Parses --rdzv-endpoint for etcd: "host[:port][,host[:port]...]", with an
// optional "http://" or "https://" in front of each (https sets *https;
// http where *https is already set is a ConfigError), IPv6 addresses in
// brackets. Returns "host:port" each, port 2379 where none was given.
// Throws ConfigError on an empty list or entry, or a bad port.
std::vector<std::string> parse_etcd_endpoints(const std::string& text, bool* https);

}  // namespace lockstep::cli
