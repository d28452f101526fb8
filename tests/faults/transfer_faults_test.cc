// Faults in the tcp backend's data pump (comm/tcp/transfer.cc), injected at
// exact points on rank 0 of a two-rank mesh of threads: short sends and
// receives still give the exact sum, a reset connection is a PeerError
// naming the peer, and a peer that stops answering (or a clock jump) is a
// TimeoutError naming it at the operation's deadline, in no real time.
#include <gtest/gtest.h>

#include <cerrno>
#include <algorithm>
#include <future>
#include <numeric>
#include <thread>
#include <vector>

#include "comm/tcp/tcp_backend.h"
#include "faults/faulty_os.h"
#include "lockstep/error.h"
#include "lockstep/store.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::FaultyOs;
using Call = FaultyOs::Call;

BackendContext context(int rank, const std::shared_ptr<Store>& store, Os& os) {
  BackendContext ctx;
  ctx.rank = rank;
  ctx.size = 2;
  ctx.store = store;
  ctx.group_key = "transfer-faults";
  ctx.timeout = 30s;
  ctx.connect_timeout = 30s;
  ctx.listen_address = "127.0.0.1";
  ctx.os = &os;
  return ctx;
}

OpContext allreduce_op(std::size_t count, Os& os) {
  OpContext op;
  op.seq = 1;
  op.info.collective = Collective::allreduce;
  op.info.dtype = DType::f32;
  op.info.count = count;
  op.timeout = 30s;
  op.deadline = Deadline::starting_at(os.now(), op.timeout);
  return op;
}

// Rank 1 on a thread with the real Os: sets up its side of the mesh, then
// runs `body` (its part of the test) and reports what it threw.
class PeerRank {
 public:
  PeerRank(const std::shared_ptr<Store>& store, std::function<void(TcpBackend&)> body)
      : thread_([this, store, body = std::move(body)] {
          try {
            TcpBackend backend(context(1, store, Os::real()));
            body(backend);
          } catch (...) {
            error_ = std::current_exception();
          }
        }) {}
  ~PeerRank() {
    if (thread_.joinable()) thread_.join();
  }
  std::exception_ptr join() {
    thread_.join();
    return error_;
  }

 private:
  std::exception_ptr error_;
  std::thread thread_;
};

template <typename F>
double real_seconds(F f) {
  const auto start = Clock::now();
  f();
  return seconds_between(start, Clock::now());
}

TEST(TransferFaults, ShortSendsAndReceivesStillGiveTheExactSum) {
  constexpr std::size_t kCount = 1 << 18;  // 1 MiB: the ring, many pieces per socket call
  auto store = std::make_shared<HashStore>();
  FaultyOs os;
  PeerRank peer(store, [&](TcpBackend& backend) {
    std::vector<float> v(kCount, 2.0f);
    backend.allreduce(allreduce_op(kCount, Os::real()), Buffer{v.data(), kCount, DType::f32}, ReduceOp::sum);
    EXPECT_EQ(std::count(v.begin(), v.end(), 3.0f), static_cast<long>(kCount));
  });
  TcpBackend backend(context(0, store, os));
  os.shorten(Call::send, os.calls(Call::send) + 1, 1000);
  os.shorten(Call::recv, os.calls(Call::recv) + 1, 999);
  std::vector<float> v(kCount, 1.0f);
  backend.allreduce(allreduce_op(kCount, os), Buffer{v.data(), kCount, DType::f32}, ReduceOp::sum);
  EXPECT_EQ(std::count(v.begin(), v.end(), 3.0f), static_cast<long>(kCount));
  EXPECT_GT(os.calls(Call::send), 500);  // half the buffer went out 1000 bytes at a time
  EXPECT_FALSE(peer.join());
}

TEST(TransferFaults, ResetConnectionIsAPeerErrorNamingThePeer) {
  auto store = std::make_shared<HashStore>();
  FaultyOs os;
  PeerRank peer(store, [&](TcpBackend& backend) {
    std::vector<float> v(4, 1.0f);
    backend.allreduce(allreduce_op(4, Os::real()), Buffer{v.data(), 4, DType::f32}, ReduceOp::sum);
  });
  {
    TcpBackend backend(context(0, store, os));
    os.fail(Call::recv, os.calls(Call::recv) + 1, ECONNRESET);
    std::vector<float> v(4, 1.0f);
    try {
      backend.allreduce(allreduce_op(4, os), Buffer{v.data(), 4, DType::f32}, ReduceOp::sum);
      FAIL() << "no PeerError";
    } catch (const PeerError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("rank 0/2: allreduce #1", 0), 0u) << what;
      EXPECT_NE(what.find("lost rank 1: receiving failed (Connection reset by peer)"), std::string::npos) << what;
    }
  }  // rank 0's connections close: rank 1, waiting for its data, loses it
  const auto error = peer.join();
  ASSERT_TRUE(error);
  EXPECT_THROW(std::rethrow_exception(error), PeerError);
}

// Rank 1 never joins the allreduce: rank 0 waits exactly until the
// operation's deadline on its clock, then names rank 1.
TEST(TransferFaults, PeerThatNeverAnswersIsATimeoutNamingItAtTheDeadline) {
  auto store = std::make_shared<HashStore>();
  FaultyOs os;
  std::promise<void> done;
  PeerRank peer(store, [released = done.get_future().share()](TcpBackend&) { released.wait(); });
  TcpBackend backend(context(0, store, os));
  os.stall_polls_from(os.calls(Call::poll) + 1);
  std::vector<float> v(4, 1.0f);
  const OpContext op = allreduce_op(4, os);
  const double seconds = real_seconds([&] {
    try {
      backend.allreduce(op, Buffer{v.data(), 4, DType::f32}, ReduceOp::sum);
      ADD_FAILURE() << "no TimeoutError";
    } catch (const TimeoutError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rank 0/2: allreduce #1 (float x 4, sum) timed out after 30.0 s"), std::string::npos)
          << what;
      EXPECT_NE(what.find("Rank 1 is stuck"), std::string::npos) << what;
    }
  });
  EXPECT_TRUE(op.deadline.expired_at(os.now()));
  EXPECT_NEAR(std::chrono::duration<double>(os.ahead()).count(), 30.0, 0.05);
  EXPECT_LT(seconds, 1.0);
  done.set_value();
  EXPECT_FALSE(peer.join());
}

// The clock jumps an hour once rank 0 has sent its first bytes: the wait
// for rank 1 (which sends nothing) ends at once as a timeout.
TEST(TransferFaults, ClockJumpPastTheDeadlineEndsTheOperation) {
  auto store = std::make_shared<HashStore>();
  FaultyOs os;
  std::promise<void> done;
  PeerRank peer(store, [released = done.get_future().share()](TcpBackend&) { released.wait(); });
  TcpBackend backend(context(0, store, os));
  os.jump_clock_after(Call::send, os.calls(Call::send) + 1, 1h);
  std::vector<float> v(4, 1.0f);
  const double seconds = real_seconds([&] {
    EXPECT_THROW(backend.allreduce(allreduce_op(4, os), Buffer{v.data(), 4, DType::f32}, ReduceOp::sum),
                 TimeoutError);
  });
  EXPECT_LT(seconds, 1.0);
  done.set_value();
  EXPECT_FALSE(peer.join());
}

}  // namespace
}  // namespace lockstep
