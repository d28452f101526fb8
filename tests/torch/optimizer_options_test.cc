// optimizer_options.h: every field of every group of libtorch's
// optimizers' options arrives as it was sent (each field set away from its
// default, and differently in each group), an optimizer libtorch ships but
// whose options go as an archive (LBFGS) too, and bytes of another type or
// group count are refused before anything changes.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "lockstep/error.h"
#include "torch/optimizer_options.h"

using namespace lockstep;
using namespace lockstep::torch;
namespace optim = ::torch::optim;

namespace {

std::vector<optim::OptimizerParamGroup> two_groups(const optim::OptimizerOptions& first,
                                                   const optim::OptimizerOptions& second) {
  std::vector<optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<::torch::Tensor>{::torch::zeros({3}, ::torch::requires_grad())}, first.clone());
  groups.emplace_back(std::vector<::torch::Tensor>{::torch::zeros({2}, ::torch::requires_grad())}, second.clone());
  return groups;
}

// `sent`'s options loaded into an optimizer of its type with the
// defaults: each group's options equal the sender's.
template <typename Optimizer, typename Options>
void check_round_trip(const Options& first, const Options& second, const Options& defaults) {
  Optimizer sent(two_groups(first, second), defaults);
  Optimizer received(two_groups(defaults, defaults), defaults);
  load_options(received, options_bytes(sent));
  for (std::size_t g = 0; g < 2; ++g)
    EXPECT_TRUE(static_cast<const Options&>(received.param_groups()[g].options()) ==
                static_cast<const Options&>(sent.param_groups()[g].options()))
        << "group " << g;
}

}  // namespace

TEST(OptimizerOptions, SGD) {
  check_round_trip<optim::SGD>(optim::SGDOptions(0.1).momentum(0.9).dampening(0.1).weight_decay(1e-4).nesterov(false),
                               optim::SGDOptions(0.0125).momentum(0.5).weight_decay(3e-5).nesterov(true),
                               optim::SGDOptions(1));
}

TEST(OptimizerOptions, Adam) {
  const auto first = optim::AdamOptions(0.003).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.01).amsgrad(true);
  const auto second = optim::AdamOptions(1.0 / 3).betas({0.7, 0.9}).eps(1e-7).weight_decay(0.02);
  check_round_trip<optim::Adam>(first, second, optim::AdamOptions());
}

TEST(OptimizerOptions, AdamW) {
  const auto first = optim::AdamWOptions(0.003).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.1).amsgrad(true);
  const auto second = optim::AdamWOptions(1e-5).betas({0.85, 0.98}).eps(1e-9).weight_decay(0.0);
  check_round_trip<optim::AdamW>(first, second, optim::AdamWOptions());
}

TEST(OptimizerOptions, Adagrad) {
  const auto first =
      optim::AdagradOptions(0.1).lr_decay(0.01).weight_decay(0.001).initial_accumulator_value(0.5).eps(1e-8);
  const auto second = optim::AdagradOptions(0.2).lr_decay(0.02).initial_accumulator_value(0.25).eps(1e-6);
  check_round_trip<optim::Adagrad>(first, second, optim::AdagradOptions());
}

TEST(OptimizerOptions, RMSprop) {
  const auto first = optim::RMSpropOptions(0.01).alpha(0.9).eps(1e-6).weight_decay(0.01).momentum(0.5).centered(true);
  const auto second = optim::RMSpropOptions(0.02).alpha(0.95).eps(1e-7).momentum(0.25);
  check_round_trip<optim::RMSprop>(first, second, optim::RMSpropOptions());
}

// LBFGS takes one group only (and sets max_eval from max_iter).
TEST(OptimizerOptions, AnOptimizerWithoutNumbersGoesAsAnArchive) {
  const auto params = [] { return std::vector<::torch::Tensor>{::torch::zeros({3}, ::torch::requires_grad())}; };
  const auto options = optim::LBFGSOptions(0.5).max_iter(7).history_size(11).line_search_fn("strong_wolfe");
  optim::LBFGS sent(params(), options);
  optim::LBFGS received(params(), optim::LBFGSOptions());
  load_options(received, options_bytes(sent));
  EXPECT_TRUE(static_cast<const optim::LBFGSOptions&>(received.param_groups()[0].options()) ==
              static_cast<const optim::LBFGSOptions&>(sent.param_groups()[0].options()));
}

TEST(OptimizerOptions, RefusesAnotherTypeOrGroupCountBeforeChangingAnything) {
  optim::SGD sgd(two_groups(optim::SGDOptions(0.5), optim::SGDOptions(0.25)), optim::SGDOptions(1));
  optim::Adam adam(two_groups(optim::AdamOptions(0.5), optim::AdamOptions(0.25)), optim::AdamOptions());
  EXPECT_THROW(load_options(adam, options_bytes(sgd)), InvalidArgument);
  optim::SGD one_group(std::vector<::torch::Tensor>{::torch::zeros({3}, ::torch::requires_grad())},
                       optim::SGDOptions(0.125));
  EXPECT_THROW(load_options(one_group, options_bytes(sgd)), InvalidArgument);
  EXPECT_EQ(one_group.param_groups()[0].options().get_lr(), 0.125);
  EXPECT_EQ(adam.param_groups()[0].options().get_lr(), 0.5);
  EXPECT_THROW(load_options(sgd, std::string("\x01", 1)), InvalidArgument);
}
