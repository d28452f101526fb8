// TorchThreadWorld; see thread_ranks.h.
#include "torch/thread_ranks.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <mutex>
#include <stdexcept>

namespace lockstep::testing {
namespace {

// The whole state of the default CPU generator (its Mersenne Twister and
// the cached normal): any draw or reseed changes it.
::torch::Tensor default_generator_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

}  // namespace

void expect_generator_untouched(const std::string& what, const std::function<void()>& body) {
  const auto before = default_generator_state();
  body();
  if (!::torch::equal(before, default_generator_state()))
    throw std::logic_error(what + " drew from or reseeded libtorch's process-wide CPU generator, which thread "
                                  "ranks share (what each draws then depends on how the threads interleave): "
                                  "build models and data before the ranks run and hand them in, or give each "
                                  "rank an at::Generator of its own");
}

TorchThreadWorld::TorchThreadWorld(int size, std::string backend, Duration timeout, GroupOptions extra,
                                   std::vector<std::string> hosts)
    : world_(size, std::move(backend), timeout, std::move(extra), std::move(hosts)) {}

void TorchThreadWorld::run(const std::function<void(int rank, ProcessGroup& pg)>& fn) {
  expect_generator_untouched("a thread rank", [&] { world_.run(fn); });
}

std::vector<std::exception_ptr> TorchThreadWorld::run_collecting(
    const std::function<void(int rank, ProcessGroup& pg)>& fn) {
  std::vector<std::exception_ptr> errors;
  expect_generator_untouched("a thread rank", [&] { errors = world_.run_collecting(fn); });
  return errors;
}

}  // namespace lockstep::testing
