// EtcdStore against real etcd processes (/usr/bin/etcd, started and killed
// here): the Store contract, the job's lease, a three-member cluster losing
// members, TLS with client certificates and authentication, and
// --rdzv-endpoint's parsing. Skips where etcd-server is not installed.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/clock.h"
#include "harness/blocking_call.h"
#include "harness/etcd_process.h"
#include "harness/reserved_port.h"
#include "lockstep/error.h"
#include "run/etcd_store.h"

namespace lockstep::cli {
namespace {

using namespace std::chrono_literals;
using testing::EtcdProcess;
using testing::kEtcd;

// Whether `text` (an error message) mentions `part`, saying what it does say.
::testing::AssertionResult mentions(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not mention '" << part << "'";
}

constexpr const char* kEtcdctl = "/usr/bin/etcdctl";
constexpr const char* kOpenssl = "/usr/bin/openssl";

std::string tail_of(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  return all.substr(all.size() > 2000 ? all.size() - 2000 : 0);
}

// The certificates of a TLS cluster, made with openssl: a CA; the members'
// certificate for IP 127.0.0.1; a client certificate without a Common Name
// (etcd 3.4's gateway refuses one that has a CN once authentication is on)
// and one with a CN.
struct TlsFiles {
  std::string ca, server_cert, server_key, client_cert, client_key, named_client_cert, named_client_key;
};

void run_shell(const std::string& command) {
  const int status = std::system(command.c_str());
  if (status != 0) throw std::runtime_error("failed (" + std::to_string(status) + "): " + command);
}

TlsFiles make_certificates(const std::string& dir) {
  TlsFiles f{dir + "/ca.crt", dir + "/server.crt", dir + "/server.key", dir + "/client.crt", dir + "/client.key",
             dir + "/named.crt", dir + "/named.key"};
  const std::string ssl = kOpenssl;
  const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  run_shell(ssl + " req -x509" + ec + " -keyout " + dir + "/ca.key -out " + f.ca +
            " -days 1 -subj /CN=lockstep-test-ca 2>/dev/null");
  const auto sign = [&](const std::string& name, const std::string& subject, const std::string& extensions) {
    std::ofstream(dir + "/" + name + ".ext") << extensions;
    run_shell(ssl + " req" + ec + " -keyout " + dir + "/" + name + ".key -out " + dir + "/" + name + ".csr -subj " +
              subject + " 2>/dev/null");
    run_shell(ssl + " x509 -req -in " + dir + "/" + name + ".csr -CA " + f.ca + " -CAkey " + dir +
              "/ca.key -CAcreateserial -days 1 -out " + dir + "/" + name + ".crt -extfile " + dir + "/" + name +
              ".ext 2>/dev/null");
  };
  sign("server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n");
  sign("client", "/O=lockstep-test", "extendedKeyUsage=clientAuth\n");
  sign("named", "/CN=root", "extendedKeyUsage=clientAuth\n");
  return f;
}

class EtcdStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kEtcd)) GTEST_SKIP() << "etcd-server is not installed (apt-get install etcd-server)";
    char dir[] = "/tmp/lockstep-etcd-test-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    members_.clear();  // kills and reaps them
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Starts `n` members on 127.0.0.1 as one cluster; returns their client
  // endpoints. `tls`: https for clients, with client certificates.
  std::vector<std::string> start_cluster(int n, const TlsFiles* tls = nullptr,
                                         const std::vector<std::string>& extra = {}) {
    std::vector<std::string> endpoints, peers;
    std::string initial;
    const std::size_t first = ports_.size();
    for (int i = 0; i < n; ++i) {
      ports_.emplace_back();  // client
      ports_.emplace_back();  // peer
      const std::string peer = "http://127.0.0.1:" + ports_[first + 2 * i + 1].text();
      initial += (i ? "," : "") + std::string("m") + std::to_string(i) + "=" + peer;
      peers.push_back(peer);
      endpoints.push_back("127.0.0.1:" + ports_[first + 2 * i].text());
    }
    const std::string scheme = tls ? "https://" : "http://";
    for (int i = 0; i < n; ++i) {
      const std::string name = "m" + std::to_string(i);
      std::vector<std::string> args = {"--name", name, "--data-dir", dir_ + "/" + name + std::to_string(first),
                                       "--listen-client-urls", scheme + endpoints[i],
                                       "--advertise-client-urls", scheme + endpoints[i],
                                       "--listen-peer-urls", peers[i], "--initial-advertise-peer-urls", peers[i],
                                       "--initial-cluster", initial, "--initial-cluster-state", "new",
                                       "--initial-cluster-token", "lockstep-test" + std::to_string(first),
                                       // Elections in half a second: a lost leader is replaced quickly.
                                       "--heartbeat-interval", "50", "--election-timeout", "500",
                                       "--logger", "zap", "--log-level", "warn"};
      if (tls)
        args.insert(args.end(), {"--cert-file", tls->server_cert, "--key-file", tls->server_key, "--trusted-ca-file",
                                 tls->ca, "--client-cert-auth"});
      args.insert(args.end(), extra.begin(), extra.end());
      members_.push_back(std::make_unique<EtcdProcess>(args, dir_ + "/" + name + std::to_string(first) + ".log"));
    }
    // Serving once a request through the gateway succeeds (each member
    // listens before the cluster has a leader).
    EtcdOptions probe = options(endpoints, "/probe/");
    probe.lease_ttl = Duration(0);
    probe.request_timeout = 1s;
    if (tls) {
      probe.https = true;
      probe.cacert = tls->ca;
      probe.cert = tls->client_cert;
      probe.key = tls->client_key;
    }
    const Deadline deadline = Deadline::after(30s);
    for (const auto& endpoint : endpoints) {
      EtcdOptions one = probe;
      one.endpoints = {endpoint};
      for (;;) {
        try {
          EtcdStore store(one);
          break;
        } catch (const TimeoutError& e) {
          if (deadline.expired())
            throw std::runtime_error("etcd did not start: " + std::string(e.what()) + "\n" +
                                     tail_of(members_[first / 2]->log()));
        }
      }
    }
    return endpoints;
  }

  static EtcdOptions options(const std::vector<std::string>& endpoints, const std::string& prefix) {
    EtcdOptions o;
    o.endpoints = endpoints;
    o.prefix = prefix;
    o.request_timeout = 1s;
    return o;
  }

  std::shared_ptr<EtcdStore> open(const std::vector<std::string>& endpoints, const std::string& prefix = "/job/") {
    auto store = std::make_shared<EtcdStore>(options(endpoints, prefix));
    store->set_timeout(5s);
    return store;
  }

  std::string dir_;
  std::vector<testing::ReservedPort> ports_;
  std::vector<std::unique_ptr<EtcdProcess>> members_;
};

