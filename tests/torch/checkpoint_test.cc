// Checkpoints saved on rank 0 and loaded by rank 0 then broadcast: every
// rank ends with rank 0's values, a missing file is `false` everywhere, and
// a bad file or a failed save is an Error on every rank. Ranks are threads.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "torch/thread_ranks.h"
#include "lockstep/error.h"
#include "lockstep/torch/checkpoint.h"

namespace lockstep::torch {
namespace {

using lockstep::testing::TorchThreadWorld;
namespace fs = std::filesystem;

struct TempDir {
  TempDir() : path(fs::temp_directory_path() / ("lockstep_ckpt_" + std::to_string(::getpid()))) {
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path path;
};

constexpr int kRanks = 3;

TEST(Checkpoint, SavedOnRankZeroLoadedEverywhere) {
  TempDir dir;
  const std::string path = (dir.path / "model.ckpt").string();
  std::vector<::torch::nn::Linear> nets;
  for (int r = 0; r < kRanks; ++r) {
    ::torch::manual_seed(r);
    nets.emplace_back(4, 3);
  }
  const auto want = nets[0]->weight.detach().clone();
  TorchThreadWorld world(kRanks, "shm");
  std::vector<char> found(kRanks, 0);  // not vector<bool>: its elements share words, and the ranks write at once
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    EXPECT_FALSE(load_checkpoint_broadcast(pg, path, [&](auto& in) { net->load(in); }));  // none yet
    int writes = 0;
    save_checkpoint_on_rank0(pg, path, [&](auto& out) {
      ++writes;
      net->save(out);
    });
    EXPECT_EQ(writes, rank == 0 ? 1 : 0);
    found[static_cast<std::size_t>(rank)] = load_checkpoint_broadcast(pg, path, [&](auto& in) { net->load(in); });
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(found[static_cast<std::size_t>(r)]);
    EXPECT_TRUE(nets[static_cast<std::size_t>(r)]->weight.equal(want)) << "rank " << r;
  }
}

TEST(Checkpoint, ABadFileIsAnErrorOnEveryRank) {
  TempDir dir;
  const std::string path = (dir.path / "bad.ckpt").string();
  std::ofstream(path) << "not a checkpoint";
  const auto nets = testing::per_rank(kRanks, [](int) { return ::torch::nn::Linear(4, 3); });
  TorchThreadWorld world(kRanks, "shm");
  const auto errors = world.run_collecting([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    load_checkpoint_broadcast(pg, path, [&](auto& in) { net->load(in); });
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(r)]) << "rank " << r;
    try {
      std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot be read"), std::string::npos) << e.what();
      if (r > 0) EXPECT_NE(std::string(e.what()).find("rank 0 could not load"), std::string::npos) << e.what();
    }
  }
}

// A checkpoint whose tensor bytes changed on disk (one bit, in the middle
// of a weight) fails its archive checksum: an Error on every rank naming
// the file and the damaged entry, and nothing is loaded. (libtorch alone
// loads it silently: training then resumed from the damaged values.)
TEST(Checkpoint, DamagedTensorBytesAreAnErrorOnEveryRank) {
  TempDir dir;
  const std::string path = (dir.path / "damaged.ckpt").string();
  ::torch::nn::Linear saved(16, 16);
  {
    ::torch::NoGradGuard no_grad;
    saved->weight.fill_(1.25f);
  }
  TorchThreadWorld(1, "shm").run([&](int, ProcessGroup& pg) {
    save_checkpoint_on_rank0(pg, path, [&](auto& out) { saved->save(out); });
  });
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const float value = 1.25f;
  const std::string run_of_weights(reinterpret_cast<const char*>(&value), sizeof value);
  const auto at = bytes.find(run_of_weights + run_of_weights + run_of_weights);
  ASSERT_NE(at, std::string::npos) << "the weight's bytes are not stored as they are";
  bytes[at + 4 * 8 + 2] ^= 0x01;  // the 9th weight: 1.25 becomes 1.2500001
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;

  TorchThreadWorld world(kRanks, "shm");
  std::vector<::torch::nn::Linear> nets;
  for (int r = 0; r < kRanks; ++r) nets.emplace_back(16, 16);
  const auto errors = world.run_collecting([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    load_checkpoint_broadcast(pg, path, [&](auto& in) { net->load(in); });
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(r)]) << "rank " << r << " loaded a damaged checkpoint";
    try {
      std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("checkpoint " + path + " is damaged: its entry '"), std::string::npos) << what;
      EXPECT_NE(what.find("does not match its checksum"), std::string::npos) << what;
      EXPECT_NE(what.find("restore it from a copy"), std::string::npos) << what;
    }
    EXPECT_FALSE(nets[static_cast<std::size_t>(r)]->weight.eq(1.25f).any().item<bool>()) << "rank " << r;
  }
}

TEST(Checkpoint, AFailedSaveIsAnErrorOnEveryRank) {
  TempDir dir;
  const std::string path = (dir.path / "a_directory").string();  // a directory in the file's place
  fs::create_directories(path);
  const auto nets = testing::per_rank(kRanks, [](int) { return ::torch::nn::Linear(4, 3); });
  TorchThreadWorld world(kRanks, "shm");
  const auto errors = world.run_collecting([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    save_checkpoint_on_rank0(pg, path, [&](auto& out) { net->save(out); });
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(r)]) << "rank " << r;
    EXPECT_THROW(std::rethrow_exception(errors[static_cast<std::size_t>(r)]), Error);
  }
}

}  // namespace
}  // namespace lockstep::torch
