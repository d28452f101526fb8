// Ranks that disagree about a collective, as real processes started the way
// a launcher starts them: every rank must end with MismatchError, promptly
// (not after the timeout, not as a PeerError when a peer that saw the
// mismatch leaves), for every disagreement the in-band stamp can see:
// roots, counts across the small-message boundary, dtypes of the same
// count, and counts at 3 and 4 ranks. Each case was silent, a hang until
// the timeout, or another error before the stamp covered it.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "harness/process_ranks.h"
#include "harness/reserved_port.h"
#include "lockstep/process_group.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::describe;
using testing::EnvMap;
using testing::ProcessRanks;

// A timeout far beyond the test's expectation, so a rank that waits it out
// shows as a TimeoutError, not as a pass.
EnvMap rank_env(int r, int n, int port, const std::string& backend) {
  EnvMap env{{"RANK", std::to_string(r)},
             {"WORLD_SIZE", std::to_string(n)},
             {"LOCAL_RANK", std::to_string(r)},
             {"LOCAL_WORLD_SIZE", std::to_string(n)},
             {"MASTER_ADDR", "127.0.0.1"},
             {"MASTER_PORT", std::to_string(port)},
             {"LOCKSTEP_BACKEND", backend},
             {"LOCKSTEP_TIMEOUT", "60"},
             {"LOCKSTEP_CONNECT_TIMEOUT", "30"}};
  if (backend == "hier") {
    // Two pretend hosts of consecutive ranks: hier over shm inside, tcp across.
    env["LOCKSTEP_HOST_ID"] = r < (n + 1) / 2 ? "pretend-host-a" : "pretend-host-b";
    env["LOCAL_RANK"] = std::to_string(r < (n + 1) / 2 ? r : r - (n + 1) / 2);
    env["LOCAL_WORLD_SIZE"] = std::to_string(r < (n + 1) / 2 ? (n + 1) / 2 : n / 2);
  }
  return env;
}

struct Disagreement {
  std::string name;
  // What rank r of n runs; it must throw MismatchError on every rank.
  std::function<void(ProcessGroup& pg, int r, int n)> run;
  // What every rank's message must contain: the collective, and both sides.
  std::vector<std::string> named;
};

std::vector<float> floats(std::size_t count, int r) { return std::vector<float>(count, static_cast<float>(r + 1)); }

// Three all-reduces of 262144 floats in place, then the last rank all-reduces
// only the first `last_count` of them.
std::function<void(ProcessGroup&, int, int)> last_rank_differs_after_three_in_place(std::size_t last_count) {
  return [last_count](ProcessGroup& pg, int r, int n) {
    auto v = floats(262144, r);
    for (int i = 0; i < 3; ++i) pg.allreduce(view(std::span(v)))->wait();
    pg.allreduce(view(std::span(v).first(r == n - 1 ? last_count : v.size())))->wait();
  };
}

