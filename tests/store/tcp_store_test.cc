// TcpStore specifics: many concurrent clients, bounded messages, tokens, and
// the errors a user sees when the store cannot be reached or hosted.
#include <gtest/gtest.h>

#include <sys/socket.h>

#include <thread>

#include "common/clock.h"
#include "common/socket.h"
#include "harness/thread_world.h"
#include "lockstep/error.h"
#include "lockstep/store.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;

TEST(TcpStore, HundredsOfConcurrentClients) {
  TcpStoreServer server("127.0.0.1", 0);
  constexpr int kThreads = 16, kClientsPerThread = 20;  // 320 connections at once
  std::vector<std::vector<std::unique_ptr<TcpStore>>> clients(kThreads);
  // Releases the clients once all have joined: a barrier across 320 clients.
  std::thread releaser([&] {
    TcpStore main("127.0.0.1", server.port());
    const Deadline deadline = Deadline::after(30s);
    while (main.add("joined", 0) < kThreads * kClientsPerThread && !deadline.expired())
      std::this_thread::sleep_for(1ms);
    EXPECT_GE(server.num_clients(), static_cast<std::size_t>(kThreads * kClientsPerThread));
    main.set("all", "yes");
  });
  auto errors = testing::run_threads(kThreads, [&](int t) {
    for (int c = 0; c < kClientsPerThread; ++c)
      clients[static_cast<std::size_t>(t)].push_back(std::make_unique<TcpStore>("127.0.0.1", server.port()));
    for (auto& client : clients[static_cast<std::size_t>(t)]) client->add("joined", 1);
    for (auto& client : clients[static_cast<std::size_t>(t)]) {
      client->wait({"all"}, 30s);
      EXPECT_EQ(client->get("all"), "yes");
    }
  });
  releaser.join();
  for (auto& e : errors) EXPECT_FALSE(e);
}

TEST(TcpStore, OversizedRequestIsRefusedAndTheServerLivesOn) {
  TcpStoreOptions options;
  options.max_value_bytes = 1024;
  TcpStoreServer server("127.0.0.1", 0, options);
  TcpStore client("127.0.0.1", server.port(), options);
  EXPECT_THROW(client.set("big", std::string(10000, 'x')), Error);
  // A raw peer announcing a 4 GiB frame is cut off without the server allocating it.
  Socket raw = connect_tcp("127.0.0.1", server.port(), Deadline::after(5s));
  const unsigned char huge[4] = {0xff, 0xff, 0xff, 0xff};
  ASSERT_EQ(send_all(raw.fd(), huge, 4, Deadline::after(5s)).status, IoStatus::ok);
  char buf[256];
  (void)recv_all(raw.fd(), buf, sizeof buf, Deadline::after(5s));  // the refusal, then the close
  EXPECT_TRUE(peer_hung_up(raw.fd()));
  TcpStore fresh("127.0.0.1", server.port(), options);
  fresh.set("small", "ok");
  EXPECT_EQ(fresh.get("small"), "ok");
}

TEST(TcpStore, GarbageFromAPeerDoesNotDisturbOthers) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStore good("127.0.0.1", server.port());
  Socket raw = connect_tcp("127.0.0.1", server.port(), Deadline::after(5s));
  const std::string junk = std::string("\x05\x00\x00\x00", 4) + "hello";
  ASSERT_EQ(send_all(raw.fd(), junk.data(), junk.size(), Deadline::after(5s)).status, IoStatus::ok);
  good.set("k", "v");
  EXPECT_EQ(good.get("k"), "v");
}

TEST(TcpStore, TokenIsRequiredWhenConfigured) {
  TcpStoreOptions secret;
  secret.token = "s3cret";
  TcpStoreServer server("127.0.0.1", 0, secret);
  TcpStore right("127.0.0.1", server.port(), secret);
  right.set("k", "v");
  TcpStoreOptions wrong;
  wrong.token = "guess";
  try {
    TcpStore bad("127.0.0.1", server.port(), wrong);
    FAIL() << "a wrong token was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("token"), std::string::npos) << e.what();
  }
  EXPECT_THROW(TcpStore("127.0.0.1", server.port()), ConfigError);  // no token at all
}

TEST(TcpStore, UnreachableServerIsAConfigErrorAfterTheConnectTimeout) {
  const Socket probe = listen_tcp("127.0.0.1", 0);
  const auto port = local_port(probe.fd());
  const_cast<Socket&>(probe).close();  // nothing listens there now
  TcpStoreOptions options;
  options.connect_timeout = 500ms;
  const auto start = Clock::now();
  try {
    TcpStore client("127.0.0.1", port, options);
    FAIL() << "connected to nothing";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot connect"), std::string::npos) << e.what();
  }
  const double waited = seconds_between(start, Clock::now());
  EXPECT_GE(waited, 0.4);
  EXPECT_LT(waited, 5.0);
}

TEST(TcpStore, PortInUseIsAConfigError) {
  TcpStoreServer first("127.0.0.1", 0);
  try {
    TcpStoreServer second("127.0.0.1", first.port());
    FAIL() << "two servers on one port";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("in use"), std::string::npos) << e.what();
  }
}

// Whoever hosts the store listens on loopback only when MASTER_ADDR is a
// loopback address; this decides it.
TEST(TcpStore, LoopbackHostsAreToldApartFromOthers) {
  EXPECT_TRUE(is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(is_loopback_host("127.0.1.1"));
  EXPECT_TRUE(is_loopback_host("::1"));
  EXPECT_TRUE(is_loopback_host("localhost"));  // by name, also without /etc/hosts
  EXPECT_TRUE(is_loopback_host("LocalHost"));
  EXPECT_TRUE(is_loopback_host("node.localhost"));
  EXPECT_FALSE(is_loopback_host(""));  // every interface
  EXPECT_FALSE(is_loopback_host("0.0.0.0"));
  EXPECT_FALSE(is_loopback_host("10.1.2.3"));
  EXPECT_FALSE(is_loopback_host("no-such-host.invalid"));
}

TEST(TcpStore, LostServerIsAPeerError) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  TcpStore client("127.0.0.1", server->port());
  client.set("k", "v");
  server.reset();
  EXPECT_THROW(client.get("k"), PeerError);
}

}  // namespace
}  // namespace lockstep
