// C10dStore against real PyTorch TCPStore servers, each in a Python
// subprocess: PyTorch 1.13 (the system python3) and, when the project's
// venv has it, PyTorch 2.x with its libuv server (the default) and its
// older poll-based one. Every Store operation, values crossing between this
// client and PyTorch's own Python client both ways, timeouts, and a wait
// that another client ends; and init_process_group joining the agent's store
// as under torchrun. A Python without torch is a GTEST_SKIP.
// Every subprocess runs under a deadline and is reaped (harness/process_ranks.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "harness/launcher.h"
#include "harness/reserved_port.h"
#include "harness/process_ranks.h"
#include "lockstep/config.h"
#include "lockstep/error.h"
#include "lockstep/process_group.h"
#include "lockstep/store.h"
#include "store/c10d_store.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::EnvMap;
using testing::ProcessRanks;
using testing::RankResult;

#ifndef LOCKSTEP_SYSTEM_PYTHON
#define LOCKSTEP_SYSTEM_PYTHON "/usr/bin/python3"
#endif
#ifndef LOCKSTEP_TORCH2_PYTHON
#define LOCKSTEP_TORCH2_PYTHON ""
#endif

// The helper every subprocess runs: a server, or PyTorch's own client doing
// one scripted conversation.
constexpr char kHelper[] = R"PY(
import datetime, os, sys, time
try:
    import torch.distributed as dist
except ImportError:
    if sys.argv[1] == "server":
        with open(sys.argv[4], "w") as f:
            f.write("no-torch")
    sys.exit(3)

mode, port = sys.argv[1], int(sys.argv[2])
timeout = datetime.timedelta(seconds=60)
if mode == "server":
    libuv, ready = sys.argv[3], sys.argv[4]
    kwargs = {} if libuv == "-" else {"use_libuv": libuv == "1"}
    store = dist.TCPStore("127.0.0.1", port, None, True, timeout, wait_for_workers=False, **kwargs)
    with open(ready + ".tmp", "w") as f:
        f.write(str(store.port))
    os.rename(ready + ".tmp", ready)
    time.sleep(float(sys.argv[5]))
    sys.exit(0)

store = dist.TCPStore("127.0.0.1", port, None, False, timeout)
if mode == "converse":
    print("got", store.get("cxx/bytes").hex(), flush=True)
    print("counter", store.add("cxx/counter", 10), flush=True)
    store.set("py/bytes", bytes.fromhex(sys.argv[3]))
    time.sleep(1.0)
    store.set("py/late", b"late")
    print("done", flush=True)
elif mode == "prefixget":  # as PyTorch's env:// rendezvous reads the agent store
    print("value", dist.PrefixStore(sys.argv[3], store).get(sys.argv[4]).decode(), flush=True)
elif mode == "check":  # 1.13's Python TCPStore has no check(): a short wait
    try:
        store.wait(sys.argv[3:], datetime.timedelta(milliseconds=300))
        print("check True", flush=True)
    except RuntimeError:
        print("check False", flush=True)
)PY";

constexpr char kBinary[] = "\x00\x01\xff\xfe key\nvalue\x00";
const std::string kBinaryValue(kBinary, sizeof kBinary - 1);
const std::string kBinaryHex = "0001fffe206b65790a76616c756500";

struct ServerKind {
  const char* name;
  std::string python;
  const char* libuv;  // "-": the version's default; "1"/"0": use_libuv
  C10dProtocol protocol;
};

std::string printable(const ServerKind& k) { return k.name; }
void PrintTo(const ServerKind& k, std::ostream* os) { *os << k.name; }

// Runs python with the helper; its output and exit code.
RankResult run_helper(const std::string& python, const std::string& helper, std::vector<std::string> args,
                      Duration timeout) {
  args.insert(args.begin(), helper);
  return testing::run_program(python, args, EnvMap{}, timeout);
}

// A PyTorch TCPStore server in a Python subprocess, killed and reaped on
// destruction.
class PythonServer {
 public:
  PythonServer(const ServerKind& kind, const std::string& helper, const std::string& dir) {
    const std::string ready = dir + "/ready";
    const std::string python = kind.python;
    const std::string libuv = kind.libuv;
    process_ = std::make_unique<ProcessRanks>(
        1, [](int) { return EnvMap{}; },
        [=](int) {
          std::vector<std::string> argv{python, helper, "server", "0", libuv, ready, "300"};
          std::vector<char*> c;
          for (auto& a : argv) c.push_back(a.data());
          c.push_back(nullptr);
          ::execv(python.c_str(), c.data());
          throw std::runtime_error("cannot execute " + python);
        });
    if (!testing::wait_for_file(ready, 120s)) {
      auto results = process_->wait_all(1s);
      ADD_FAILURE() << "the PyTorch TCPStore server did not start: " << testing::describe(results[0]);
      return;
    }
    std::ifstream in(ready);
    std::string text;
    in >> text;
    if (text == "no-torch") {
      no_torch_ = true;
      return;
    }
    port_ = std::stoi(text);
  }
  ~PythonServer() { stop(); }
  void stop() {
    if (!process_) return;
    process_->signal(0, SIGKILL);
    process_->wait_all(10s);
    process_.reset();
  }
  std::uint16_t port() const { return static_cast<std::uint16_t>(port_); }
  bool no_torch() const { return no_torch_; }

