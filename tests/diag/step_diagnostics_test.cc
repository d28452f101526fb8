// Why a job is slow, through the real launcher and the doctor's MLP: a
// traced job yields one timeline with a track per rank and the expected
// events; a straggler is named on every rank; doctor writes a report and a
// plot.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "harness/launcher.h"
#include "harness/process_ranks.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::Launcher;
using testing::TempDir;

using testing::contains;

TEST(Timeline, ATracedJobYieldsOneFileWithATrackPerRank) {
  TempDir dir;
  const std::string prefix = dir.path() + "/trace";
  Launcher launcher(LOCKSTEP_CLI,
                    {"--nproc-per-node", "2", "--", DOCTOR_MLP, "--layers", "3", "--width", "128", "--batch", "8",
                     "--steps", "4", "--bucket-cap-mb", "0.05"},
                    {{"LOCKSTEP_TRACE", prefix}});
  const auto r = launcher.wait(120s);
  ASSERT_EQ(r.exit_code, 0) << testing::describe(r);
  const auto j = nlohmann::json::parse(std::ifstream(prefix + ".json"));
  std::set<int> pids;
  std::set<std::string> names;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    pids.insert(e["pid"].get<int>());
    const std::string name = e["name"];
    names.insert(name.substr(0, name.find_first_of(" #")));
    EXPECT_GE(e["dur"].get<std::int64_t>(), 0);
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1}));
  for (const char* expected : {"forward", "backward", "wait", "bucket", "allreduce", "between"})
    EXPECT_TRUE(names.count(expected)) << "no '" << expected << "' event; names: " << j.dump().substr(0, 500);
}

TEST(StepStatistics, AStragglerIsNamed) {
  TempDir dir;
  const std::string prefix = dir.path() + "/stats";
  Launcher launcher(LOCKSTEP_CLI,
                    {"--nproc-per-node", "3", "--", DOCTOR_MLP, "--layers", "2", "--width", "64", "--batch", "4",
                     "--steps", "25", "--slow-rank", "2", "--slow-ms", "30"},
                    {{"LOCKSTEP_STATS", prefix}});
  const auto r = launcher.wait(120s);
  ASSERT_EQ(r.exit_code, 0) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "rank 2 computes")) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    const auto j = nlohmann::json::parse(std::ifstream(prefix + ".rank" + std::to_string(rank) + ".json"));
    EXPECT_EQ(j["stragglers"], nlohmann::json::array({2})) << j.dump();
    EXPECT_GT(j["steps"].get<int>(), 10);
  }
}

TEST(Doctor, ReportsAndPlotsTheBuiltInMlp) {
  TempDir dir;
  testing::ProcessRanks doctor(
      1, [](int) { return testing::EnvMap{}; },
      [&](int) {
        const std::string out = dir.path() + "/doctor";
        ::execl(LOCKSTEP_CLI, LOCKSTEP_CLI, "doctor", "--ranks", "1,2", "--layers", "3", "--width", "256", "--batch",
                "16", "--steps", "12", "--out", out.c_str(), nullptr);
        throw std::runtime_error("exec failed");
      });
  const auto r = doctor.wait_all(300s)[0];
  ASSERT_EQ(r.exit_code, 0) << testing::describe(r);
  std::ifstream report(dir.path() + "/doctor/report.md");
  const std::string text((std::istreambuf_iterator<char>(report)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(text, "Weak scaling:")) << text;
  EXPECT_TRUE(contains(text, "| 2 |")) << text;
  EXPECT_TRUE(contains(text, "efficiency")) << text;
  // The plot needs gnuplot (make test installs it); without it the report
  // says so instead.
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) {
    EXPECT_TRUE(contains(text, "No plot: gnuplot is not installed")) << text;
    return;
  }
  std::ifstream png(dir.path() + "/doctor/scaling.png", std::ios::binary);
  char magic[8] = {};
  png.read(magic, 8);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG") << "no plot, though gnuplot is installed";
}

}  // namespace
}  // namespace lockstep
