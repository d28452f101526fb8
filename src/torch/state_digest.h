// Digests of training state, for telling copies apart (a replacement's
// state against its peers', a partition's backup against its owner): not
// for adversaries. Free functions; as thread-safe as what they read.
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lockstep::torch {

constexpr std::uint64_t kDigestStart = 0xcbf29ce484222325ull;

// Bytes, continued from `h`.
std::uint64_t digest_of(const void* data, std::size_t size, std::uint64_t h);

// Tensors' bytes in order, continued from `h`.
std::uint64_t digest_of(const std::vector<::torch::Tensor>& tensors, std::uint64_t h);

// The optimizer's groups' learning rates, then the state of the parameters
// `only` names (indices in the groups' order; all where null), continued
// from `h`.
std::uint64_t digest_of(::torch::optim::Optimizer& optimizer, std::uint64_t h,
                        const std::vector<std::size_t>* only = nullptr);

}  // namespace lockstep::torch
