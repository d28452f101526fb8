// Socket faults at exact points, through an injected Os: a short write, a
// reset connection, a stalled peer, a refused server and a clock jump each
// give the exact result within the exact deadline, and take no real time.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <cerrno>
#include <numeric>
#include <string>
#include <vector>

#include "common/socket.h"
#include "faults/faulty_os.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::FaultyOs;
using Call = FaultyOs::Call;

// Both ends of a connected stream, non-blocking as lockstep's sockets are.
struct SocketPair {
  SocketPair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a = UniqueFd(fds[0]);
    b = UniqueFd(fds[1]);
    set_nonblocking(a.fd());
    set_nonblocking(b.fd());
  }
  UniqueFd a, b;
};

std::vector<char> pattern(std::size_t n) {
  std::vector<char> bytes(n);
  std::iota(bytes.begin(), bytes.end(), 0);
  return bytes;
}

// Real time a call took: none of these faults may wait for real.
template <typename F>
double real_seconds(F f) {
  const auto start = Clock::now();
  f();
  return seconds_between(start, Clock::now());
}

TEST(SocketFaults, ShortWritesStillDeliverEveryByteInOrder) {
  SocketPair pair;
  FaultyOs os;
  os.shorten(Call::send, 1, 7);  // every send takes at most 7 bytes
  const auto sent = pattern(1000);
  ASSERT_EQ(send_all(pair.a.fd(), sent.data(), sent.size(), Deadline::after(10s), os).status, IoStatus::ok);
  EXPECT_EQ(os.calls(Call::send), 143);  // ceil(1000 / 7): each short write is resumed where it stopped
  std::vector<char> received(sent.size());
  ASSERT_EQ(recv_all(pair.b.fd(), received.data(), received.size(), Deadline::after(10s)).status, IoStatus::ok);
  EXPECT_EQ(received, sent);
}

TEST(SocketFaults, ShortReadsStillFillTheBuffer) {
  SocketPair pair;
  FaultyOs os;
  os.shorten(Call::recv, 1, 3);
  const auto sent = pattern(100);
  ASSERT_EQ(send_all(pair.a.fd(), sent.data(), sent.size(), Deadline::after(10s)).status, IoStatus::ok);
  std::vector<char> received(sent.size());
  ASSERT_EQ(recv_all(pair.b.fd(), received.data(), received.size(), Deadline::after(10s), os).status, IoStatus::ok);
  EXPECT_EQ(received, sent);
  EXPECT_EQ(os.calls(Call::recv), 34);
}

TEST(SocketFaults, ResetMidMessageIsAClosedConnectionNotATimeout) {
  SocketPair pair;
  FaultyOs os;
  os.shorten(Call::recv, 1, 10);
  os.fail(Call::recv, 3, ECONNRESET);  // after 20 of the 50 bytes
  const auto sent = pattern(50);
  ASSERT_EQ(send_all(pair.a.fd(), sent.data(), sent.size(), Deadline::after(10s)).status, IoStatus::ok);
  std::vector<char> received(sent.size());
  IoResult r;
  const double seconds =
      real_seconds([&] { r = recv_all(pair.b.fd(), received.data(), received.size(), Deadline::never(), os); });
  EXPECT_EQ(r.status, IoStatus::closed);
  EXPECT_EQ(r.error, ECONNRESET);
  EXPECT_EQ(os.calls(Call::recv), 3);
  EXPECT_LT(seconds, 1.0);
}

TEST(SocketFaults, ResetOnSendIsAClosedConnection) {
  SocketPair pair;
  FaultyOs os;
  os.fail(Call::send, 1, EPIPE);
  const char byte = 1;
  const IoResult r = send_all(pair.a.fd(), &byte, 1, Deadline::never(), os);
  EXPECT_EQ(r.status, IoStatus::closed);
  EXPECT_EQ(r.describe(), "connection closed by peer");
}

