// TcpStore client faults at exact points, through an injected Os, against a
// real server: short writes are resumed, a reset connection is a PeerError
// naming the store, a stalled server and a clock jump are TimeoutErrors at
// the request's deadline, and none of it waits for real.
#include <gtest/gtest.h>

#include <cerrno>
#include <string>

#include "faults/faulty_os.h"
#include "lockstep/error.h"
#include "lockstep/store.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::FaultyOs;
using Call = FaultyOs::Call;

class StoreFaults : public ::testing::Test {
 protected:
  std::unique_ptr<TcpStore> client() {
    TcpStoreOptions options;
    options.os = &os_;
    return std::make_unique<TcpStore>("127.0.0.1", server_.port(), options);
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(server_.port()); }

  TcpStoreServer server_{"127.0.0.1", 0};
  FaultyOs os_;
};

template <typename F>
double real_seconds(F f) {
  const auto start = Clock::now();
  f();
  return seconds_between(start, Clock::now());
}

TEST_F(StoreFaults, ShortWritesOnEveryRequestStillReachTheServer) {
  os_.shorten(Call::send, 1, 5);
  auto store = client();
  const std::string value(10000, 'v');
  store->set("key", value);
  EXPECT_EQ(store->get("key"), value);
  EXPECT_GT(os_.calls(Call::send), 2000);  // the 10 kB value went 5 bytes at a time
}

TEST_F(StoreFaults, ResetConnectionIsAPeerErrorNamingTheStore) {
  auto store = client();
  store->set("key", "1");
  os_.fail(Call::recv, os_.calls(Call::recv) + 1, ECONNRESET);  // the next reply
  try {
    store->get("key");
    FAIL() << "no PeerError";
  } catch (const PeerError& e) {
    EXPECT_EQ(std::string(e.what()), "lost the connection to the store at " + endpoint() +
                                         " (connection closed by peer); the process hosting it (the launcher or "
                                         "rank 0) has probably exited or crashed");
  }
  // The stream was dropped mid-message; the next request reconnects.
  EXPECT_EQ(store->get("key"), "1");
}

TEST_F(StoreFaults, ResetWhileSendingIsAPeerError) {
  auto store = client();
  os_.fail(Call::send, os_.calls(Call::send) + 1, ECONNRESET);
  EXPECT_THROW(store->set("key", "1"), PeerError);
}

// The server stops answering: the client gives up at the request's deadline
// (the store timeout plus the 30 s reply grace), measured on the injected
// clock, in no real time.
TEST_F(StoreFaults, StalledServerIsATimeoutAtTheRequestDeadline) {
  auto store = client();
  store->set_timeout(2s);
  os_.stall_polls_from(os_.calls(Call::poll) + 1);
  const double seconds = real_seconds([&] {
    try {
      store->get("missing");
      ADD_FAILURE() << "no TimeoutError";
    } catch (const TimeoutError& e) {
      EXPECT_EQ(std::string(e.what()), "store at " + endpoint() +
                                           " did not answer in time; is the process hosting it (the launcher or "
                                           "rank 0) overloaded or stopped?");
    }
  });
  EXPECT_NEAR(std::chrono::duration<double>(os_.ahead()).count(), 32.0, 0.05);
  EXPECT_LT(seconds, 1.0);
}

// The clock jumps an hour ahead as soon as a ten-minute wait has been sent:
// the client reads its deadline on that clock and gives up at once, while
// the server, on the real clock, is still holding the wait.
TEST_F(StoreFaults, ClockJumpDuringAWaitEndsItAsATimeout) {
  auto store = client();
  os_.jump_clock_after(Call::send, os_.calls(Call::send) + 1, 1h);
  const double seconds = real_seconds([&] { EXPECT_THROW(store->wait({"never"}, 10min), TimeoutError); });
  EXPECT_LT(seconds, 1.0);
  EXPECT_EQ(os_.ahead(), Duration(1h));
}

// The server's own timeout is still the one a caller normally sees: with no
// fault, a missing key is a TimeoutError naming it, not a lost store.
TEST_F(StoreFaults, WithoutFaultsAMissingKeyTimesOutNamingIt) {
  auto store = client();
  store->set_timeout(50ms);
  try {
    store->get("absent");
    FAIL() << "no TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("'absent'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(os_.ahead(), Duration(0));
}

TEST_F(StoreFaults, RefusedConnectionIsAConfigErrorAfterTheConnectTimeout) {
  os_.fail_from(Call::connect, 1, ECONNREFUSED);
  TcpStoreOptions options;
  options.os = &os_;
  options.connect_timeout = 20s;
  const double seconds = real_seconds([&] {
    try {
      TcpStore store("127.0.0.1", server_.port(), options);
      ADD_FAILURE() << "connected";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("cannot connect to " + endpoint() + ": Connection refused"),
                std::string::npos)
          << e.what();
    }
  });
  EXPECT_NEAR(std::chrono::duration<double>(os_.ahead()).count(), 20.0, 0.05);
  EXPECT_LT(seconds, 1.0);
}

// accept(2) fails on the server (out of descriptors): it pauses accepting
// instead of failing or spinning, and the waiting client is served after.
TEST(StoreServerFaults, FailedAcceptPausesThenServesTheClient) {
  FaultyOs os;
  os.fail(Call::accept, 1, EMFILE);
  TcpStoreOptions server_options;
  server_options.os = &os;
  TcpStoreServer server("127.0.0.1", 0, server_options);
  TcpStore store("127.0.0.1", server.port());
  store.set("key", "served");
  EXPECT_EQ(store.get("key"), "served");
  EXPECT_GE(os.calls(Call::accept), 2);
}

TEST(StoreServerFaults, ShortWritesOfRepliesStillDeliverThem) {
  FaultyOs os;
  os.shorten(Call::send, 1, 3);
  TcpStoreOptions server_options;
  server_options.os = &os;
  TcpStoreServer server("127.0.0.1", 0, server_options);
  TcpStore store("127.0.0.1", server.port());
  const std::string value(1000, 'r');
  store.set("key", value);
  EXPECT_EQ(store.get("key"), value);
  EXPECT_GT(os.calls(Call::send), 333);
}

}  // namespace
}  // namespace lockstep