 private:
  bool no_torch_ = false;
  std::unique_ptr<ProcessRanks> process_;
  int port_ = 0;
};

class C10dStoreTest : public ::testing::TestWithParam<ServerKind> {
 protected:
  void SetUp() override {
    const std::string& python = GetParam().python;
    if (python.empty() || ::access(python.c_str(), X_OK) != 0)
      GTEST_SKIP() << GetParam().name << ": no Python at '" << python << "' (PyTorch 2.x comes from the project's "
                   << ".venv/torch2)";
    helper_ = dir_.path() + "/helper.py";
    std::ofstream(helper_) << kHelper;
    server_ = std::make_unique<PythonServer>(GetParam(), helper_, dir_.path());
    if (server_->no_torch())
      GTEST_SKIP() << GetParam().name << ": " << python << " cannot import torch.distributed (the system python3 "
                   << "needs Debian's python3-torch)";
    ASSERT_GT(server_->port(), 0);
  }

  std::unique_ptr<C10dStore> connect(Duration timeout = 30s) {
    C10dStoreOptions options;
    options.connect_timeout = 30s;
    options.timeout = timeout;
    return std::make_unique<C10dStore>("127.0.0.1", server_->port(), options);
  }

  testing::TempDir dir_;
  std::string helper_;
  std::unique_ptr<PythonServer> server_;
};

TEST_P(C10dStoreTest, DetectsTheProtocol) {
  auto store = connect();
  EXPECT_EQ(store->protocol(), GetParam().protocol);
  // A clone speaks the same one on its own connection.
  auto copy = store->clone();
  copy->set("clone/key", "v");
  EXPECT_EQ(store->get("clone/key"), "v");
}

TEST_P(C10dStoreTest, SetGetCheckDeleteNumKeys) {
  auto store = connect();
  const std::int64_t before = store->num_keys();
  store->set("a", "1");
  store->set("b", kBinaryValue);
  store->set("empty", "");
  EXPECT_EQ(store->get("a"), "1");
  EXPECT_EQ(store->get("b"), kBinaryValue);
  EXPECT_EQ(store->get("empty"), "");
  store->set("a", "overwritten");
  EXPECT_EQ(store->get("a"), "overwritten");
  EXPECT_EQ(store->num_keys(), before + 3);
  EXPECT_TRUE(store->check({"a", "b", "empty"}));
  EXPECT_FALSE(store->check({"a", "missing"}));
  EXPECT_TRUE(store->check({}));
  EXPECT_TRUE(store->delete_key("a"));
  EXPECT_FALSE(store->delete_key("a"));
  EXPECT_FALSE(store->check({"a"}));
  EXPECT_EQ(store->num_keys(), before + 2);
}

TEST_P(C10dStoreTest, AddReturnsTheNewValueAndCountsFromZero) {
  auto store = connect();
  EXPECT_EQ(store->add("n", 5), 5);
  EXPECT_EQ(store->add("n", -7), -2);
  EXPECT_EQ(store->add("n", 0), -2);
  EXPECT_EQ(store->get("n"), "-2");  // a decimal string, as lockstep's stores keep it
  store->set("m", "40");
  EXPECT_EQ(store->add("m", 2), 42);
}

TEST_P(C10dStoreTest, CompareSetFollowsTheStoreContract) {
  auto store = connect();
  // Missing, expected "": set.
  EXPECT_EQ(store->compare_set("k", "", "first"), "first");
  // Present, expected matches: swapped; does not match: the current value.
  EXPECT_EQ(store->compare_set("k", "first", "second"), "second");
  EXPECT_EQ(store->compare_set("k", "first", "third"), "second");
  EXPECT_EQ(store->compare_set("k", "", "third"), "second");
  EXPECT_EQ(store->get("k"), "second");
  // Missing, expected not "": the server answers `expected`; the contract says "" and nothing is set.
  EXPECT_EQ(store->compare_set("gone", "x", "y"), "");
  EXPECT_FALSE(store->check({"gone"}));
  // expected == desired: a read, missing or not.
  EXPECT_EQ(store->compare_set("gone", "same", "same"), "");
  EXPECT_FALSE(store->check({"gone"}));
  EXPECT_EQ(store->compare_set("k", "second", "second"), "second");
}