// A peer that stops answering: the receive gives up exactly at its
// deadline, measured on the injected clock, without waiting for real.
TEST(SocketFaults, StalledPeerTimesOutExactlyAtTheDeadline) {
  SocketPair pair;
  FaultyOs os;
  os.stall_polls_from(1);
  char byte = 0;
  IoResult r;
  const Deadline deadline = Deadline::starting_at(os.now(), 30s);
  const double seconds = real_seconds([&] { r = recv_all(pair.b.fd(), &byte, 1, deadline, os); });
  EXPECT_EQ(r.status, IoStatus::timeout);
  // One wait, for all the time left: it ended at the deadline, not before.
  EXPECT_EQ(os.calls(Call::poll), 1);
  EXPECT_TRUE(deadline.expired_at(os.now()));
  EXPECT_NEAR(std::chrono::duration<double>(os.ahead()).count(), 30.0, 0.05);
  EXPECT_LT(seconds, 1.0);
}

// The clock jumps forward while a receive waits (its poll is interrupted):
// the deadline is read on that clock, so the wait ends at once.
TEST(SocketFaults, ClockJumpPastTheDeadlineEndsTheWait) {
  SocketPair pair;
  FaultyOs os;
  os.fail(Call::poll, 1, EINTR);
  os.jump_clock_after(Call::poll, 1, 2h);
  char byte = 0;
  IoResult r;
  const double seconds =
      real_seconds([&] { r = recv_all(pair.b.fd(), &byte, 1, Deadline::starting_at(os.now(), 1h), os); });
  EXPECT_EQ(r.status, IoStatus::timeout);
  EXPECT_EQ(os.calls(Call::poll), 2);  // the interrupted one, then one with no time left
  EXPECT_LT(seconds, 1.0);
}

// A server that refuses every connection: connect_tcp retries with backoff
// until its deadline, then names the address and the reason. The backoff
// sleeps on the injected clock, so a minute passes in no time.
TEST(SocketFaults, RefusedServerIsAConfigErrorAfterTheConnectTimeout) {
  Socket listener = listen_tcp("127.0.0.1", 0);
  const std::uint16_t port = local_port(listener.fd());
  FaultyOs os;
  os.fail_from(Call::connect, 1, ECONNREFUSED);
  const Deadline deadline = Deadline::starting_at(os.now(), 60s);
  const double seconds = real_seconds([&] {
    try {
      connect_tcp("127.0.0.1", port, deadline, os);
      ADD_FAILURE() << "connected through a refused connect";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()), "cannot connect to 127.0.0.1:" + std::to_string(port) +
                                           ": Connection refused (gave up after the connect timeout)");
    }
  });
  EXPECT_TRUE(deadline.expired_at(os.now()));
  EXPECT_NEAR(std::chrono::duration<double>(os.ahead()).count(), 60.0, 0.05);  // the last backoff is cut to it
  EXPECT_GT(os.calls(Call::connect), 50);  // 10 ms doubling to 1 s: about 60 attempts in a minute
  EXPECT_LT(seconds, 1.0);
}

TEST(SocketFaults, ConnectSucceedsOnceTheServerStopsRefusing) {
  Socket listener = listen_tcp("127.0.0.1", 0);
  FaultyOs os;
  os.fail(Call::connect, 1, ECONNREFUSED);
  Socket s = connect_tcp("127.0.0.1", local_port(listener.fd()), Deadline::starting_at(os.now(), 60s), os);
  EXPECT_TRUE(s.valid());
  EXPECT_EQ(os.calls(Call::connect), 2);
  EXPECT_EQ(os.ahead(), Duration(10ms));  // one backoff step
}

TEST(SocketFaults, AcceptWithNobodyConnectingReturnsNoSocketAtTheDeadline) {
  Socket listener = listen_tcp("127.0.0.1", 0);
  FaultyOs os;
  os.stall_polls_from(1);
  const Deadline deadline = Deadline::starting_at(os.now(), 45s);
  const Socket s = accept_tcp(listener, deadline, os);
  EXPECT_FALSE(s.valid());
  EXPECT_TRUE(deadline.expired_at(os.now()));
  EXPECT_NEAR(std::chrono::duration<double>(os.ahead()).count(), 45.0, 0.05);
}

TEST(SocketFaults, AcceptFailingHardIsAPeerError) {
  Socket listener = listen_tcp("127.0.0.1", 0);
  FaultyOs os;
  os.fail(Call::accept, 1, EMFILE);
  try {
    accept_tcp(listener, Deadline::after(10s), os);
    FAIL() << "no PeerError";
  } catch (const PeerError& e) {
    EXPECT_EQ(std::string(e.what()), "accept failed: Too many open files");
  }
}

}  // namespace
}  // namespace lockstep
