// Digests of training state; see state_digest.h.
#include "state_digest.h"

#include <cstring>
#include <sstream>
#include <string>

#include "optimizer_state.h"

namespace lockstep::torch {

// FNV-1a's step on 8-byte words in four independent lanes (the
// multiplications overlap: several GB/s, where a byte at a time is under
// one), the tail a byte at a time.
std::uint64_t digest_of(const void* data, std::size_t size, std::uint64_t h) {
  constexpr std::uint64_t kPrime = 0x100000001b3ull;
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t lane[4] = {h, h ^ 1, h ^ 2, h ^ 3};
  std::size_t i = 0;
  for (; i + 32 <= size; i += 32)
    for (int k = 0; k < 4; ++k) {
      std::uint64_t word;
      std::memcpy(&word, p + i + 8 * k, 8);
      lane[k] = (lane[k] ^ word) * kPrime;
    }
  h = ((lane[0] * kPrime ^ lane[1]) * kPrime ^ lane[2]) * kPrime ^ lane[3];
  for (; i < size; ++i) h = (h ^ p[i]) * kPrime;
  return h;
}

std::uint64_t digest_of(const std::vector<::torch::Tensor>& tensors, std::uint64_t h) {
  for (const auto& t : tensors) {
    const ::torch::Tensor c = t.detach().contiguous();
    h = digest_of(c.data_ptr(), c.nbytes(), h);
  }
  return h;
}

// Parameter by parameter, not the serialized form as a whole: that names
// each parameter's state by the address of the parameter's tensor, which
// differs from process to process. libtorch's optimizers' state by its
// tensors; another's by each parameter's state serialized alone (slower:
// an archive each). The learning rates are the options a scheduler changes.
std::uint64_t digest_of(::torch::optim::Optimizer& optimizer, std::uint64_t h, const std::vector<std::size_t>* only) {
  for (const auto& group : optimizer.param_groups()) {
    const double lr = group.options().get_lr();
    h = digest_of(&lr, sizeof lr, h);
  }
  const std::vector<::torch::Tensor> params = params_of(optimizer);
  for (std::size_t i : only != nullptr ? *only : all_indices(params.size())) {
    auto* state = state_of(optimizer, params.at(i));
    if (state == nullptr) {
      h = digest_of("-", 1, h);
      continue;
    }
    if (auto known = state_tensors(*state)) {
      for (const auto& t : known->first) h = t.defined() ? digest_of({t}, h) : digest_of("u", 1, h);
      h = digest_of(&known->second, sizeof known->second, h);
      continue;
    }
    ::torch::serialize::OutputArchive archive;
    state->serialize(archive);
    std::ostringstream out;
    archive.save_to(out);
    const std::string bytes = out.str();
    h = digest_of(bytes.data(), bytes.size(), h);
  }
  return h;
}

}  // namespace lockstep::torch
