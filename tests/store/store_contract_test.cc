// One contract, every store: the same tests run against HashStore,
// FileStore, TcpStore and PrefixStore.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <limits>

#include "common/clock.h"
#include "harness/blocking_call.h"
#include "harness/thread_world.h"
#include "lockstep/error.h"
#include "lockstep/store.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;

// A store under test plus a way to open another handle on the same data (as
// another rank would).
class StoreUnderTest {
 public:
  virtual ~StoreUnderTest() = default;
  virtual std::shared_ptr<Store> open() = 0;
};

class HashStoreUnderTest : public StoreUnderTest {
 public:
  std::shared_ptr<Store> open() override { return store_; }
  std::shared_ptr<Store> store_ = std::make_shared<HashStore>();
};

class FileStoreUnderTest : public StoreUnderTest {
 public:
  FileStoreUnderTest() {
    char tmpl[] = "/tmp/lockstep-filestore-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  ~FileStoreUnderTest() override { std::filesystem::remove_all(dir_); }
  std::shared_ptr<Store> open() override { return std::make_shared<FileStore>(dir_ + "/store"); }
  std::string dir_;
};

class TcpStoreUnderTest : public StoreUnderTest {
 public:
  std::shared_ptr<Store> open() override { return std::make_shared<TcpStore>("127.0.0.1", server_.port()); }
  TcpStoreServer server_{"127.0.0.1", 0};
};

class PrefixStoreUnderTest : public StoreUnderTest {
 public:
  std::shared_ptr<Store> open() override { return std::make_shared<PrefixStore>("job/7", base_); }
  std::shared_ptr<Store> base_ = std::make_shared<HashStore>();
};

std::unique_ptr<StoreUnderTest> make(const std::string& kind) {
  if (kind == "hash") return std::make_unique<HashStoreUnderTest>();
  if (kind == "file") return std::make_unique<FileStoreUnderTest>();
  if (kind == "tcp") return std::make_unique<TcpStoreUnderTest>();
  return std::make_unique<PrefixStoreUnderTest>();
}

class StoreContract : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<StoreUnderTest> backing_ = make(GetParam());
  std::shared_ptr<Store> store_ = backing_->open();
};

TEST_P(StoreContract, SetThenGetFromAnotherHandle) {
  store_->set("a", "1");
  EXPECT_EQ(backing_->open()->get("a"), "1");
  store_->set("a", "2");  // overwrite
  EXPECT_EQ(store_->get("a"), "2");
}

TEST_P(StoreContract, ValuesMayHoldAnyBytes) {
  const std::string binary("\0\x01\xff\n\0end", 8);
  store_->set("bin", binary);
  EXPECT_EQ(backing_->open()->get("bin"), binary);
  store_->set("empty", "");
  EXPECT_EQ(store_->get("empty"), "");
}

TEST_P(StoreContract, GetWaitsForALaterSet) {
  auto other = backing_->open();
  std::string value;
  testing::BlockingCall get([&] { value = store_->get("late"); });
  EXPECT_TRUE(get.blocked()) << "get returned (or never blocked) before the key was set";
  other->set("late", "here");
  get.join();
  EXPECT_EQ(value, "here");
}

TEST_P(StoreContract, GetTimesOutNamingTheKey) {
  store_->set_timeout(200ms);
  const auto start = Clock::now();
  try {
    store_->get("never");
    FAIL() << "no TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos) << e.what();
  }
  EXPECT_LT(seconds_between(start, Clock::now()), 5.0);
}

TEST_P(StoreContract, AddCountsFromZeroAndReturnsTheNewValue) {
  EXPECT_EQ(store_->add("n", 5), 5);
  EXPECT_EQ(store_->add("n", -2), 3);
  EXPECT_EQ(backing_->open()->add("n", 0), 3);
  EXPECT_EQ(store_->get("n"), "3");
}

TEST_P(StoreContract, AddOnANonIntegerIsAnInvalidArgument) {
  store_->set("word", "hello");
  EXPECT_THROW(store_->add("word", 1), InvalidArgument);
}

