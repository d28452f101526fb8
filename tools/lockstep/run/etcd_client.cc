// EtcdClient: requests to an etcd cluster's v3 gateway; see etcd_client.h.
// In three parts: one HTTP exchange with one member (libcurl); a request to
// the cluster, with etcd's replies sorted into answers, members to pass
// over and ConfigErrors; --rdzv-endpoint's members as "host:port".
#include "run/etcd_client.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>
#include <thread>
#include <utility>

#include "common/env.h"
#include "lockstep/error.h"
#include "run/base64.h"

namespace lockstep::cli {

// One HTTP exchange with one member, as it went.
struct EtcdTransfer {
  CURLcode code = CURLE_OK;
  std::string error;  // curl's words for a failed transfer
  long status = 0;    // HTTP status
  std::string body;
  std::string local_ip;
};

namespace {

// The gRPC status codes etcd's gateway puts in its error replies
// ({"error": text, "code": N, "message": text}).
constexpr int kEtcdDeadlineExceeded = 4;
constexpr int kEtcdNotFound = 5;
constexpr int kEtcdPermissionDenied = 7;
constexpr int kEtcdUnavailable = 14;
constexpr int kEtcdUnauthenticated = 16;

constexpr std::uint16_t kEtcdDefaultPort = 2379;

void init_curl_once() {
  // curl_global_init is not thread-safe: a function-local static runs it
  // exactly once, whichever thread opens the first store.
  static const CURLcode initialised = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (initialised != CURLE_OK)
    throw ConfigError(fmt::format("libcurl failed to initialise: {}", curl_easy_strerror(initialised)));
}

CURL* new_curl_handle() {
  init_curl_once();
  CURL* const curl = curl_easy_init();
  if (curl == nullptr) throw Error("etcd store: libcurl could not create a handle");
  return curl;
}

std::size_t etcd_append_reply(char* data, std::size_t size, std::size_t count, void* reply) {
  static_cast<std::string*>(reply)->append(data, size * count);
  return size * count;
}

// etcd's gateway reports an error as {"error": text, "code": N, "message":
// text}, and on a stream (the lease keep-alive) as {"error": {"grpc_code":
// N, "message": text, ...}}.
bool etcd_is_error(const nlohmann::json& reply) {
  return !reply.contains("header") && !reply.contains("result") && (reply.contains("code") || reply.contains("error"));
}
const nlohmann::json& etcd_error_body(const nlohmann::json& reply) {
  const auto it = reply.find("error");
  return it != reply.end() && it->is_object() ? *it : reply;
}
int etcd_error_code(const nlohmann::json& reply) {
  const nlohmann::json& body = etcd_error_body(reply);
  for (const char* name : {"code", "grpc_code"})
    if (const auto it = body.find(name); it != body.end() && it->is_number_integer()) return it->get<int>();
  return 0;
}
std::string etcd_error_message(const nlohmann::json& reply) {
  const nlohmann::json& body = etcd_error_body(reply);
  for (const char* name : {"message", "error"})
    if (const auto it = body.find(name); it != body.end() && it->is_string()) return it->get<std::string>();
  return reply.dump();
}

bool etcd_needs_new_token(const nlohmann::json& reply) {
  const std::string message = etcd_error_message(reply);
  return etcd_error_code(reply) == kEtcdUnauthenticated  // "invalid auth token": it expired
         || message.find("user name is empty") != std::string::npos  // no token sent
         || message.find("revision of auth store is old") != std::string::npos;  // users changed since
}

// A member that answers but cannot serve the request now: no leader (an
// election is going on), or the request timed out inside the cluster (a
// write without a quorum says "context deadline exceeded", code 2).
bool etcd_member_unavailable(const nlohmann::json& reply) {
  if (!etcd_is_error(reply)) return false;
  const int code = etcd_error_code(reply);
  return code == kEtcdUnavailable || code == kEtcdDeadlineExceeded ||
         etcd_error_message(reply).find("context deadline exceeded") != std::string::npos;
}

// etcd's reply to POST `path`, as JSON; ConfigError for a reply that is
// not one of etcd's (another server at that port, a too old etcd).
nlohmann::json etcd_parse_reply(const std::string& endpoint, const std::string& path, const EtcdTransfer& t) {
  nlohmann::json reply = nlohmann::json::parse(t.body, nullptr, /*allow_exceptions=*/false);
  if (reply.is_object() && (reply.contains("header") || reply.contains("result") || reply.contains("code") ||
                             reply.contains("error")))
    return reply;
  std::string text = t.body.substr(0, 300);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  if (text.find("CommonName of client") != std::string::npos)
    throw ConfigError(fmt::format(
        "etcd at {} refuses a client certificate that carries a Common Name while its authentication is on "
        "('{}'): give --rdzv-conf cert= a certificate whose subject has no CN (openssl req -subj /O=lockstep), "
        "and the user with username=",
        endpoint, text));
  throw ConfigError(fmt::format(
      "{} answered POST {} with HTTP {} '{}', which is not etcd's v3 JSON gateway: check that --rdzv-endpoint "
      "names etcd's client port (2379 unless set otherwise) and that etcd is 3.4 or newer",
      endpoint, path, t.status, text));
}

// Why one member did not answer, for the TimeoutError.
std::string etcd_transfer_cause(const EtcdTransfer& t) {
  if (t.code == CURLE_GOT_NOTHING)  // also what a member that serves https answers to http
    return t.error + " (is it serving https? then protocol=https in --rdzv-conf)";
  return t.error;
}

// Transfer failures that mean TLS cannot work with these options, whichever
// member is asked.
bool etcd_tls_refused(const EtcdTransfer& t) {
  switch (t.code) {
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ENGINE_NOTFOUND:
    case CURLE_SSL_ENGINE_SETFAILED:
    case CURLE_SSL_ENGINE_INITFAILED:
    case CURLE_SSL_CRL_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_USE_SSL_FAILED:
#if LIBCURL_VERSION_NUM >= 0x074d00
    case CURLE_SSL_CLIENTCERT:
#endif
      return true;
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
      // Under TLS 1.3 a server refuses the client's certificate (or its
      // lack of one) after the handshake: curl's error names the alert.
      return t.error.find("alert") != std::string::npos;
    default:
      return false;
  }
}

}  // namespace

// ---- One HTTP exchange with one member ----

EtcdClient::EtcdClient(EtcdOptions options)
    : options_(std::move(options)), curl_(new_curl_handle(), curl_easy_cleanup) {
  CURL* const curl = curl_.get();
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM for name lookups in a threaded program
  // HTTP/1.1: curl then reports a server's TLS alert (a refused client
  // certificate) in its error text, which HTTP/2 turns into a bare
  // "send failure".
  curl_easy_setopt(curl, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  // etcd runs inside the cluster; a proxy set in the environment (for
  // downloads) would not reach it.
  curl_easy_setopt(curl, CURLOPT_PROXY, "");
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, etcd_append_reply);
  if (!options_.cacert.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, options_.cacert.c_str());
  if (!options_.cert.empty()) curl_easy_setopt(curl, CURLOPT_SSLCERT, options_.cert.c_str());
  if (!options_.key.empty()) curl_easy_setopt(curl, CURLOPT_SSLKEY, options_.key.c_str());
  if (!options_.username.empty()) authenticate();
}

EtcdTransfer EtcdClient::transfer(std::size_t m, const std::string& path, const std::string& body, Duration timeout) {
  CURL* const curl = curl_.get();
  const std::string url = fmt::format("{}://{}{}", options_.https ? "https" : "http", options_.endpoints[m], path);
  curl_slist* list = curl_slist_append(nullptr, "Content-Type: application/json");
  list = curl_slist_append(list, "Expect:");  // no "100-continue" round trip before larger bodies
  if (!token_.empty()) list = curl_slist_append(list, ("Authorization: " + token_).c_str());
  const std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> headers(list, curl_slist_free_all);
  char error[CURL_ERROR_SIZE] = "";
  EtcdTransfer t;
  const long timeout_ms = std::max<long>(1, static_cast<long>(timeout.count()));
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t.body);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
  t.code = curl_easy_perform(curl);
  if (t.code != CURLE_OK) t.error = error[0] != '\0' ? error : curl_easy_strerror(t.code);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &t.status);
  char* ip = nullptr;
  if (t.code == CURLE_OK && curl_easy_getinfo(curl, CURLINFO_LOCAL_IP, &ip) == CURLE_OK && ip != nullptr)
    t.local_ip = ip;
  // The handle keeps the options; these point at locals.
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, nullptr);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, nullptr);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, nullptr);
  return t;
}