std::vector<Disagreement> disagreements() {
  return {
      {"BroadcastRootsThatNameThemselvesSmall",
       [](ProcessGroup& pg, int r, int) {
         auto v = floats(3, r);
         pg.broadcast(view(std::span(v)), r)->wait();
       },
       {"broadcast #0 (float x 3, root ", "does not match"}},
      {"BroadcastRootsThatNameThemselvesLarge",
       [](ProcessGroup& pg, int r, int) {
         auto v = floats(300000, r);
         pg.broadcast(view(std::span(v)), r)->wait();
       },
       {"broadcast #0 (float x 300000, root ", "does not match"}},
      {"ReduceRootsThatNameTheNextRank",
       [](ProcessGroup& pg, int r, int n) {
         auto v = floats(1000, r);
         pg.reduce(view(std::span(v)), (r + 1) % n)->wait();
       },
       {"reduce #0 (float x 1000, sum, root ", "does not match"}},
      {"ReduceRootsThatNameThemselvesSmall",
       [](ProcessGroup& pg, int r, int) {
         auto v = floats(2, r);
         pg.reduce(view(std::span(v)), r)->wait();
       },
       {"reduce #0 (float x 2, sum, root ", "does not match"}},
      // 48 bytes travel inline; 52 do not.
      {"CountsEitherSideOfTheSmallMessageLine",
       [](ProcessGroup& pg, int r, int) {
         auto v = floats(r == 0 ? 12 : 13, r);
         pg.allreduce(view(std::span(v)))->wait();
       },
       {"allreduce #0 (float x 1", "float x 12", "float x 13"}},
      {"DTypesOfTheSameCountEitherSideOfTheLine",
       [](ProcessGroup& pg, int r, int) {
         std::vector<float> f(10, 1.0f);
         std::vector<double> d(10, 1.0);
         if (r == 0) pg.allreduce(view(std::span(f)))->wait();
         else pg.allreduce(view(std::span(d)))->wait();
       },
       {"allreduce #0 (", "float x 10", "double x 10"}},
      // One rank of three or four: the ranks that do not exchange with it
      // directly learn of the mismatch from those that do.
      {"OneRanksCountAfterAGoodCollective",
       [](ProcessGroup& pg, int r, int n) {
         auto good = floats(1000, r);
         pg.allreduce(view(std::span(good)))->wait();
         auto v = floats(r == n - 1 ? 5001 : 5000, r);
         pg.allreduce(view(std::span(v)))->wait();
       },
       {"allreduce #1 (float x 500", "float x 5000", "float x 5001"}},
      // After three all-reduces of the same 1 MiB buffer in place, one
      // rank's count differs: through the slots, or inline.
      {"OneRanksCountAfterThreeInPlace", last_rank_differs_after_three_in_place(262143),
       {"allreduce #3 (float x 26214", "float x 262144", "float x 262143"}},
      {"OneRanksSmallOperationAfterThreeInPlace", last_rank_differs_after_three_in_place(12),
       {"allreduce #3 (float x ", "float x 262144", "float x 12"}},
      {"GatherRootsThatNameThemselvesSmall",
       [](ProcessGroup& pg, int r, int n) {
         auto in = floats(2, r);
         auto out = floats(2 * static_cast<std::size_t>(n), r);
         pg.gather(view(std::span(in)), view(std::span(out)), r)->wait();
       },
       {"gather #0 (float x ", "does not match"}},
      {"GatherRootsThatNameTheNextRankLarge",
       [](ProcessGroup& pg, int r, int n) {
         auto in = floats(100000, r);
         auto out = floats(100000 * static_cast<std::size_t>(n), r);
         pg.gather(view(std::span(in)), view(std::span(out)), (r + 1) % n)->wait();
       },
       {"gather #0 (float x ", "does not match"}},
      {"ScatterRootsThatNameThemselves",
       [](ProcessGroup& pg, int r, int n) {
         for (std::size_t block : {std::size_t{2}, std::size_t{100000}}) {
           auto in = floats(block * static_cast<std::size_t>(n), r);
           auto out = floats(block, r);
           pg.scatter(view(std::span(in)), view(std::span(out)), r)->wait();
         }
       },
       {"scatter #0 (float x ", "does not match"}},
  };
}

class Mismatch : public ::testing::TestWithParam<std::tuple<std::string, int, std::string>> {};

TEST_P(Mismatch, IsAMismatchErrorOnEveryRankAtTheCollective) {
  const auto& [backend, n, name] = GetParam();
  Disagreement d;
  for (auto& candidate : disagreements())
    if (candidate.name == name) d = candidate;
  const testing::ReservedPort reserved_port;
  const int port = reserved_port.number();
  const auto start = Clock::now();
  ProcessRanks ranks(
      n, [&](int r) { return rank_env(r, n, port, backend); },
      [&](int r) {
        auto pg = init_process_group();
        d.run(*pg, r, n);
        throw std::runtime_error("the disagreement went unnoticed on this rank");
      });
  for (const auto& r : ranks.wait_all(90s)) {
    EXPECT_EQ(r.exit_code, testing::kExitMismatchError) << describe(r);
    for (const auto& fragment : d.named) EXPECT_NE(r.output.find(fragment), std::string::npos) << describe(r);
    // Well within the 60 s timeout: found in band or through the group's
    // first failure, not by the watchdog.
    EXPECT_LT(seconds_between(start, r.ended), 20.0) << describe(r);
  }
}

std::vector<std::tuple<std::string, int, std::string>> all_params() {
  std::vector<std::tuple<std::string, int, std::string>> out;
  for (const std::string backend : {"shm", "tcp", "hier"})
    for (int n : {2, 3, 4}) {
      if (backend == "hier" && n < 3) continue;  // two pretend hosts need one rank more than a host has
      for (const auto& d : disagreements()) out.emplace_back(backend, n, d.name);
    }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Backends, Mismatch, ::testing::ValuesIn(all_params()), [](const auto& info) {
  return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "ranks_" +
         std::get<2>(info.param);
});

}  // namespace
}  // namespace lockstep
