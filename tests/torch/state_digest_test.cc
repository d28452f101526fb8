// The digest a replacement's state and a partition's backup are checked
// by (state_digest.h): equal bytes give equal digests; a single bit
// changed anywhere (in each of the word lanes, in the tail read a byte at
// a time, in buffers of every length up to a few blocks) gives another;
// so do words that trade places, a different start, and the optimizer's
// learning rate or step count. A digest that missed any of these would
// let a replica that differs from its peers train on silently.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "torch/state_digest.h"

namespace lockstep::torch {
namespace {

std::vector<unsigned char> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<unsigned char> out(n);
  for (auto& b : out) b = static_cast<unsigned char>(gen());
  return out;
}

TEST(StateDigest, EveryBitFlippedInBuffersOfEveryLengthChangesIt) {
  // Lengths across the tail, one block of words and several: every bit
  // of every byte.
  for (std::size_t n = 1; n <= 200; ++n) {
    std::vector<unsigned char> bytes = random_bytes(n, static_cast<std::uint32_t>(n));
    const std::uint64_t clean = digest_of(bytes.data(), n, kDigestStart);
    ASSERT_EQ(clean, digest_of(bytes.data(), n, kDigestStart)) << n << " bytes";
    for (std::size_t i = 0; i < n; ++i)
      for (int bit = 0; bit < 8; ++bit) {
        bytes[i] ^= static_cast<unsigned char>(1u << bit);
        ASSERT_NE(clean, digest_of(bytes.data(), n, kDigestStart)) << n << " bytes, byte " << i << " bit " << bit;
        bytes[i] ^= static_cast<unsigned char>(1u << bit);
      }
  }
}

TEST(StateDigest, WordsThatTradePlacesChangeIt) {
  const std::size_t words = 64;
  std::vector<std::uint64_t> data(words);
  std::mt19937_64 gen(7);
  for (auto& w : data) w = gen();
  const std::uint64_t clean = digest_of(data.data(), words * 8, kDigestStart);
  for (std::size_t a = 0; a < words; ++a)
    for (std::size_t b = a + 1; b < words; ++b) {
      std::swap(data[a], data[b]);
      ASSERT_NE(clean, digest_of(data.data(), words * 8, kDigestStart)) << "words " << a << " and " << b;
      std::swap(data[a], data[b]);
    }
}

TEST(StateDigest, TheStartAndTheSplitIntoPiecesMatter) {
  const std::vector<unsigned char> bytes = random_bytes(1000, 3);
  EXPECT_NE(digest_of(bytes.data(), bytes.size(), kDigestStart), digest_of(bytes.data(), bytes.size(), 1));
  // A buffer continued from another's digest is a chain: the same pieces
  // give the same digest, and no piece can be left out unnoticed.
  const std::uint64_t first = digest_of(bytes.data(), 400, kDigestStart);
  EXPECT_EQ(digest_of(bytes.data() + 400, 600, first), digest_of(bytes.data() + 400, 600, first));
  EXPECT_NE(digest_of(bytes.data() + 400, 600, first), digest_of(bytes.data() + 400, 600, kDigestStart));
  // Zeros of two lengths differ (the length is in the bytes read).
  const std::vector<unsigned char> zeros(128, 0);
  std::set<std::uint64_t> seen;
  for (std::size_t n = 0; n <= zeros.size(); ++n) seen.insert(digest_of(zeros.data(), n, kDigestStart));
  EXPECT_EQ(seen.size(), zeros.size() + 1) << "zero buffers of some lengths share a digest";
}

TEST(StateDigest, TensorsAndTheOptimizersStateAndLearningRate) {
  ::torch::manual_seed(0);
  auto a = ::torch::randn({37, 11});
  auto b = a.clone();
  EXPECT_EQ(digest_of({a}, kDigestStart), digest_of({b}, kDigestStart));
  b[36][10] = std::nextafter(b[36][10].item<float>(), 2.f);  // the last element, one ulp
  EXPECT_NE(digest_of({a}, kDigestStart), digest_of({b}, kDigestStart));
  // A view that is not contiguous: its elements in order, as its copy's.
  EXPECT_EQ(digest_of({a.t()}, kDigestStart), digest_of({a.t().contiguous()}, kDigestStart));

  auto train = [](double lr, int steps) {
    ::torch::manual_seed(1);
    auto layer = ::torch::nn::Linear(4, 3);
    auto opt = std::make_unique<::torch::optim::Adam>(layer->parameters(), ::torch::optim::AdamOptions(lr));
    for (int s = 0; s < steps; ++s) {
      opt->zero_grad();
      layer(::torch::ones({2, 4})).sum().backward();
      opt->step();
    }
    return std::make_pair(layer, std::move(opt));
  };
  auto [l1, o1] = train(0.1, 2);
  auto [l2, o2] = train(0.1, 2);
  EXPECT_EQ(digest_of(*o1, kDigestStart), digest_of(*o2, kDigestStart));
  auto [l3, o3] = train(0.1, 3);  // one more step: other moments, another step count
  EXPECT_NE(digest_of(*o1, kDigestStart), digest_of(*o3, kDigestStart));
  static_cast<::torch::optim::AdamOptions&>(o2->param_groups()[0].options()).lr(0.05);
  EXPECT_NE(digest_of(*o1, kDigestStart), digest_of(*o2, kDigestStart)) << "a scheduler's learning rate is state";
}

}  // namespace
}  // namespace lockstep::torch