// ---- A request to the cluster ----

// To the member that answered last, then round the others while each
// fails to answer (within request_timeout) or answers that it cannot serve
// now; a round in which none answered is repeated after a pause, as an
// election takes a second or two, until `deadline`.
// A write whose reply was lost may have been applied and is then sent
// again, to the next member: harmless for set, compare_set and delete_key;
// one count too many for add (etcd's own client has the same limit).
EtcdClient::Json EtcdClient::exchange(const std::string& path, const std::string& body, Deadline deadline) {
  const std::size_t n = options_.endpoints.size();
  constexpr char kNotTried[] = "not tried";
  std::vector<std::string> causes(n, kNotTried);
  const Clock::time_point start = Clock::now();
  Duration pause(50);
  while (!deadline.expired()) {
    for (std::size_t i = 0; i < n && !deadline.expired(); ++i) {
      const std::size_t m = (member_ + i) % n;
      const EtcdTransfer t = transfer(m, path, body, std::min(options_.request_timeout, deadline.remaining()));
      if (t.code != CURLE_OK) {
        if (etcd_tls_refused(t)) throw ConfigError(tls_refusal(m, t));
        // A try that ran out of time (perhaps only the deadline's rest)
        // says less than what the member answered before it.
        if (t.code != CURLE_OPERATION_TIMEDOUT || causes[m] == kNotTried) causes[m] = etcd_transfer_cause(t);
        continue;
      }
      Json reply = etcd_parse_reply(options_.endpoints[m], path, t);
      if (etcd_member_unavailable(reply)) {
        causes[m] = etcd_error_message(reply);
        continue;
      }
      member_ = m;
      local_ip_ = t.local_ip;
      return reply;
    }
    std::this_thread::sleep_for(std::min(pause, deadline.remaining()));
    pause = std::min<Duration>(pause * 2, Duration(500));
  }
  std::vector<std::string> said, urls;
  for (std::size_t m = 0; m < n; ++m) {
    said.push_back(fmt::format("{}: {}", options_.endpoints[m], causes[m]));
    urls.push_back(fmt::format("{}://{}", options_.https ? "https" : "http", options_.endpoints[m]));
  }
  throw TimeoutError(fmt::format(
      "no member of etcd at {} answered POST {} within {:.1f} s ({}): the cluster is down, unreachable from this "
      "host, or without a quorum (etcdctl --endpoints {} endpoint health)",
      endpoints_text(), path, seconds_between(start, Clock::now()), fmt::join(said, "; "), fmt::join(urls, ",")));
}