// ---- The Store contract ----

TEST_F(EtcdStoreTest, SetThenGetFromAnotherHandle) {
  const auto endpoints = start_cluster(1);
  auto a = open(endpoints);
  auto b = open(endpoints);
  a->set("k", "1");
  EXPECT_EQ(b->get("k"), "1");
  b->set("k", "2");
  EXPECT_EQ(a->get("k"), "2");
  const std::string binary("\0\x01\xff\n\0end", 8);
  a->set("bin", binary);
  EXPECT_EQ(b->get("bin"), binary);
  a->set("empty", "");
  EXPECT_EQ(b->get("empty"), "");
  EXPECT_EQ(a->advertised_address(), "127.0.0.1");
  EXPECT_EQ(a->endpoints_text(), endpoints[0]);
}

TEST_F(EtcdStoreTest, GetWaitsForAKeySetLaterByAnotherHandle) {
  const auto endpoints = start_cluster(1);
  auto waiter = open(endpoints);
  auto setter = open(endpoints);
  std::string got;
  testing::BlockingCall call([&] { got = waiter->get("late"); });
  ASSERT_TRUE(call.blocked());
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(call.returned());
  setter->set("late", "here");
  call.join();
  EXPECT_EQ(got, "here");
}

TEST_F(EtcdStoreTest, GetOfAMissingKeyTimesOutNamingIt) {
  const auto endpoints = start_cluster(1);
  auto store = open(endpoints);
  store->set_timeout(500ms);
  const Clock::time_point start = Clock::now();
  try {
    store->get("never-set");
    FAIL() << "get of a missing key returned";
  } catch (const TimeoutError& e) {
    EXPECT_TRUE(mentions(e.what(), "'never-set'"));
    EXPECT_TRUE(mentions(e.what(), endpoints[0]));
  }
  const double took = seconds_between(start, Clock::now());
  EXPECT_GE(took, 0.5);
  EXPECT_LT(took, 2.0);
}

