// Ranks as real processes, started the way a launcher starts them (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT; rank 0 hosts the store): a
// representative subset of the collective sweep, a rank killed
// mid-collective, and every start-up mistake a user can make.
#include <gtest/gtest.h>

#include <netinet/in.h>

#include <signal.h>
#include <sys/socket.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "block_cases.h"
#include "collective_cases.h"
#include "common/socket.h"
#include "store/store_token.h"
#include "harness/process_ranks.h"
#include "harness/reserved_port.h"
#include "lockstep/process_group.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::describe;
using testing::EnvMap;
using testing::ProcessRanks;
using testing::RankResult;

// The environment `lockstep run` gives rank r of n.
EnvMap launcher_env(int r, int n, int port, const std::string& backend = "tcp") {
  return {{"RANK", std::to_string(r)},          {"WORLD_SIZE", std::to_string(n)},
          {"LOCAL_RANK", std::to_string(r)},    {"LOCAL_WORLD_SIZE", std::to_string(n)},
          {"MASTER_ADDR", "127.0.0.1"},         {"MASTER_PORT", std::to_string(port)},
          {"LOCKSTEP_BACKEND", backend},        {"LOCKSTEP_TIMEOUT", "30"},
          {"LOCKSTEP_CONNECT_TIMEOUT", "30"}};
}

void expect_all_ok(const std::vector<RankResult>& results) {
  for (const auto& r : results) EXPECT_EQ(r.exit_code, testing::kExitOk) << describe(r);
}

// Fails the rank with the first wrong result.
void run_subset_sweep(ProcessGroup& pg) {
  int cases = 0;
  for (Collective c : {Collective::allreduce, Collective::reduce, Collective::broadcast, Collective::allgather,
                       Collective::reduce_scatter}) {
    for (std::size_t count : {std::size_t{0}, std::size_t{7}, std::size_t{1048579}}) {
      for (DType dtype : {DType::f32, DType::bf16, DType::i64, DType::u8}) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
          const int root = (cases++) % pg.size();
          const std::string failure = testing::run_collective_case(pg, c, count, dtype, op, root);
          if (!failure.empty()) throw std::runtime_error(failure);
        }
      }
    }
  }
  // The block collectives across processes: on shm, large blocks are read
  // from the peer process's memory (single copy).
  for (testing::BlockCase c : testing::kAllBlockCases) {
    for (std::size_t count : {std::size_t{0}, std::size_t{7}, std::size_t{1048579}}) {
      for (DType dtype : {DType::f32, DType::u8}) {
        const std::string failure = testing::run_block_case(pg, c, count, dtype, (cases++) % pg.size());
        if (!failure.empty()) throw std::runtime_error(failure);
      }
    }
  }
}

class ForkedSweep : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(ForkedSweep, EnvironmentInitAndTcpStore) {
  const auto& [backend, n] = GetParam();
  const testing::ReservedPort reserved_port;
  const int port = reserved_port.number();
  ProcessRanks ranks(
      n, [&](int r) { return launcher_env(r, n, port, backend); },
      [](int) {
        auto pg = init_process_group();
        run_subset_sweep(*pg);
      });
  expect_all_ok(ranks.wait_all(120s));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ForkedSweep,
                         ::testing::Combine(::testing::Values("tcp", "shm"), ::testing::Values(2, 3, 4)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "ranks";
                         });


// Two ranks whose rank 0 hosts the store on `address`, with `token` (none
// when empty).
EnvMap reachable_store_env(int rank, const std::string& address, int port, const std::string& token) {
  EnvMap env = launcher_env(rank, 2, port);
  env["MASTER_ADDR"] = address;
  if (!token.empty()) env["LOCKSTEP_STORE_TOKEN"] = token;
  return env;
}

// Rank 0 hosting the store (a torchrun-style environment) on an address
// other hosts can reach needs LOCKSTEP_STORE_TOKEN: without it every rank
// refuses to start, saying so, rather than guard the store with a token
// derived from what every command line shows.
TEST(ForkedRanks, AStoreReachableFromOtherHostsWithoutATokenIsRefused) {
  const std::string address = testing::reachable_address();
  if (address.empty()) GTEST_SKIP() << "this host has no non-loopback IPv4 address";
  const testing::ReservedPort reserved_port;
  const int port = reserved_port.number();
  ProcessRanks ranks(
      2, [&](int r) { return reachable_store_env(r, address, port, ""); },
      [&](int) {
        try {
          init_process_group();
        } catch (const ConfigError& e) {
          if (std::string(e.what()).find("set LOCKSTEP_STORE_TOKEN") != std::string::npos) return;
          throw;
        }
        throw std::runtime_error("the ranks started with a reachable store and no token");
      });
  expect_all_ok(ranks.wait_all(60s));
}