// Past INT64_MAX (or below INT64_MIN) an add would wrap around silently, or
// be undefined behaviour in the server; it is refused instead, naming the
// key, and the counter keeps its value.
TEST_P(StoreContract, AddThatWouldOverflowIsAnInvalidArgumentNamingTheKey) {
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  const std::int64_t min = std::numeric_limits<std::int64_t>::min();
  store_->set("big", std::to_string(max));
  try {
    store_->add("big", 1);
    FAIL() << "add past INT64_MAX was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("big'"), std::string::npos) << e.what();  // a PrefixStore's full key
    EXPECT_NE(std::string(e.what()).find("overflow"), std::string::npos) << e.what();
  }
  EXPECT_EQ(store_->get("big"), std::to_string(max));
  EXPECT_EQ(store_->add("big", -1), max - 1);
  store_->set("small", std::to_string(min));
  EXPECT_THROW(store_->add("small", -1), InvalidArgument);
  EXPECT_EQ(store_->add("small", 0), min);
}

TEST_P(StoreContract, AddIsAtomicAcrossConcurrentClients) {
  constexpr int kThreads = 8, kAdds = 50;
  auto errors = testing::run_threads(kThreads, [&](int) {
    auto handle = backing_->open();
    for (int i = 0; i < kAdds; ++i) handle->add("counter", 1);
  });
  for (auto& e : errors) EXPECT_FALSE(e);
  EXPECT_EQ(store_->add("counter", 0), kThreads * kAdds);
}

TEST_P(StoreContract, CompareSetFollowsTheContract) {
  // Missing key and empty expectation: set.
  EXPECT_EQ(store_->compare_set("k", "", "first"), "first");
  // Expectation met: replace.
  EXPECT_EQ(store_->compare_set("k", "first", "second"), "second");
  // Expectation not met: unchanged, current value returned.
  EXPECT_EQ(store_->compare_set("k", "first", "third"), "second");
  // Missing key with a non-empty expectation: nothing is set.
  EXPECT_EQ(store_->compare_set("missing", "x", "y"), "");
  EXPECT_FALSE(store_->check({"missing"}));
}

TEST_P(StoreContract, WaitForSeveralKeys) {
  auto other = backing_->open();
  other->set("w1", "1");
  testing::BlockingCall wait([&] { store_->wait({"w1", "w2"}, 10s); });
  EXPECT_TRUE(wait.blocked()) << "the wait returned with one of its two keys set";
  other->set("w2", "2");
  EXPECT_NO_THROW(wait.join());
}

TEST_P(StoreContract, WaitTimesOutNamingTheMissingKeys) {
  store_->set("present", "1");
  try {
    store_->wait({"present", "absent"}, 100ms);
    FAIL() << "no TimeoutError";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("absent"), std::string::npos) << what;
    EXPECT_EQ(what.find("'present'"), std::string::npos) << what;
  }
}

TEST_P(StoreContract, CheckDeleteAndCount) {
  const auto before = store_->num_keys();
  store_->set("x", "1");
  store_->set("y", "2");
  EXPECT_TRUE(store_->check({"x", "y"}));
  EXPECT_FALSE(store_->check({"x", "z"}));
  EXPECT_EQ(store_->num_keys(), before + 2);
  EXPECT_TRUE(store_->delete_key("x"));
  EXPECT_FALSE(store_->delete_key("x"));
  EXPECT_FALSE(backing_->open()->check({"x"}));
  EXPECT_EQ(store_->num_keys(), before + 1);
}

// The clone works while the original handle is blocked in a long wait,
// and it is the clone's own set that ends that wait.
TEST_P(StoreContract, ACloneSeesTheSameDataAndIsNotBlockedByAWaitingHandle) {
  auto clone = store_->clone();
  EXPECT_EQ(clone->timeout(), store_->timeout());
  testing::BlockingCall wait([&] { store_->wait({"release"}, 60s); });
  EXPECT_TRUE(wait.blocked());
  clone->set("via-clone", "1");
  EXPECT_EQ(clone->get("via-clone"), "1");
  EXPECT_FALSE(wait.returned()) << "the original handle's wait ended before anything released it";
  clone->set("release", "1");
  EXPECT_NO_THROW(wait.join());
  EXPECT_EQ(store_->get("via-clone"), "1");
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreContract, ::testing::Values("hash", "file", "tcp", "prefix"),
                         [](const auto& info) { return info.param; });

TEST(PrefixStore, KeysLandUnderThePrefix) {
  auto base = std::make_shared<HashStore>();
  PrefixStore a("a", base), b("b", base);
  a.set("k", "from a");
  b.set("k", "from b");
  EXPECT_EQ(base->get("a/k"), "from a");
  EXPECT_EQ(a.get("k"), "from a");
  EXPECT_EQ(b.get("k"), "from b");
}

TEST(FileStore, UnwritableLocationIsAConfigError) {
  EXPECT_THROW(FileStore("/nonexistent-dir/for/sure/store"), ConfigError);
}

}  // namespace
}  // namespace lockstep