TEST_F(EtcdStoreTest, AddFromTwoThreadsOnEachOfTwoHandlesSumsExactly) {
  const auto endpoints = start_cluster(1);
  std::vector<std::shared_ptr<EtcdStore>> handles = {open(endpoints), open(endpoints)};
  constexpr int kIncrements = 200;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (auto& handle : handles)
    for (int t = 0; t < 2; ++t)
      threads.emplace_back([&, handle] {
        for (int i = 0; i < kIncrements; ++i) {
          try {
            handle->add("counter", 1);
          } catch (const std::exception&) {
            ++failures;
          }
        }
      });
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(handles[0]->add("counter", 0), 4 * kIncrements);
  EXPECT_EQ(handles[1]->add("counter", -5), 4 * kIncrements - 5);
  EXPECT_EQ(handles[0]->add("fresh", 7), 7);
  handles[0]->set("text", "abc");
  EXPECT_THROW(handles[0]->add("text", 1), InvalidArgument);
}

TEST_F(EtcdStoreTest, CompareSetOnAMissingKeyAMismatchAndAMatch) {
  const auto endpoints = start_cluster(1);
  auto store = open(endpoints);
  // Missing, expected "x": nothing set, "" back.
  EXPECT_EQ(store->compare_set("cas", "x", "y"), "");
  EXPECT_FALSE(store->check({"cas"}));
  // Missing, expected "": set.
  EXPECT_EQ(store->compare_set("cas", "", "first"), "first");
  // Mismatch: unchanged, the current value back.
  EXPECT_EQ(store->compare_set("cas", "other", "second"), "first");
  EXPECT_EQ(store->get("cas"), "first");
  // Match: set.
  EXPECT_EQ(store->compare_set("cas", "first", "second"), "second");
  EXPECT_EQ(open(endpoints)->get("cas"), "second");
  // Present with a value, expected "": unchanged.
  EXPECT_EQ(store->compare_set("cas", "", "third"), "second");
  // Holding "", expected "": set (it holds what was expected).
  store->set("blank", "");
  EXPECT_EQ(store->compare_set("blank", "", "filled"), "filled");
}

TEST_F(EtcdStoreTest, CheckDeleteKeyAndNumKeys) {
  const auto endpoints = start_cluster(1);
  auto store = open(endpoints);
  EXPECT_EQ(store->num_keys(), 1);  // the lease's record
  EXPECT_TRUE(store->check({}));
  store->set("a", "1");
  store->set("b", "2");
  EXPECT_TRUE(store->check({"a", "b"}));
  EXPECT_FALSE(store->check({"a", "c"}));
  EXPECT_EQ(store->num_keys(), 3);
  EXPECT_TRUE(store->delete_key("a"));
  EXPECT_FALSE(store->delete_key("a"));
  EXPECT_FALSE(store->check({"a"}));
  EXPECT_EQ(store->num_keys(), 2);
  // More keys than etcd allows in one transaction.
  std::vector<std::string> many;
  for (int i = 0; i < 300; ++i) many.push_back("many/" + std::to_string(i));
  EXPECT_FALSE(store->check(many));
  store->set("many/299", "x");
  EXPECT_FALSE(store->check(many));
}