TEST_P(C10dStoreTest, WaitOnAMissingKeyTimesOutNamingItAndTheStoreStillWorks) {
  auto store = connect(500ms);
  store->set("here", "1");
  const auto start = std::chrono::steady_clock::now();
  try {
    store->wait({"here", "never/set"}, 400ms);
    FAIL() << "wait returned for a key nobody set";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'never/set'"), std::string::npos) << what;
    EXPECT_EQ(what.find("'here'"), std::string::npos) << "names only the missing key: " << what;
  }
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 390ms);
  EXPECT_LT(took, 10s);
  EXPECT_THROW(store->get("never/set"), TimeoutError);  // get waits the store's timeout
  store->set("after", "ok");  // the closed connection was replaced
  EXPECT_EQ(store->get("after"), "ok");
}

TEST_P(C10dStoreTest, WaitEndsWhenAnotherClientSetsTheKey) {
  auto store = connect();
  auto other = store->clone();
  // Past two of the wait's one-second slices (each cancelled and re-sent).
  std::thread setter([&] {
    std::this_thread::sleep_for(2300ms);
    other->set("later", "now");
  });
  const auto start = std::chrono::steady_clock::now();
  store->wait({"later"}, 20s);
  const auto took = std::chrono::steady_clock::now() - start;
  setter.join();
  EXPECT_GE(took, 2250ms);
  EXPECT_LT(took, 10s);
  EXPECT_EQ(store->get("later"), "now");
}

// PyTorch 2.x's libuv server wakes the waiters of a key on every
// compare_set, also one that leaves the key missing; the wait must go on.
TEST_P(C10dStoreTest, CompareSetThatLeavesTheKeyMissingDoesNotEndAWait) {
  auto store = connect();
  auto other = store->clone();
  std::atomic<bool> set_done{false};
  std::thread writer([&] {
    std::this_thread::sleep_for(200ms);
    EXPECT_EQ(other->compare_set("awaited", "not-there", "x"), "");
    std::this_thread::sleep_for(300ms);
    set_done = true;
    other->set("awaited", "real");
  });
  store->wait({"awaited"}, 20s);
  EXPECT_TRUE(set_done.load());
  writer.join();
  EXPECT_EQ(store->get("awaited"), "real");
}

// PyTorch 1.13's server and 2.x's poll server do not wake the waiters of a
// key that compare_set creates; the Store contract says the wait ends.
TEST_P(C10dStoreTest, CompareSetThatCreatesTheKeyEndsAWait) {
  auto store = connect();
  auto other = store->clone();
  std::thread writer([&] {
    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(other->compare_set("created", "", "by-cas"), "by-cas");
  });
  const auto start = std::chrono::steady_clock::now();
  store->wait({"created"}, 20s);
  const auto took = std::chrono::steady_clock::now() - start;
  writer.join();
  EXPECT_GE(took, 250ms);
  EXPECT_LT(took, 5s);  // within a slice or two of the compare_set
  EXPECT_EQ(store->get("created"), "by-cas");
}

TEST_P(C10dStoreTest, ValuesCrossBetweenThisClientAndPyTorchsClient) {
  auto store = connect(60s);
  store->set("cxx/bytes", kBinaryValue);
  EXPECT_EQ(store->add("cxx/counter", 5), 5);
  const std::string py_value("\x7f\x00python\x80", 9);
  std::string py_hex;
  for (unsigned char c : py_value) py_hex += fmt::format("{:02x}", c);
  // PyTorch's client reads what this one wrote, adds, writes, and a second
  // later sets the key this client is already waiting for.
  ProcessRanks python(
      1, [](int) { return EnvMap{}; },
      [&](int) {
        std::vector<std::string> argv{GetParam().python, helper_, "converse", std::to_string(server_->port()), py_hex};
        std::vector<char*> c;
        for (auto& a : argv) c.push_back(a.data());
        c.push_back(nullptr);
        ::execv(argv[0].c_str(), c.data());
        throw std::runtime_error("cannot execute python");
      });
  try {
    store->wait({"py/late"}, 60s);
  } catch (const TimeoutError& e) {
    FAIL() << e.what() << "\nPyTorch's client: " << testing::describe(python.wait_all(1s)[0]);
  }
  EXPECT_EQ(store->get("py/late"), "late");
  EXPECT_EQ(store->get("py/bytes"), py_value);
  EXPECT_EQ(store->add("cxx/counter", 0), 15);
  const RankResult r = python.wait_all(60s)[0];
  ASSERT_EQ(r.exit_code, 0) << testing::describe(r);
  EXPECT_NE(r.output.find("got " + kBinaryHex), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("counter 15"), std::string::npos) << r.output;

  // And PyTorch's check sees this client's keys (and not a missing one).
  const RankResult check =
      run_helper(GetParam().python, helper_, {"check", std::to_string(server_->port()), "cxx/bytes", "py/late"}, 60s);
  EXPECT_NE(check.output.find("check True"), std::string::npos) << testing::describe(check);
  const RankResult missing =
      run_helper(GetParam().python, helper_, {"check", std::to_string(server_->port()), "cxx/bytes", "nope"}, 60s);
  EXPECT_NE(missing.output.find("check False"), std::string::npos) << testing::describe(missing);
}