// exchange(), with a new authentication token when the old one expired
// (--auth-token-ttl, 5 minutes by default); etcd's refusals as exceptions.
EtcdClient::Json EtcdClient::request(const std::string& path, const Json& body, Deadline deadline) {
  const std::string text = body.dump();
  for (bool authenticated_anew = false;; authenticated_anew = true) {
    Json reply = exchange(path, text, deadline);
    if (!etcd_is_error(reply)) return reply;
    if (etcd_needs_new_token(reply) && !options_.username.empty() && !authenticated_anew) {
      authenticate();
      continue;
    }
    throw_refusal(path, reply);
  }
}

void EtcdClient::throw_refusal(const std::string& path, const Json& reply) const {
  const int code = etcd_error_code(reply);
  const std::string message = etcd_error_message(reply);
  if (code == kEtcdNotFound && message.find("lease not found") != std::string::npos) throw LeaseGone{};
  if (etcd_needs_new_token(reply)) {
    if (options_.username.empty())
      throw ConfigError(fmt::format("etcd at {} has authentication enabled ({}): give its user with --rdzv-conf "
                                    "username=U and the password in LOCKSTEP_ETCD_PASSWORD",
                                    endpoints_text(), message));
    throw ConfigError(fmt::format("etcd at {} refused user '{}' ({}) right after it authenticated: check the user "
                                  "and its password",
                                  endpoints_text(), options_.username, message));
  }
  if (code == kEtcdPermissionDenied)
    throw ConfigError(fmt::format(
        "etcd at {} refused user '{}' the keys under '{}' ({}): give it read and write permission there "
        "(etcdctl role add lockstep; etcdctl role grant-permission lockstep --prefix=true readwrite {}; "
        "etcdctl user grant-role {} lockstep)",
        endpoints_text(), options_.username, options_.prefix, message, options_.prefix, options_.username));
  throw Error(fmt::format("etcd at {} refused POST {}: {} (gRPC code {})", endpoints_text(), path, message, code));
}

