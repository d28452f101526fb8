// The numeric options of every `lockstep` subcommand, through the real
// binary: a count of zero or less, or a NaN or infinite number, is refused
// with a message naming the option and what it takes, before anything runs
// (they used to run one rank for --np 0, print rows for -n 0, or take a
// --grace-period of nan as 0). And bench takes its backend as every
// lockstep program does: --backend, else LOCKSTEP_BACKEND, else auto.
// `lockstep --version` says what the build has, and every usage line
// names the program.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "harness/launcher.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::contains;

struct Refusal {
  std::vector<std::string> args;
  std::string message;  // a fragment of what the CLI prints
};

// Each command line fails, says `message`, and shows that nothing started.
void expect_refused(const std::vector<Refusal>& cases, const std::string& started) {
  for (const auto& c : cases) {
    const auto r = testing::run_program(LOCKSTEP_CLI, c.args, {}, 30s);
    std::string line;
    for (const auto& a : c.args) line += a + " ";
    EXPECT_EQ(r.signal, 0) << line << testing::describe(r);
    EXPECT_NE(r.exit_code, 0) << line << testing::describe(r);
    EXPECT_TRUE(contains(r.output, c.message)) << line << "\n" << r.output;
    EXPECT_FALSE(contains(r.output, started)) << line << "\n" << r.output;
  }
}

TEST(CliOptions, BenchRefusesCountsBelowOneAndNumbersThatAreNotFinite) {
  const std::vector<std::string> sweep{"-b", "1K", "-e", "1K"};
  const auto bench = [&](std::vector<std::string> more) {
    std::vector<std::string> args{"bench"};
    args.insert(args.end(), sweep.begin(), sweep.end());
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  expect_refused({{bench({"--np", "0"}), "--np: '0' is not a whole number from 1 to 65536"},
                  {bench({"--np", "-3"}), "--np: '-3' is not a whole number from 1 to 65536"},
                  {bench({"-n", "0"}), "--iters: '0' is not a whole number of 1 or more"},
                  {bench({"-n", "-1"}), "--iters: '-1' is not a whole number of 1 or more"},
                  {bench({"-w", "-1"}), "--warmup_iters: '-1' is not a whole number of 0 or more"},
                  {bench({"-f", "nan"}), "--stepfactor: 'nan' is not a number above 0"},
                  {bench({"-f", "inf"}), "--stepfactor: 'inf' is not a number above 0"},
                  {bench({"-c", "2"}), "--check: '2' is not a whole number from 0 to 1"},
                  {bench({"-r", "-1"}), "--root: '-1' is not a whole number of 0 or more"},
                  // Read with base 0, these were 8 and 16 ranks, silently.
                  {bench({"--np", "010"}), "--np: '010' is not a whole number from 1 to 65536 written in decimal"},
                  {bench({"--np", "0x10"}), "--np: '0x10' is not a whole number from 1 to 65536 written in decimal"}},
                 "# lockstep bench:");
}

// -f 1.5 from 1 byte rounded back to 1 byte, row after row, for ever. A
// world of one, without --np: at the deadline the one process is killed.
TEST(CliOptions, BenchSweepsWithASmallFactorEnd) {
  const auto r = testing::run_program(
      LOCKSTEP_CLI, {"bench", "-d", "uint8", "-b", "1", "-e", "4", "-f", "1.5", "-n", "1", "-w", "0"}, {}, 30s);
  ASSERT_EQ(r.exit_code, 0) << testing::describe(r);
  const std::regex row(R"(\n +(\d+) +\d+ +uint8 )");
  std::vector<std::string> sizes;
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), row); it != std::sregex_iterator(); ++it)
    sizes.push_back((*it)[1]);
  EXPECT_EQ(sizes, (std::vector<std::string>{"1", "2", "3", "4"})) << r.output;
}