TEST_F(EtcdStoreTest, WaitReturnsOnceAllKeysExistAndTimesOutNamingTheMissingOnes) {
  const auto endpoints = start_cluster(1);
  auto store = open(endpoints);
  store->set("here", "1");
  std::thread later([&, other = open(endpoints)] {
    std::this_thread::sleep_for(200ms);
    other->set("soon", "1");
  });
  EXPECT_NO_THROW(store->wait({"here", "soon"}, 3s));
  later.join();
  const Clock::time_point start = Clock::now();
  try {
    store->wait({"here", "absent"}, 400ms);
    FAIL() << "wait for a missing key returned";
  } catch (const TimeoutError& e) {
    EXPECT_TRUE(mentions(e.what(), "'absent'"));
    EXPECT_FALSE(mentions(e.what(), "'here'"));
  }
  EXPECT_LT(seconds_between(start, Clock::now()), 1.5);
}

TEST_F(EtcdStoreTest, KeysUnderTwoPrefixesDoNotSeeEachOther) {
  const auto endpoints = start_cluster(1);
  auto one = open(endpoints, "/lockstep/one/");
  auto other = open(endpoints, "/lockstep/one-other/");
  one->set("k", "one");
  other->set("k", "other");
  other->set("only-other", "x");
  EXPECT_EQ(one->get("k"), "one");
  EXPECT_EQ(other->get("k"), "other");
  EXPECT_FALSE(one->check({"only-other"}));
  EXPECT_EQ(one->num_keys(), 2);    // k and the lease's record
  EXPECT_EQ(other->num_keys(), 3);  // k, only-other and the lease's record
  EXPECT_EQ(one->add("n", 1), 1);
  EXPECT_EQ(other->add("n", 1), 1);
}

TEST_F(EtcdStoreTest, ACloneIsAnotherConnectionOnTheSameKeys) {
  const auto endpoints = start_cluster(1);
  auto store = open(endpoints);
  store->set_timeout(700ms);
  const auto clone = store->clone();
  EXPECT_EQ(clone->timeout(), 700ms);
  clone->set("from-clone", "1");
  EXPECT_EQ(store->get("from-clone"), "1");
  // The clone is not held up by a get blocked on the original.
  testing::BlockingCall blocked([&] { EXPECT_THROW(store->get("never"), TimeoutError); });
  ASSERT_TRUE(blocked.blocked());
  const Clock::time_point start = Clock::now();
  EXPECT_EQ(clone->add("n", 2), 2);
  EXPECT_LT(seconds_between(start, Clock::now()), 0.5);
  blocked.join();
}

// ---- The job's lease ----

TEST_F(EtcdStoreTest, KeysVanishOnceNoHandleRefreshesTheLeaseForItsTtlAndAnIdleHandleGoesOn) {
  const auto endpoints = start_cluster(1);
  EtcdOptions o = options(endpoints, "/leased/");
  o.lease_ttl = 2s;
  auto idle = std::make_shared<EtcdStore>(o);
  {
    EtcdStore gone(o);
    gone.set("a", "1");
    idle->set("b", "2");
    EXPECT_TRUE(gone.check({"a", "b"}));
  }
  std::this_thread::sleep_for(4s);  // nobody refreshes the lease
  EtcdStore newcomer(o);
  EXPECT_FALSE(newcomer.check({"a"}));
  EXPECT_FALSE(newcomer.check({"b"}));
  EXPECT_EQ(newcomer.num_keys(), 1);  // only the newcomer's lease record
  // The idle handle's lease is gone: it adopts the newcomer's and goes on.
  idle->set("c", "3");
  EXPECT_EQ(newcomer.get("c"), "3");
  EXPECT_EQ(idle->add("n", 1), 1);
}

TEST_F(EtcdStoreTest, AHandleThatKeepsMakingRequestsKeepsTheKeysBeyondTheTtl) {
  const auto endpoints = start_cluster(1);
  EtcdOptions o = options(endpoints, "/kept/");
  o.lease_ttl = 2s;
  EtcdStore live(o);
  live.set("k", "v");
  const Deadline until = Deadline::after(5s);
  while (!until.expired()) {
    EXPECT_EQ(live.get("k"), "v");
    std::this_thread::sleep_for(300ms);
  }
  EtcdStore other(o);
  EXPECT_EQ(other.get("k"), "v");
}