TEST_P(C10dStoreTest, ALostServerIsAnErrorNamingTheAddress) {
  auto store = connect(5s);
  store->set("k", "v");
  server_->stop();
  try {
    store->get("k");
    store->get("k");  // the first may still have been answered from a buffer
    FAIL() << "get succeeded with the server gone";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(server_->port())), std::string::npos)
        << e.what();
  }
}

TEST_P(C10dStoreTest, OversizedKeysAndValuesAreRefusedBeforeSending) {
  auto store = connect();
  EXPECT_THROW(store->set(std::string(C10dStore::kMaxKeyBytes + 1, 'k'), "v"), InvalidArgument);
  EXPECT_THROW(store->set("k", std::string(C10dStore::kMaxValueBytes + 1, 'v')), InvalidArgument);
  store->set("k", std::string(100000, 'v'));  // large but allowed
  EXPECT_EQ(store->get("k").size(), 100000u);
}

// Under torchrun with TORCHELASTIC_USE_AGENT_STORE=True, init_process_group
// joins the agent's store (rank 0 too: it must not try to host one on the
// port) and keeps its keys where PyTorch's env:// rendezvous would put them:
// PrefixStore("/worker/attempt_<restart>") over PyTorch's client.
TEST_P(C10dStoreTest, InitProcessGroupJoinsTheAgentStoreUnderTheAttemptPrefix) {
  Config config;
  config.launcher.source = LaunchSource::torchrun;
  config.launcher.rank = 0;
  config.launcher.world_size = 1;
  config.master_addr = "127.0.0.1";
  config.master_port = server_->port();
  config.restart_count = 2;
  config.run_name = "job";
  config.timeout = 30s;
  config.torchelastic_use_agent_store = true;
  GroupOptions options;
  options.config = config;
  {
    auto group = init_process_group(options);
    EXPECT_EQ(group->size(), 1);
  }
  const std::string key = "job/2/" + GroupOptions{}.name + "/rendezvous/world_size";
  const RankResult r = run_helper(GetParam().python, helper_,
                                  {"prefixget", std::to_string(server_->port()), "/worker/attempt_2", key}, 60s);
  EXPECT_NE(r.output.find("value 1"), std::string::npos) << testing::describe(r);

  // Without the variable, rank 0 would host lockstep's store on the agent's port.
  config.torchelastic_use_agent_store = false;
  config.run_name = "other";
  options.config = config;
  try {
    init_process_group(options);
    ADD_FAILURE() << "rank 0 hosted a store on the port torchrun's agent holds";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot listen"), std::string::npos) << e.what();
  }
}

std::vector<ServerKind> server_kinds() {
  return {
      {"torch1_13", LOCKSTEP_SYSTEM_PYTHON, "-", C10dProtocol::v1},
      {"torch2_libuv", LOCKSTEP_TORCH2_PYTHON, "1", C10dProtocol::v2},
      {"torch2_poll", LOCKSTEP_TORCH2_PYTHON, "0", C10dProtocol::v2},
  };
}

INSTANTIATE_TEST_SUITE_P(Servers, C10dStoreTest, ::testing::ValuesIn(server_kinds()),
                         [](const ::testing::TestParamInfo<ServerKind>& info) { return printable(info.param); });

TEST(C10dStoreErrors, NobodyListeningIsAConfigErrorNamingTheAddress) {
  const testing::ReservedPort reserved_port;
  const int port = reserved_port.number();
  C10dStoreOptions options;
  options.connect_timeout = 300ms;
  try {
    C10dStore store("127.0.0.1", static_cast<std::uint16_t>(port), options);
    FAIL() << "connected to a port nobody listens on";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(port)), std::string::npos) << e.what();
  }
}

TEST(C10dStoreErrors, LockstepsOwnStoreIsNotTakenForAPyTorchOne) {
  TcpStoreServer server("127.0.0.1", 0);
  C10dStoreOptions options;
  options.connect_timeout = 5s;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(C10dStore("127.0.0.1", server.port(), options), ConfigError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
}

}  // namespace
}  // namespace lockstep