// With the token, a client without it, or with the token lockstep used to
// derive from the address, port, world size and run id, is refused.
TEST(ForkedRanks, AStoreReachableFromOtherHostsRefusesEveryoneWithoutTheToken) {
  const std::string address = testing::reachable_address();
  if (address.empty()) GTEST_SKIP() << "this host has no non-loopback IPv4 address";
  const testing::ReservedPort reserved_port;
  const int port = reserved_port.number();
  ProcessRanks ranks(
      2, [&](int r) { return reachable_store_env(r, address, port, "a-secret-only-the-ranks-know"); },
      [&](int rank) {
        auto pg = init_process_group();
        if (rank == 0) {
          const std::string guessed =
              shared_store_token(std::nullopt, fmt::format("rank0/{}:{}/2/", address, port));
          for (const std::string& token : {std::string(), guessed}) {
            TcpStoreOptions stranger;
            stranger.token = token;
            stranger.connect_timeout = std::chrono::seconds(5);
            try {
              TcpStore store(address, static_cast<std::uint16_t>(port), stranger);
              store.get("anything");
              throw std::runtime_error("a client with token '" + token + "' was served");
            } catch (const ConfigError& e) {
              if (std::string(e.what()).find("store token") == std::string::npos) throw;
            }
          }
        }
        pg->barrier()->wait();
      });
  expect_all_ok(ranks.wait_all(60s));
}

TEST(ForkedRanks, FileStoreRendezvous) {
  const int n = 3;
  char tmpl[] = "/tmp/lockstep-fs-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  ProcessRanks ranks(
      n, [&](int) { return EnvMap{{"LOCKSTEP_TIMEOUT", "30"}}; },
      [&](int r) {
        GroupOptions options;
        options.rank = r;
        options.world_size = n;
        options.store = std::make_shared<FileStore>(dir + "/store");
        options.backend = "tcp";
        auto pg = init_process_group(options);
        std::vector<double> v(5000, r);
        pg->allreduce(view(std::span(v)))->wait();
        if (v[4999] != 0 + 1 + 2) throw std::runtime_error("wrong sum");
      });
  expect_all_ok(ranks.wait_all(60s));
  std::filesystem::remove_all(dir);
}

// Shared-memory regions this test's processes created that are still in
// /dev/shm (region names end with the creator's pid).
std::vector<std::string> leftover_regions(const ProcessRanks& ranks) {
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("lockstep.", 0) != 0) continue;
    for (int r = 0; r < ranks.size(); ++r)
      if (name.size() > 0 && name.substr(name.rfind('.') + 1) == std::to_string(ranks.pid(r))) left.push_back(name);
  }
  return left;
}

class KilledRank : public ::testing::TestWithParam<std::string> {};

TEST_P(KilledRank, IsAPeerErrorOnEverySurvivorWithinFiveSeconds) {
  const int n = 4, victim = 2;
  const testing::ReservedPort reserved_port;
  const int port = reserved_port.number();
  char tmpl[] = "/tmp/lockstep-kill-XXXXXX";
  const std::string marker = std::string(::mkdtemp(tmpl)) + "/busy";
  ProcessRanks ranks(
      n, [&](int r) { return launcher_env(r, n, port, GetParam()); },
      [&](int r) {
        auto pg = init_process_group();
        std::vector<float> v(4 << 20, 1.0f);  // 16 MiB: an allreduce long enough to be killed in
        for (int i = 0;; ++i) {
          pg->allreduce(view(std::span(v)))->wait();
          if (r == victim && i == 2) std::ofstream{marker};
        }
      });
  ASSERT_TRUE(testing::wait_for_file(marker, 60s)) << "the victim never got going";
  std::this_thread::sleep_for(20ms);  // let it enter the next collective
  ranks.signal(victim, SIGKILL);
  const auto killed_at = Clock::now();
  const auto results = ranks.wait_all(30s);
  for (const auto& r : results) {
    if (r.rank == victim) {
      EXPECT_EQ(r.signal, SIGKILL) << describe(r);
      continue;
    }
    EXPECT_EQ(r.exit_code, testing::kExitPeerError) << describe(r);
    EXPECT_NE(r.output.find("rank 2"), std::string::npos) << describe(r);
    EXPECT_LT(seconds_between(killed_at, r.ended), 5.0) << describe(r);
  }
  EXPECT_EQ(leftover_regions(ranks), std::vector<std::string>{}) << "shared memory left in /dev/shm";
  std::filesystem::remove_all(std::filesystem::path(marker).parent_path());
}