TEST_F(EtcdStoreTest, NoLeaseKeepsKeysWithoutARecord) {
  const auto endpoints = start_cluster(1);
  EtcdOptions o = options(endpoints, "/unleased/");
  o.lease_ttl = Duration(0);
  EtcdStore store(o);
  store.set("k", "v");
  EXPECT_EQ(store.num_keys(), 1);
}

// ---- A cluster losing members ----

TEST_F(EtcdStoreTest, AClusterServesThroughTheMembersLeftAndTimesOutWithoutAny) {
  const auto endpoints = start_cluster(3);
  auto store = open(endpoints);  // member 0 first: the one it uses
  store->set("before", "1");
  EXPECT_EQ(store->get("before"), "1");
  EXPECT_TRUE(store->reachable(1s));

  members_[0]->stop();
  const Clock::time_point start = Clock::now();
  store->set("after", "2");
  EXPECT_EQ(store->get("after"), "2");
  EXPECT_EQ(store->add("n", 1), 1);
  EXPECT_LT(seconds_between(start, Clock::now()), 5.0);
  // A new handle that lists the dead member first reaches another.
  EXPECT_EQ(open(endpoints)->get("before"), "1");

  members_[1]->stop();
  members_[2]->stop();
  const Clock::time_point dead = Clock::now();
  try {
    store->set("none", "3");
    FAIL() << "a set with every member dead returned";
  } catch (const TimeoutError& e) {
    EXPECT_TRUE(mentions(e.what(), endpoints[0]));
    EXPECT_TRUE(mentions(e.what(), endpoints[2]));
  }
  const double took = seconds_between(dead, Clock::now());
  EXPECT_LT(took, 3 * 1.0 + 1.0);  // request_timeout x members, and a little
  EXPECT_FALSE(store->reachable(300ms));
}

// ---- TLS and authentication ----

TEST_F(EtcdStoreTest, TlsWithClientCertificatesAndAuthentication) {
  const TlsFiles tls = make_certificates(dir_);
  // Tokens expire after 2 s unused: the store must authenticate again.
  const auto endpoints = start_cluster(1, &tls, {"--auth-token-ttl", "2"});
  const std::string etcdctl = std::string(kEtcdctl) + " --endpoints https://" + endpoints[0] + " --cacert " + tls.ca +
                              " --cert " + tls.client_cert + " --key " + tls.client_key;
  run_shell(etcdctl + " user add root:pw >/dev/null && " + etcdctl + " user grant-role root root >/dev/null && " +
            etcdctl + " auth enable >/dev/null");

  EtcdOptions o = options(endpoints, "/secure/");
  o.https = true;
  o.cacert = tls.ca;
  o.cert = tls.client_cert;
  o.key = tls.client_key;
  o.username = "root";
  o.password = "pw";
  {
    EtcdStore store(o);
    store.set("k", "v");
    EXPECT_EQ(store.get("k"), "v");
    EXPECT_EQ(store.add("n", 3), 3);
    std::this_thread::sleep_for(3s);  // the token expires
    EXPECT_EQ(store.get("k"), "v");
    EXPECT_EQ(store.add("n", 1), 4);
  }

  const auto config_error = [&](EtcdOptions changed) -> std::string {
    try {
      EtcdStore store(changed);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "no ConfigError";
  };
  EtcdOptions wrong_password = o;
  wrong_password.password = "not-pw";
  EXPECT_TRUE(mentions(config_error(wrong_password), "password"));
  EXPECT_TRUE(mentions(config_error(wrong_password), "'root'"));

  EtcdOptions no_user = o;
  no_user.username.clear();
  no_user.password.clear();
  EXPECT_TRUE(mentions(config_error(no_user), "username="));

  EtcdOptions no_cacert = o;
  no_cacert.cacert.clear();
  EXPECT_TRUE(mentions(config_error(no_cacert), "cacert="));

  EtcdOptions no_client_cert = o;
  no_client_cert.cert.clear();
  no_client_cert.key.clear();
  EXPECT_TRUE(mentions(config_error(no_client_cert), "cert="));

  EtcdOptions named_cert = o;
  named_cert.cert = tls.named_client_cert;
  named_cert.key = tls.named_client_key;
  EXPECT_TRUE(mentions(config_error(named_cert), "Common Name"));

  EtcdOptions plain_http = o;
  plain_http.https = false;
  plain_http.cacert = plain_http.cert = plain_http.key = "";
  plain_http.request_timeout = 1s;
  try {
    EtcdStore store(plain_http);
    ADD_FAILURE() << "http to an https member worked";
  } catch (const TimeoutError& e) {
    EXPECT_TRUE(mentions(e.what(), "https"));
  }
}

TEST_F(EtcdStoreTest, AServerThatIsNotEtcdIsAConfigError) {
  // Answers every request with a 404 page, as a web server would.
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t length = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &length);
  std::thread server([listener] {
    const int fd = ::accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    char buffer[4096];
    (void)::recv(fd, buffer, sizeof buffer, 0);
    const std::string reply = "HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nNot Found";
    (void)::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
    ::close(fd);
  });
  try {
    EtcdStore store(options({"127.0.0.1:" + std::to_string(ntohs(addr.sin_port))}, "/x/"));
    ADD_FAILURE() << "a web server passed for etcd";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(mentions(e.what(), "not etcd"));
    EXPECT_TRUE(mentions(e.what(), "404"));
  }
  ::shutdown(listener, SHUT_RDWR);
  server.join();
  ::close(listener);
}