std::string EtcdClient::tls_refusal(std::size_t m, const EtcdTransfer& t) const {
  std::string fix;
  switch (t.code) {
    case CURLE_PEER_FAILED_VERIFICATION:
      fix = fmt::format("this client does not trust the member's certificate: give the CA that signed it with "
                        "--rdzv-conf cacert=FILE (now {}), and check that the certificate names the host as "
                        "--rdzv-endpoint writes it",
                        options_.cacert.empty() ? "the system's CAs" : "cacert=" + options_.cacert);
      break;
    case CURLE_SSL_CACERT_BADFILE:
      fix = fmt::format("--rdzv-conf cacert={} is not a file of PEM CA certificates", options_.cacert);
      break;
    case CURLE_SSL_CERTPROBLEM:
      fix = "--rdzv-conf cert= and key= must be this client's PEM certificate and its unencrypted key";
      break;
    case CURLE_SSL_CONNECT_ERROR:
      fix = "is the member serving https at that port (without TLS: protocol=http, or http:// in "
            "--rdzv-endpoint)? Else check --rdzv-conf cacert=, cert= and key=";
      break;
    default:
      fix = t.error.find("alert") != std::string::npos
                ? "the member refused this client's certificate, or its lack of one (etcd --client-cert-auth): "
                  "give one signed by a CA the member trusts with --rdzv-conf cert=FILE,key=FILE"
                : "check --rdzv-conf cacert=, cert= and key=";
  }
  return fmt::format("TLS with etcd member {} failed ({}): {}", options_.endpoints[m], t.error, fix);
}

void EtcdClient::authenticate() {
  token_.clear();
  const Json body = {{"name", options_.username}, {"password", options_.password}};
  const Json reply = exchange("/v3/auth/authenticate", body.dump(), request_deadline());
  if (!etcd_is_error(reply)) {
    token_ = reply.value("token", "");
    return;
  }
  const std::string message = etcd_error_message(reply);
  if (message.find("authentication is not enabled") != std::string::npos) return;  // no token needed
  if (message.find("authentication failed") != std::string::npos)
    throw ConfigError(fmt::format("etcd at {} refused user '{}' with the password given ({}): check the user name "
                                  "(--rdzv-conf username=) and its password (LOCKSTEP_ETCD_PASSWORD)",
                                  endpoints_text(), options_.username, message));
  throw_refusal("/v3/auth/authenticate", reply);
}

EtcdClient::Json EtcdClient::request(const std::string& path, const Json& body) {
  return request(path, body, request_deadline());
}

