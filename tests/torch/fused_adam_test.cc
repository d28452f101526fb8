// The fused Adam step ShardBackup's copy takes (src/torch/fused_adam.h):
// where it says it gives libtorch's bits, it does, over parameters of
// lengths with and without a vector tail, groups of their own options, a
// learning rate changed between steps and a parameter without a gradient
// on some steps; it does not take a step libtorch computes otherwise; and
// on Debian's libtorch 1.13 on a CPU with AVX2 and FMA it is the one taken
// (the figures in docs/performance.md rely on it).
#include <gtest/gtest.h>

#include <torch/torch.h>
#include <torch/version.h>

#include <cstring>
#include <vector>

#include "torch/fused_adam.h"
#include "torch/optimizer_state.h"

namespace lockstep::torch::detail {
namespace {

namespace optim = ::torch::optim;
using ::torch::Tensor;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// Two copies of the same parameters, in two groups of their own options.
struct Twin {
  std::vector<Tensor> params;
  std::unique_ptr<optim::Adam> adam;

  explicit Twin(const std::vector<std::int64_t>& lengths) {
    for (std::size_t k = 0; k < lengths.size(); ++k)
      params.push_back(::torch::linspace(-2.0, 3.0, lengths[k]).mul(static_cast<double>(k + 1)).sin_());
    std::vector<optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<Tensor>{params[0], params[1]},
                        std::make_unique<optim::AdamOptions>(optim::AdamOptions(3e-3)));
    groups.emplace_back(std::vector<Tensor>{params.begin() + 2, params.end()},
                        std::make_unique<optim::AdamOptions>(optim::AdamOptions(1e-2).betas({0.8, 0.95}).eps(1e-6)));
    adam = std::make_unique<optim::Adam>(std::move(groups), optim::AdamOptions(1e-3));
  }

  // Gradients of many magnitudes; parameter 1 has none on odd steps.
  void set_gradients(int step) {
    for (std::size_t k = 0; k < params.size(); ++k) {
      if (k == 1 && step % 2 == 1) {
        params[k].mutable_grad() = Tensor();
        continue;
      }
      params[k].mutable_grad() = ::torch::linspace(-1.0, 1.0, params[k].numel())
                                     .mul(static_cast<double>(step + 1))
                                     .pow(3)
                                     .mul(std::pow(10.0, -static_cast<double>(k)));
    }
  }
};

TEST(FusedAdam, GivesLibtorchsBitsWhereItSaysSo) {
  if (!fused_adam_matches())
    GTEST_SKIP() << "this libtorch's Adam (or this CPU, without AVX2 and FMA) rounds otherwise; ShardBackup keeps "
                    "libtorch's own step for its copy";
  const std::vector<std::int64_t> lengths = {3, 1029, 100003, 17};
  Twin reference(lengths), fused(lengths);
  for (int step = 0; step < 6; ++step) {
    if (step == 3)
      for (auto* twin : {&reference, &fused})
        static_cast<optim::AdamOptions&>(twin->adam->param_groups()[0].options()).lr(7e-4);
    reference.set_gradients(step);
    fused.set_gradients(step);
    reference.adam->step();
    if (step == 0) {
      EXPECT_FALSE(fused_adam_applies(*fused.adam)) << "the first step makes the state: libtorch's";
      fused.adam->step();
    } else {
      ASSERT_TRUE(fused_adam_applies(*fused.adam));
      fused_adam_step(*fused.adam);
    }
  }
  for (std::size_t k = 0; k < lengths.size(); ++k) {
    EXPECT_TRUE(same_bits(reference.params[k], fused.params[k])) << "parameter " << k;
    auto& a = static_cast<optim::AdamParamState&>(*state_of(*reference.adam, reference.params[k]));
    auto& b = static_cast<optim::AdamParamState&>(*state_of(*fused.adam, fused.params[k]));
    EXPECT_TRUE(same_bits(a.exp_avg(), b.exp_avg())) << "parameter " << k;
    EXPECT_TRUE(same_bits(a.exp_avg_sq(), b.exp_avg_sq())) << "parameter " << k;
    EXPECT_EQ(a.step(), b.step()) << "parameter " << k;
  }
}

TEST(FusedAdam, LeavesToLibtorchWhatItComputesOtherwise) {
  Tensor p = ::torch::ones({40});
  const auto after_one_step = [&](optim::Optimizer& opt) -> optim::Optimizer& {
    p.mutable_grad() = ::torch::full({40}, 0.5);
    opt.step();
    return opt;
  };
  optim::Adam decaying({p}, optim::AdamOptions(1e-3).weight_decay(0.1));
  EXPECT_FALSE(fused_adam_applies(after_one_step(decaying))) << "weight decay";
  optim::Adam amsgrad({p}, optim::AdamOptions(1e-3).amsgrad(true));
  EXPECT_FALSE(fused_adam_applies(after_one_step(amsgrad))) << "amsgrad";
  optim::AdamW adamw({p}, optim::AdamWOptions(1e-3));
  EXPECT_FALSE(fused_adam_applies(after_one_step(adamw))) << "AdamW";
  optim::SGD sgd({p}, optim::SGDOptions(1e-3).momentum(0.9));
  EXPECT_FALSE(fused_adam_applies(after_one_step(sgd))) << "SGD";
  Tensor d = ::torch::ones({40}, ::torch::kDouble);
  optim::Adam doubles({d}, optim::AdamOptions(1e-3));
  d.mutable_grad() = ::torch::full({40}, 0.5, ::torch::kDouble);
  doubles.step();
  EXPECT_FALSE(fused_adam_applies(doubles)) << "double parameters";
  optim::Adam plain({p}, optim::AdamOptions(1e-3));
  EXPECT_FALSE(fused_adam_applies(plain)) << "no state yet";
  EXPECT_TRUE(fused_adam_applies(after_one_step(plain)) || !fused_adam_matches());
}

TEST(FusedAdam, IsTakenOnDebiansLibtorch) {
  if (TORCH_VERSION_MAJOR != 1)
    GTEST_SKIP() << "libtorch " << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR
                 << ": its Adam's square root rounds otherwise (2.x), so the copy keeps libtorch's step";
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) GTEST_SKIP() << "no AVX2 and FMA here";
#else
  GTEST_SKIP() << "the fused step is written for x86-64";
#endif
  EXPECT_TRUE(fused_adam_matches());
}

}  // namespace
}  // namespace lockstep::torch::detail
