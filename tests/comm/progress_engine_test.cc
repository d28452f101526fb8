// The progress engine's deferred completions (OpContext::defer), which the
// nccl backend uses so that the device gets bucket after bucket with no
// host wait between them: later operations start while earlier ones are
// outstanding, Works complete in issue order whatever order the device
// finishes in, an error or a passed deadline fails the operation (and the
// engine, as any failure does), an abort fails what is outstanding, and
// stopping waits for it. The completions here are the engine's interface
// driven by the test (when "the device" is done), on the real engine.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/progress_engine.h"
#include "harness/manual_clock.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using detail::ProgressEngine;
using testing::advance_until;
using testing::ManualClock;

// Done when the test says so, or failing with `fail` once set.
class Switch final : public PendingCompletion {
 public:
  explicit Switch(std::shared_ptr<std::atomic<int>> state) : state_(std::move(state)) {}
  // state: 0 running, 1 done, 2 failed.
  bool poll(const OpContext& op) override {
    if (state_->load() == 2) throw Error(op.description() + ": the device failed");
    return state_->load() == 1;
  }

 private:
  std::shared_ptr<std::atomic<int>> state_;
};

OpInfo large_allreduce() {
  OpInfo info;
  info.count = 1 << 20;
  return info;
}

bool eventually(const std::function<bool()>& done, std::chrono::milliseconds limit = 10s) {
  const auto give_up = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// Operations submitted to one engine that each leave a Switch behind, the
// Works they return, and the order they started in.
struct DeferredOps {
  explicit DeferredOps(ProgressEngine& e) : engine(e) {}
  // Submits one (`id` recorded when it starts); returns its state.
  std::shared_ptr<std::atomic<int>> submit(int id) {
    auto state = std::make_shared<std::atomic<int>>(0);
    works.push_back(engine.submit(large_allreduce(), [this, state, id](const OpContext& op) {
      {
        std::lock_guard lock(mutex);
        started.push_back(id);
      }
      ASSERT_NE(op.defer, nullptr);
      *op.defer = std::make_unique<Switch>(state);
    }));
    return state;
  }
  // Whether `n` operations have started, within 10 s.
  bool started_within(std::size_t n) {
    return eventually([&] {
      std::lock_guard lock(mutex);
      return started.size() == n;
    });
  }
  ProgressEngine& engine;
  std::vector<std::shared_ptr<Work>> works;
  std::vector<int> started;
  std::mutex mutex;
};

TEST(DeferredCompletion, LaterOperationsStartWhileEarlierOnesAreOutstandingAndCompleteInIssueOrder) {
  ProgressEngine engine("test", 30s, 0);
  DeferredOps ops(engine);
  auto& works = ops.works;
  auto first = ops.submit(0);
  auto second = ops.submit(1);
  // A host operation that finishes at once, behind the two.
  std::atomic<bool> third_ran{false};
  works.push_back(engine.submit(large_allreduce(), [&](const OpContext&) { third_ran = true; }));
  ASSERT_TRUE(eventually([&] { return third_ran.load(); })) << "the third operation never started";
  {
    std::lock_guard lock(ops.mutex);
    EXPECT_EQ(ops.started, (std::vector<int>{0, 1}));
  }
  // The device finishes the second first: nothing completes before the first.
  second->store(1);
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(works[0]->done());
  EXPECT_FALSE(works[1]->done());
  EXPECT_FALSE(works[2]->done()) << "an operation completed before one issued earlier";
  std::vector<std::uint64_t> completed;
  for (auto& w : works) w->on_complete([&](const Work& done) {
    std::lock_guard lock(ops.mutex);
    completed.push_back(done.seq());
  });
  first->store(1);
  for (auto& w : works) w->wait(10s);
  std::lock_guard lock(ops.mutex);
  EXPECT_EQ(completed, (std::vector<std::uint64_t>{0, 1, 2}));
}

TEST(DeferredCompletion, ADeviceErrorFailsItsOperationAndTheOnesAfterIt) {
  ProgressEngine engine("test", 30s, 0);
  DeferredOps ops(engine);
  auto& works = ops.works;
  auto first = ops.submit(0);
  auto second = ops.submit(1);
  ASSERT_TRUE(ops.started_within(2));
  first->store(2);
  EXPECT_THROW(works[0]->wait(10s), Error);
  // The engine is aborted: the outstanding one fails with the first error
  // without waiting for its device, and so does anything issued later.
  try {
    works[1]->wait(10s);
    FAIL() << "the operation after the failed one succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the device failed"), std::string::npos) << e.what();
  }
  auto later = engine.submit(large_allreduce(), [](const OpContext&) {});
  EXPECT_THROW(later->wait(10s), Error);
  EXPECT_TRUE(engine.aborted());
}