TEST(CliOptions, RunRefusesNumbersThatAreNotFiniteAndNegativeCounts) {
  expect_refused({{{"run", "--grace-period", "nan", "--", "true"}, "--grace-period: 'nan' is not a number from 0 to 3600"},
                  {{"run", "--grace-period", "-1", "--", "true"}, "--grace-period: '-1' is not a number from 0 to 3600"},
                  {{"run", "--rdzv-timeout", "nan", "--", "true"}, "--rdzv-timeout: 'nan' is not a number from 0.001"},
                  {{"run", "--monitor-interval", "inf", "--", "true"}, "--monitor-interval: 'inf' is not a number"},
                  {{"run", "--max-restarts", "-1", "--", "true"}, "--max-restarts: '-1' is not a whole number of 0"},
                  {{"run", "--node-rank", "-2", "--", "true"}, "--node-rank: '-2' is not a whole number of 0"}},
                 "rank(s) on node");
}

TEST(CliOptions, SimulateRefusesSizesBelowOneAndNumbersThatAreNotFinite) {
  testing::TempDir dir;
  const auto simulate = [&](std::vector<std::string> more) {
    std::vector<std::string> args{"simulate", "--model", "mlp", "--out", dir.path()};
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  expect_refused({{simulate({"--bucket-cap-mb", "nan"}), "--bucket-cap-mb: 'nan' is not a number above 0"},
                  {simulate({"--bucket-cap-mb", "-1"}), "--bucket-cap-mb: '-1' is not a number above 0"},
                  {simulate({"--jitter", "nan"}), "--jitter: 'nan' is not a number from 0 to 1"},
                  {simulate({"--jitter", "-1"}), "--jitter: '-1' is not a number from 0 to 1"},
                  {simulate({"--jitter", "1.5"}), "--jitter: '1.5' is not a number from 0 to 1"},
                  {simulate({"--batch", "-5"}), "--batch: '-5' is not a whole number of 1 or more"},
                  {simulate({"--ms-per-sample", "nan"}), "--ms-per-sample: 'nan' is not a finite number above 0"},
                  {simulate({"--data-ms", "nan"}), "--data-ms: 'nan' is not a finite number of 0 or more"},
                  {simulate({"--ranks-per-host", "-1"}), "--ranks-per-host: '-1' is not a whole number from 1"},
                  {simulate({"--trace-rank", "-1"}), "--trace-rank: '-1' is not a whole number of 0 or more"},
                  {simulate({"--accumulate", "0"}), "--accumulate: '0' is not a whole number of 1 or more"}},
                 "# lockstep simulate");
  // Lists are checked item by item: "2.5" was a world of 2, "nan" a number.
  expect_refused({{simulate({"--world-sizes", "1,2.5"}), "--world-sizes 1,2.5: '2.5' is not a whole number from 1"},
                  {simulate({"--world-sizes", "nan"}), "--world-sizes nan: 'nan' is not a whole number"},
                  {simulate({"--world-sizes", "4,0"}), "--world-sizes 4,0: '0' is not a whole number"},
                  {simulate({"--layers", "4096,nan"}), "--layers 4096,nan: 'nan' is not a whole number"}},
                 "# lockstep simulate");
}

// The fully sharded step's options: out of range, or given without
// --strategy fsdp (where they would change nothing), refused by name.
TEST(CliOptions, SimulateRefusesShardingOptionsOutOfRangeOrWithoutTheStrategy) {
  testing::TempDir dir;
  const auto simulate = [&](std::vector<std::string> more) {
    std::vector<std::string> args{"simulate", "--model", "mlp", "--out", dir.path()};
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  expect_refused({{simulate({"--strategy", "zero"}), "--strategy: zero not in {ddp,fsdp}"},
                  {simulate({"--strategy", "fsdp", "--prefetch", "-1"}), "--prefetch: '-1' is not a whole number"},
                  {simulate({"--strategy", "fsdp", "--units", "2.5"}), "--units: '2.5' is not a whole number"},
                  {simulate({"--strategy", "fsdp", "--optimizer-bytes", "nan"}),
                   "--optimizer-bytes: 'nan' is not a finite number of 0 or more"},
                  {simulate({"--strategy", "fsdp", "--param-dtype", "fp16"}), "--param-dtype: fp16 not in {fp32,bf16}"},
                  {simulate({"--units", "3"}), "describe the fully sharded step; add --strategy fsdp"},
                  {simulate({"--strategy", "fsdp", "--accumulate", "4"}), "--accumulate is DDP's no_sync"}},
                 "# lockstep simulate");
}

// A profile is of one batch, which its file does not record: --batch
// against it is refused unless --trace-batch says which batch it was (then
// rescaled, with a note), and without either the report does not make up a
// batch (it said "batch 1 per rank").
TEST(CliOptions, SimulateRefusesABatchAProfileWasNotRecordedAt) {
  testing::TempDir dir;
  const std::string stats = dir.path() + "/s.rank0.json";
  std::ofstream(stats) << R"({"compute_ms": 30, "data_ms": 0, "buckets": [{"parameters": 1, "bytes": 1048576}]})";
  const auto simulate = [&](std::vector<std::string> more) {
    std::vector<std::string> args{"simulate", "--stats", stats, "--preset", "cpu-eth10", "--world-sizes", "2",
                                  "--out", dir.path()};
    args.insert(args.end(), more.begin(), more.end());
    return testing::run_program(LOCKSTEP_CLI, args, {}, 30s);
  };
  const auto refused = simulate({"--batch", "128"});
  EXPECT_NE(refused.exit_code, 0) << testing::describe(refused);
  EXPECT_TRUE(contains(refused.output, "a profile is of the batch it was recorded at")) << refused.output;
  EXPECT_TRUE(contains(refused.output, "--trace-batch")) << refused.output;
  const auto rescaled = simulate({"--batch", "128", "--trace-batch", "32"});
  EXPECT_EQ(rescaled.exit_code, 0) << testing::describe(rescaled);
  EXPECT_TRUE(contains(rescaled.output, "rescaled linearly to batch 128")) << rescaled.output;
  EXPECT_TRUE(contains(rescaled.output, "forward 40.0 ms, backward 80.0 ms")) << rescaled.output;
  EXPECT_TRUE(contains(rescaled.output, "batch 128 per rank")) << rescaled.output;
  const auto unknown = simulate({});
  EXPECT_EQ(unknown.exit_code, 0) << testing::describe(unknown);
  EXPECT_FALSE(contains(unknown.output, "batch 1 per rank")) << unknown.output;
  EXPECT_TRUE(contains(unknown.output, "batch not known")) << unknown.output;
}

// Three runs' compute of one job (--compute-trace, comma-separated): each
// predicted step carries the range over them, the table is the median run,
// and a compute trace the workload would ignore is refused.
TEST(CliOptions, SimulateGivesEachStepTheRangeOverProfiledRuns) {
  testing::TempDir dir;
  const std::string stats = dir.path() + "/s.rank0.json";
  std::ofstream(stats) << R"({"compute_ms": 30, "data_ms": 0, "buckets": [{"parameters": 1, "bytes": 1048576}]})";
  // As DDP traces N ranks under no_sync: forwards 10 ms long, `every` ms
  // apart; backward untimed.
  const auto compute_trace = [&](const std::string& name, int every) {
    std::string events;
    for (int step = 0; step < 8; ++step)
      events += R"({"name":"forward","cat":"step","ph":"X","ts":)" + std::to_string(1000000 + step * every * 1000) +
                R"(,"dur":10000,"pid":0},{"name":"backward","cat":"step","ph":"X","ts":0,"dur":0,"pid":0},)";
    events.pop_back();
    std::ofstream(dir.path() + "/" + name) << R"({"traceEvents":[)" << events << "]}";
    return dir.path() + "/" + name;
  };
  const std::string runs =
      compute_trace("a.json", 50) + "," + compute_trace("b.json", 30) + "," + compute_trace("c.json", 40);
  const std::string json = dir.path() + "/p.json";
  const auto r = testing::run_program(LOCKSTEP_CLI,
                                      {"simulate", "--stats", stats, "--compute-trace", runs, "--preset", "cpu-eth10",
                                       "--world-sizes", "2,4", "--out", dir.path(), "--json", json},
                                      {}, 30s);
  ASSERT_EQ(r.exit_code, 0) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "The compute of 3 profiled runs")) << r.output;
  // Three runs alike hold a fourth one time in two: the report says so.
  EXPECT_TRUE(contains(r.output, "probability 50%")) << r.output;
  EXPECT_TRUE(contains(r.output, "range over the runs (ms)")) << r.output;
  EXPECT_TRUE(contains(r.output, "forward 10.0 ms")) << r.output;
  const auto predicted = nlohmann::json::parse(std::ifstream(json));
  EXPECT_EQ(predicted["profiled_runs"], 3);
  for (const auto& p : predicted["predictions"]) {
    // Compute 30, 40 and 50 ms: the median run's step strictly inside.
    EXPECT_LT(p["step_ms_low"].get<double>(), p["step_ms"].get<double>()) << p.dump();
    EXPECT_LT(p["step_ms"].get<double>(), p["step_ms_high"].get<double>()) << p.dump();
    EXPECT_GT(p["step_ms_high"].get<double>() - p["step_ms_low"].get<double>(), 10) << p.dump();
  }
  const auto one = testing::run_program(LOCKSTEP_CLI,
                                        {"simulate", "--stats", stats, "--preset", "cpu-eth10", "--world-sizes", "2",
                                         "--out", dir.path(), "--json", json},
                                        {}, 30s);
  ASSERT_EQ(one.exit_code, 0) << testing::describe(one);
  EXPECT_FALSE(contains(one.output, "range over the runs")) << one.output;
  const auto alone = nlohmann::json::parse(std::ifstream(json));
  EXPECT_EQ(alone["predictions"][0]["step_ms_low"], alone["predictions"][0]["step_ms_high"]);
  // The fully sharded step: the same range over the runs.
  const auto sharded = testing::run_program(LOCKSTEP_CLI,
                                            {"simulate", "--stats", stats, "--compute-trace", runs, "--strategy",
                                             "fsdp", "--preset", "cpu-eth10", "--world-sizes", "2,4", "--out",
                                             dir.path(), "--json", json},
                                            {}, 30s);
  ASSERT_EQ(sharded.exit_code, 0) << testing::describe(sharded);
  EXPECT_TRUE(contains(sharded.output, "The compute of 3 profiled runs")) << sharded.output;
  EXPECT_TRUE(contains(sharded.output, "range over the runs (ms)")) << sharded.output;
  const auto fsdp = nlohmann::json::parse(std::ifstream(json))["fsdp"];
  EXPECT_EQ(fsdp["profiled_runs"], 3);
  for (const auto& p : fsdp["predictions"]) {
    EXPECT_LT(p["step_ms_low"].get<double>(), p["step_ms"].get<double>()) << p.dump();
    EXPECT_LT(p["step_ms"].get<double>(), p["step_ms_high"].get<double>()) << p.dump();
  }
  expect_refused({{{"simulate", "--model", "mlp", "--compute-trace", runs, "--out", dir.path()},
                   "a description has none: give --trace or --stats too"},
                  {{"simulate", "--sharded-trace", dir.path() + "/fsdp.json", "--compute-trace", runs, "--out",
                    dir.path()},
                   "leave --compute-trace out with --sharded-trace"}},
                 "# lockstep simulate");
}