INSTANTIATE_TEST_SUITE_P(Backends, KilledRank, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

TEST(ForkedRanks, TwoJobsOnOneHostDoNotInterfere) {
  // Two 2-rank shm jobs at once, each checking its own sums.
  const testing::ReservedPort reserved_a, reserved_b;
  const int port_a = reserved_a.number(), port_b = reserved_b.number();
  ProcessRanks ranks(
      4,
      [&](int r) { return launcher_env(r % 2, 2, r < 2 ? port_a : port_b, "shm"); },
      [](int r) {
        auto pg = init_process_group();
        const float job = r < 2 ? 1.0f : 100.0f;
        for (std::size_t count : {std::size_t{3}, std::size_t{5000}, std::size_t{1} << 20}) {
          for (int i = 0; i < 20; ++i) {
            std::vector<float> v(count, job * static_cast<float>(pg->rank() + 1));
            pg->allreduce(view(std::span(v)))->wait();
            if (v[count - 1] != job * 3.0f) throw std::runtime_error("one job saw the other's data");
          }
        }
      });
  expect_all_ok(ranks.wait_all(60s));
  EXPECT_EQ(leftover_regions(ranks), std::vector<std::string>{});
}

TEST(ForkedRanks, ARankThatFinishesFirstDoesNotBreakTheOthers) {
  const int n = 3;
  const testing::ReservedPort reserved_port;
  const int port = reserved_port.number();
  ProcessRanks ranks(
      n, [&](int r) { return launcher_env(r, n, port); },
      [](int r) {
        auto pg = init_process_group();
        std::vector<float> v(1 << 20, 1.0f);
        pg->allreduce(view(std::span(v)))->wait();
        // Rank 0 (the store host) leaves first; the others linger, then finish.
        if (r != 0) std::this_thread::sleep_for(300ms);
        pg->barrier()->wait();
      });
  expect_all_ok(ranks.wait_all(60s));
}

// Runs `n` ranks with per-rank environments and expects every rank to end
// with ConfigError within `within`, its output containing `fragment`.
void expect_config_errors(int n, const std::function<EnvMap(int)>& env, const std::string& fragment,
                          Duration within = 20s) {
  const auto start = Clock::now();
  ProcessRanks ranks(n, env, [](int) { auto pg = init_process_group(); });
  const auto results = ranks.wait_all(60s);
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, testing::kExitConfigError) << describe(r);
    EXPECT_NE(r.output.find(fragment), std::string::npos) << describe(r);
    EXPECT_LT(seconds_between(start, r.ended), std::chrono::duration<double>(within).count()) << describe(r);
  }
}

// A process that calls init_process_group twice is told so, not that "two
// processes were started as rank 1".
TEST(ForkedRanksConfig, InitTwiceInOneProcessIsNamedAsSuch) {
  const testing::ReservedPort reserved_port;
  const int port = reserved_port.number();
  ProcessRanks ranks(
      2, [&](int r) { return launcher_env(r, 2, port); },
      [](int r) {
        auto first = init_process_group();
        if (r == 1) auto second = init_process_group();
        first->barrier()->wait();
      });
  const auto results = ranks.wait_all(60s);
  EXPECT_EQ(results[1].exit_code, testing::kExitConfigError) << describe(results[1]);
  EXPECT_NE(results[1].output.find("rank 1's process (pid " + std::to_string(ranks.pid(1))), std::string::npos)
      << describe(results[1]);
  EXPECT_NE(results[1].output.find("called init_process_group twice with this store"), std::string::npos)
      << describe(results[1]);
}

TEST(ForkedRanksConfig, MissingMasterAddr) {
  expect_config_errors(2, [](int r) {
    auto env = launcher_env(r, 2, 1);
    env["MASTER_ADDR"] = "";  // set but empty counts as missing
    return env;
  }, "MASTER_ADDR is not set");
}

TEST(ForkedRanksConfig, RankNotBelowWorldSize) {
  expect_config_errors(1, [](int) { return launcher_env(4, 4, 1); }, "outside the world of 4 ranks");
}

TEST(ForkedRanksConfig, WorldSizeZero) {
  expect_config_errors(1, [](int) { return launcher_env(0, 0, 1); }, "WORLD_SIZE='0' is out of range");
}

TEST(ForkedRanksConfig, UnreachableMasterAfterTheConnectTimeout) {
  const testing::ReservedPort reserved_port;
  const int port = reserved_port.number();  // nobody listens there
  const auto start = Clock::now();
  expect_config_errors(1, [&](int) {
    auto env = launcher_env(1, 2, port);  // rank 1: it does not host the store
    env["LOCKSTEP_CONNECT_TIMEOUT"] = "1";
    return env;
  }, "cannot reach the rendezvous store");
  EXPECT_GE(seconds_between(start, Clock::now()), 1.0);
}

TEST(ForkedRanksConfig, PortInUse) {
  const Socket holder = listen_tcp("", 0);  // the port is taken by someone else
  const int port = local_port(holder.fd());
  expect_config_errors(1, [&](int) { return launcher_env(0, 2, port); }, "in use");
}

TEST(ForkedRanksConfig, MismatchedWorldSizes) {
  const testing::ReservedPort reserved_port;
  const int port = reserved_port.number();
  expect_config_errors(2, [&](int r) { return launcher_env(r, r == 0 ? 2 : 3, port); }, "world size");
}

}  // namespace
}  // namespace lockstep