TEST(EtcdOptionsCheck, BadOptionsAreConfigErrors) {
  EtcdOptions o;
  o.prefix = "/job/";
  EXPECT_THROW(EtcdStore{o}, ConfigError);  // no endpoint
  o.endpoints = {"127.0.0.1:1"};
  o.prefix = "/job";
  EXPECT_THROW(EtcdStore{o}, ConfigError);  // prefix without '/'
  o.prefix = "/job/";
  o.cacert = "/nonexistent/ca.crt";
  EXPECT_THROW(EtcdStore{o}, ConfigError);  // TLS file without https
  o.https = true;
  try {
    EtcdStore store(o);
    ADD_FAILURE() << "a missing cacert file was accepted";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(mentions(e.what(), "cacert=/nonexistent/ca.crt"));
  }
}

// ---- --rdzv-endpoint ----

TEST(ParseEtcdEndpoints, ListsPortsSchemesAndIpv6) {
  bool https = false;
  EXPECT_EQ(parse_etcd_endpoints("a", &https), std::vector<std::string>{"a:2379"});
  EXPECT_FALSE(https);
  EXPECT_EQ(parse_etcd_endpoints("a:1234, b ,c:5", &https),
            (std::vector<std::string>{"a:1234", "b:2379", "c:5"}));
  EXPECT_EQ(parse_etcd_endpoints("http://a:1,http://b/", &https), (std::vector<std::string>{"a:1", "b:2379"}));
  EXPECT_FALSE(https);
  EXPECT_EQ(parse_etcd_endpoints("https://a:1,https://b", &https), (std::vector<std::string>{"a:1", "b:2379"}));
  EXPECT_TRUE(https);
  https = false;
  EXPECT_EQ(parse_etcd_endpoints("[::1]:2400,[fe80::1]", &https),
            (std::vector<std::string>{"[::1]:2400", "[fe80::1]:2379"}));
  https = true;  // protocol=https
  EXPECT_EQ(parse_etcd_endpoints("a", &https), std::vector<std::string>{"a:2379"});
  EXPECT_TRUE(https);
}

TEST(ParseEtcdEndpoints, BadListsAreConfigErrors) {
  for (const std::string bad : {"", " ", ",", "a,,b", "a:", "a:0", "a:65536", "a:x", "a:+1", ":2379", "::1",
                                "[::1", "[::1]x", "[]:1", "http://a,https://b"}) {
    bool https = false;
    EXPECT_THROW(parse_etcd_endpoints(bad, &https), ConfigError) << bad;
  }
  bool https = true;
  EXPECT_THROW(parse_etcd_endpoints("http://a", &https), ConfigError);
}

}  // namespace
}  // namespace lockstep::cli
