// The main job on a slice of the real Fashion-MNIST data, launched as users
// launch it: the loss falls; two ranks reach the same parameters as one rank
// on the same global batches; a new run resumes from the checkpoint; and a
// rank killed mid-training is restarted by the launcher and resumes.
#include <gtest/gtest.h>

#include <signal.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <filesystem>
#include <regex>
#include <thread>

#include "harness/launcher.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::Launcher;
using testing::TempDir;

constexpr char kData[] = "/usr/share/datasets/fashion-mnist";

bool have_data() { return std::filesystem::exists(std::string(kData) + "/train-images-idx3-ubyte.gz"); }

testing::RankResult run(std::vector<std::string> launcher_args, std::vector<std::string> program_args,
                        Duration timeout = 240s) {
  launcher_args.push_back("--");
  launcher_args.push_back(FASHION_MNIST);
  launcher_args.insert(launcher_args.end(), program_args.begin(), program_args.end());
  Launcher launcher(LOCKSTEP_CLI, launcher_args, {{"LOCKSTEP_TIMEOUT", "60"}});
  return launcher.wait(timeout);
}

std::vector<double> train_losses(const std::string& output) {
  std::vector<double> out;
  const std::regex re(R"(epoch \d+/\d+: train loss ([0-9.]+))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back(std::stod((*it)[1]));
  return out;
}

TEST(FashionMnist, TheLossFallsOnTwoRanks) {
  if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist is not installed (make test installs it)";
  TempDir dir;
  const auto r = run({"--nproc-per-node", "2"}, {"--subset", "3072", "--test-subset", "1000", "--epochs", "2",
                                                  "--batch-size", "32", "--checkpoint", dir.path() + "/ckpt",
                                                  "--progress", "0"});
  ASSERT_EQ(r.exit_code, 0) << testing::describe(r);
  const auto losses = train_losses(r.output);
  ASSERT_EQ(losses.size(), 2u) << r.output;
  EXPECT_LT(losses[1], losses[0]) << r.output;
  EXPECT_LT(losses[1], 2.0) << r.output;  // ln(10) = 2.30 is chance
  EXPECT_NE(r.output.find("test accuracy"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exposed communication"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/ckpt"));
}

// The two runs convolve batches of 64 and of 32, and the kernels libtorch
// picks for each sum in different orders. With Debian's libtorch 1.13
// (OpenBLAS) the parameters after 8 steps agree to 1e-5; with PyTorch 2.11's
// (MKL and oneDNN, measured on a 16-core Xeon) they differ by up to 1.8e-4,
// with no DDP in the difference: the same runs agree to 1e-5 on 1.13 with
// gradients dropped between steps as 2.x does.
#if TORCH_VERSION_MAJOR >= 2
constexpr double kRtol = 1e-3;
#else
constexpr double kRtol = 1e-5;
#endif

TEST(FashionMnist, TwoRanksReachTheParametersOfOneRankOnTheSameGlobalBatches) {
  if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist is not installed (make test installs it)";
  TempDir dir;
  const std::vector<std::string> common{"--subset", "1024", "--test-subset", "200", "--epochs", "1",
                                        "--max-steps", "8", "--progress", "0"};
  auto one = common, two = common;
  one.insert(one.end(), {"--batch-size", "64", "--checkpoint", dir.path() + "/one.ckpt", "--save-params",
                         dir.path() + "/one.pt"});
  two.insert(two.end(), {"--batch-size", "32", "--checkpoint", dir.path() + "/two.ckpt", "--save-params",
                         dir.path() + "/two.pt"});
  const auto a = run({"--nproc-per-node", "1"}, one);
  const auto b = run({"--nproc-per-node", "2"}, two);
  ASSERT_EQ(a.exit_code, 0) << testing::describe(a);
  ASSERT_EQ(b.exit_code, 0) << testing::describe(b);
  torch::serialize::InputArchive archive_a, archive_b;
  archive_a.load_from(dir.path() + "/one.pt");
  archive_b.load_from(dir.path() + "/two.pt");
  int compared = 0;
  for (const char* name : {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight", "fc1.bias",
                           "fc2.weight", "fc2.bias"}) {
    // Module::save nests each submodule's tensors in its own archive.
    const std::string full(name);
    const auto dot = full.find('.');
    torch::serialize::InputArchive sub_a, sub_b;
    archive_a.read(full.substr(0, dot), sub_a);
    archive_b.read(full.substr(0, dot), sub_b);
    torch::Tensor pa, pb;
    sub_a.read(full.substr(dot + 1), pa);
    sub_b.read(full.substr(dot + 1), pb);
    EXPECT_TRUE(torch::allclose(pa, pb, kRtol, kRtol * 0.1))
        << name << " differs by " << (pa - pb).abs().max().item<double>();
    ++compared;
  }
  EXPECT_EQ(compared, 8);
}

TEST(FashionMnist, ANewRunResumesFromTheCheckpoint) {
  if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist is not installed (make test installs it)";
  TempDir dir;
  const std::vector<std::string> common{"--subset", "1024", "--test-subset", "200", "--batch-size", "32",
                                        "--checkpoint", dir.path() + "/ckpt", "--progress", "0"};
  auto first = common, second = common;
  first.insert(first.end(), {"--epochs", "1"});
  second.insert(second.end(), {"--epochs", "2"});
  ASSERT_EQ(run({"--nproc-per-node", "2"}, first).exit_code, 0);
  const auto r = run({"--nproc-per-node", "2"}, second);
  ASSERT_EQ(r.exit_code, 0) << testing::describe(r);
  EXPECT_NE(r.output.find("resuming from " + dir.path() + "/ckpt: 1 epoch(s) already done"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("epoch 1/2:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("epoch 2/2:"), std::string::npos) << r.output;
}

TEST(FashionMnist, AKilledRankIsRestartedAndTrainingResumes) {
  if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist is not installed (make test installs it)";
  TempDir dir;
  const std::string checkpoint = dir.path() + "/ckpt";
  Launcher launcher(LOCKSTEP_CLI,
                    {"--nproc-per-node", "2", "--max-restarts", "1", "--", FASHION_MNIST, "--subset", "4096",
                     "--test-subset", "200", "--epochs", "3", "--batch-size", "32", "--checkpoint", checkpoint,
                     "--fresh", "--progress", "0"},
                    {{"LOCKSTEP_TIMEOUT", "60"}});
  ASSERT_TRUE(testing::wait_for_file(checkpoint, 180s)) << "no checkpoint after the first epoch";
  const auto ranks = testing::children_of(launcher.pid());
  ASSERT_EQ(ranks.size(), 2u);
  ::kill(ranks[1], SIGKILL);  // during epoch 2
  const auto r = launcher.wait(300s);
  ASSERT_EQ(r.exit_code, 0) << testing::describe(r);
  EXPECT_NE(r.output.find("killed by signal 9"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("restarting all ranks (restart 1 of 1)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("epoch(s) already done"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("epoch 3/3:"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace lockstep
