// For the tests of optimizer state moved between ranks or cut into pieces:
// two optimizers hold the same state, parameter by parameter (groups in
// order), bit for bit. Header-only; gtest assertions.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "torch/optimizer_state.h"

namespace lockstep::testing {

// Every state tensor (sizes and bytes) and step count of `a` equal to `b`'s.
inline void expect_same_state(::torch::optim::Optimizer& a, ::torch::optim::Optimizer& b, const std::string& what) {
  const auto pa = torch::params_of(a);
  const auto pb = torch::params_of(b);
  ASSERT_EQ(pa.size(), pb.size()) << what;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    auto* sa = torch::state_of(a, pa[i]);
    auto* sb = torch::state_of(b, pb[i]);
    ASSERT_EQ(sa == nullptr, sb == nullptr) << what << ": parameter " << i;
    if (sa == nullptr) continue;
    const auto ta = torch::state_tensors(*sa);
    const auto tb = torch::state_tensors(*sb);
    ASSERT_TRUE(ta && tb) << what;
    EXPECT_EQ(ta->second, tb->second) << what << ": step of parameter " << i;
    for (std::size_t k = 0; k < ta->first.size(); ++k) {
      ASSERT_EQ(ta->first[k].defined(), tb->first[k].defined()) << what << ": parameter " << i << " tensor " << k;
      if (!ta->first[k].defined()) continue;
      EXPECT_EQ(ta->first[k].sizes(), tb->first[k].sizes()) << what << ": parameter " << i << " tensor " << k;
      EXPECT_TRUE(::torch::equal(ta->first[k], tb->first[k])) << what << ": parameter " << i << " tensor " << k;
    }
  }
}

}  // namespace lockstep::testing