Deadline EtcdClient::request_deadline() const {
  return Deadline::after(options_.request_timeout * static_cast<int>(options_.endpoints.size()));
}

// Any request would do; a count-only read of the prefix is one that the
// job's etcd user may make (its role covers the prefix), so that a member's
// answer, not a refusal, decides.
bool EtcdClient::reachable(Duration within) {
  try {
    request("/v3/kv/range", {{"key", base64_encode(options_.prefix)}, {"count_only", true}}, Deadline::after(within));
    return true;
  } catch (const TimeoutError&) {
    return false;
  }
}

std::string EtcdClient::endpoints_text() const { return fmt::format("{}", fmt::join(options_.endpoints, ",")); }

// ---- --rdzv-endpoint ----

namespace {

// "host[:port]" or "[v6]:port" (a scheme already taken off) as "host:port".
std::string etcd_endpoint(const std::string& text, const std::string& item) {
  std::string host = item;
  std::string port;
  if (!item.empty() && item[0] == '[') {
    const std::size_t close = item.find(']');
    if (close == std::string::npos)
      throw ConfigError(fmt::format("--rdzv-endpoint '{}': '{}' lacks its ']'", text, item));
    host = item.substr(0, close + 1);
    if (close + 1 < item.size()) {
      if (item[close + 1] != ':') throw ConfigError(fmt::format("--rdzv-endpoint '{}': '{}' is not [host]:port", text, item));
      port = item.substr(close + 2);
    }
  } else if (const std::size_t colon = item.find(':'); colon != std::string::npos) {
    if (item.find(':', colon + 1) != std::string::npos)
      throw ConfigError(fmt::format("--rdzv-endpoint '{}': write the IPv6 address in '{}' in brackets, "
                                    "[address]:port",
                                    text, item));
    host = item.substr(0, colon);
    port = item.substr(colon + 1);
    if (port.empty()) throw ConfigError(fmt::format("--rdzv-endpoint '{}': '{}' has no port after its ':'", text, item));
  }
  if (host.empty() || host == "[]") throw ConfigError(fmt::format("--rdzv-endpoint '{}': '{}' names no host", text, item));
  if (port.empty()) return fmt::format("{}:{}", host, kEtcdDefaultPort);
  const auto number = std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })
                          ? parse_int(port)
                          : std::nullopt;
  if (!number || *number < 1 || *number > 65535)
    throw ConfigError(fmt::format("--rdzv-endpoint '{}': the port '{}' is not a number from 1 to 65535", text, port));
  return fmt::format("{}:{}", host, *number);
}

}  // namespace

std::vector<std::string> parse_etcd_endpoints(const std::string& text, bool* https) {
  std::vector<std::string> endpoints;
  bool said_http = false;
  bool said_https = false;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    std::string item = text.substr(start, comma - start);
    start = comma + 1;
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) {
      if (text.find_first_not_of(" \t,") == std::string::npos) break;  // reported below as no member
      throw ConfigError(fmt::format("--rdzv-endpoint '{}' has an empty entry between its commas", text));
    }
    for (const auto& [scheme, said] : {std::pair{"https://", &said_https}, {"http://", &said_http}}) {
      if (item.rfind(scheme, 0) == 0) {
        item.erase(0, std::string_view(scheme).size());
        *said = true;
      }
    }
    while (!item.empty() && item.back() == '/') item.pop_back();
    endpoints.push_back(etcd_endpoint(text, item));
  }
  if (endpoints.empty()) throw ConfigError("--rdzv-endpoint names no etcd member (host[:port],...)");
  if (said_http && (said_https || *https))
    throw ConfigError(fmt::format("--rdzv-endpoint '{}' asks for both http and https (protocol= in --rdzv-conf "
                                  "counts too): the members of one cluster serve one of them",
                                  text));
  if (said_https) *https = true;
  return endpoints;
}

}  // namespace lockstep::cli