TEST(DeferredCompletion, AnOperationPastItsDeadlineFailsNamingItself) {
  ManualClock clock;
  ProgressEngine engine("rank 0", 2s, 0, {}, nullptr, nullptr, clock);
  DeferredOps ops(engine);
  auto& works = ops.works;
  auto never = ops.submit(0);
  ASSERT_TRUE(advance_until(clock, 100ms, [&] { return works[0]->done(); }));
  try {
    works[0]->wait(1s);
    FAIL() << "an operation the device never finished succeeded";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("allreduce #0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2000 ms"), std::string::npos) << e.what();
  }
}

TEST(DeferredCompletion, AnAbortFailsWhatIsOutstandingAndStoppingWaitsForIt) {
  {
    ProgressEngine engine("test", 30s, 0);
    DeferredOps ops(engine);
    auto& works = ops.works;
    auto stuck = ops.submit(0);
    ASSERT_TRUE(ops.started_within(1));
    engine.abort(std::make_exception_ptr(PeerError("rank 1 died")));
    try {
      works[0]->wait(10s);
      FAIL() << "an outstanding operation survived the abort";
    } catch (const PeerError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1 died"), std::string::npos);
    }
  }
  // Stopping a healthy engine completes what is outstanding first.
  auto engine = std::make_unique<ProgressEngine>("test", 30s, 0);
  DeferredOps ops(*engine);
  auto& works = ops.works;
  auto slow = ops.submit(0);
  std::thread device([slow] {
    std::this_thread::sleep_for(50ms);
    slow->store(1);
  });
  engine->drain_and_stop();
  EXPECT_TRUE(works[0]->done());
  EXPECT_NO_THROW(works[0]->wait(1s));
  device.join();
}

TEST(DeferredCompletion, OperationsRunOnTheIssuingThreadCannotDefer) {
  // Small operations on an idle group run inline: no defer slot, and none
  // while an operation is outstanding (it would complete out of order).
  ProgressEngine engine("test", 30s, 1 << 10);
  OpInfo small;
  small.count = 4;
  std::atomic<bool> had_slot{true};
  engine.submit(small, [&](const OpContext& op) { had_slot = op.defer != nullptr; })->wait(10s);
  EXPECT_FALSE(had_slot.load());
  DeferredOps ops(engine);
  auto& works = ops.works;
  auto outstanding = ops.submit(0);
  ASSERT_TRUE(ops.started_within(1));
  const auto issuer = std::this_thread::get_id();
  std::atomic<bool> ran_inline{true};
  auto small_work = engine.submit(small, [&](const OpContext&) { ran_inline = std::this_thread::get_id() == issuer; });
  ASSERT_TRUE(eventually([&] { return !ran_inline.load() || small_work->done(); }));
  EXPECT_FALSE(small_work->done()) << "it completed before the outstanding operation issued earlier";
  outstanding->store(1);
  small_work->wait(10s);
  EXPECT_FALSE(ran_inline.load());
}

}  // namespace
}  // namespace lockstep