TEST(CliOptions, DoctorRefusesWorldSizesBelowOneAndNumbersThatAreNotFinite) {
  testing::TempDir dir;
  const auto doctor = [&](std::vector<std::string> more) {
    std::vector<std::string> args{"doctor", "--out", dir.path()};
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  expect_refused({{doctor({"--ranks", "1,-2"}), "--ranks 1,-2: '-2' is not a world size"},
                  {doctor({"--ranks", "2.5"}), "--ranks 2.5: '2.5' is not a world size"},
                  {doctor({"--ranks", "1,x"}), "--ranks 1,x: 'x' is not a world size"},
                  {doctor({"--max-ranks", "0"}), "--max-ranks: '0' is not a whole number from 1"},
                  {doctor({"--batch", "0"}), "--batch: '0' is not a whole number of 1 or more"},
                  {doctor({"--steps", "-1"}), "--steps: '-1' is not a whole number of 1 or more"},
                  {doctor({"--bucket-cap-mb", "nan"}), "--bucket-cap-mb: 'nan' is not a number above 0"}},
                 "lockstep doctor: ");
}

// The backend bench runs on: its header names the one the group chose.
std::string bench_backend(std::vector<std::string> more, testing::EnvMap env) {
  std::vector<std::string> args{"bench", "--np", "2", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0"};
  args.insert(args.end(), more.begin(), more.end());
  const auto r = testing::run_program(LOCKSTEP_CLI, args, env, 60s);
  EXPECT_EQ(r.exit_code, 0) << testing::describe(r);
  std::smatch m;
  if (!std::regex_search(r.output, m, std::regex(R"(# lockstep bench: 2 ranks, backend (\w+))"))) return r.output;
  return m[1];
}

// Its --backend default, auto, used to win over LOCKSTEP_BACKEND.
TEST(CliOptions, BenchTakesLockstepBackendUnlessBackendIsGiven) {
  EXPECT_EQ(bench_backend({}, {{"LOCKSTEP_BACKEND", "tcp"}}), "tcp");
  EXPECT_EQ(bench_backend({"--backend", "shm"}, {{"LOCKSTEP_BACKEND", "tcp"}}), "shm");
}

// A newcomer's first command, `lockstep --version`, used to answer "A
// subcommand is required".
TEST(CliOptions, VersionNamesTheVersionLibtorchAndEveryBackendAndExitsZero) {
  for (const std::string flag : {"--version", "-V"}) {
    const auto r = testing::run_program(LOCKSTEP_CLI, {flag}, {}, 30s);
    EXPECT_EQ(r.exit_code, 0) << flag << testing::describe(r);
    EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(^lockstep \d+\.\d+\.\d+\n)"))) << flag << "\n" << r.output;
    EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(\nlibtorch: (\d+\.\d+|none))"))) << flag << "\n" << r.output;
    // Each backend of the table, built in or listed as not built.
    std::smatch backends;
    ASSERT_TRUE(std::regex_search(r.output, backends, std::regex(R"(\nbackends: ([^\n]*))")))
        << flag << "\n" << r.output;
    for (const std::string name : {"shm", "tcp", "hier", "mpi", "nccl"})
      EXPECT_TRUE(std::regex_search(backends[1].str(), std::regex("\\b" + name + "\\b")))
          << name << " in " << backends[1];
    EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(\nCUDA memory: (yes|no))"))) << flag << "\n" << r.output;
  }
}

// CLI11 printed "Usage: run [OPTIONS] program...", without the program's name.
TEST(CliOptions, EveryUsageLineNamesTheProgram) {
  const auto top = testing::run_program(LOCKSTEP_CLI, {"--help"}, {}, 30s);
  EXPECT_EQ(top.exit_code, 0) << testing::describe(top);
  EXPECT_TRUE(contains(top.output, "Usage: lockstep [OPTIONS] SUBCOMMAND")) << top.output;
  for (const std::string command : {"run", "bench", "doctor", "simulate"}) {
    const auto r = testing::run_program(LOCKSTEP_CLI, {command, "--help"}, {}, 30s);
    EXPECT_EQ(r.exit_code, 0) << command << testing::describe(r);
    EXPECT_TRUE(contains(r.output, "Usage: lockstep " + command + " [OPTIONS]")) << r.output;
  }
}

}  // namespace
}  // namespace lockstep
