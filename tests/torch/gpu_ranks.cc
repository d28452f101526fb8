// See gpu_ranks.h.
#include "torch/gpu_ranks.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <stdexcept>

#include "harness/process_ranks.h"
#include "harness/reserved_port.h"
#include "lockstep/error.h"
#include "lockstep/process_group.h"

namespace lockstep::testing {

void exact_fp32() {
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
}

namespace {

// Forks `n` processes with env_for(rank) that each run body(rank) once
// libtorch sees a CUDA device (else rank 0 notes that in `dir` and all
// return); false (with `why`) when it saw none.
bool run_processes_on_gpu(int n, const std::function<EnvMap(int rank)>& env_for,
                          const std::function<void(int rank)>& body, const std::string& dir, std::string* why,
                          std::chrono::seconds deadline) {
  const std::string no_gpu = dir + "/no-gpu";
  {
    ProcessRanks ranks(n, env_for, [&](int rank) {
      if (!::torch::cuda::is_available()) {
        if (rank == 0) std::ofstream(no_gpu) << "libtorch sees no CUDA device (or has no CUDA)";
        return;
      }
      at::set_num_threads(1);
      exact_fp32();
      body(rank);
    });
    for (const auto& r : ranks.wait_all(deadline)) EXPECT_EQ(r.exit_code, kExitOk) << describe(r);
  }
  std::ifstream reason(no_gpu);
  return !(reason && std::getline(reason, *why));
}

}  // namespace

bool run_on_gpu(int n, const std::string& backend, const std::string& dir,
                const std::function<void(int rank, ProcessGroup& pg)>& body, std::string* why,
                std::chrono::seconds deadline) {
  const ReservedPort reserved_port;
  const int port = reserved_port.number();
  return run_processes_on_gpu(
      n,
      [&](int rank) {
        return EnvMap{{"RANK", std::to_string(rank)},   {"WORLD_SIZE", std::to_string(n)},
                      {"MASTER_ADDR", "127.0.0.1"},     {"MASTER_PORT", std::to_string(port)},
                      {"LOCKSTEP_BACKEND", backend},    {"LOCKSTEP_TIMEOUT", "60"},
                      {"LOCKSTEP_CONNECT_TIMEOUT", "60"}};
      },
      [&](int rank) {
        auto pg = init_process_group();
        body(rank, *pg);
      },
      dir, why, deadline);
}

bool run_in_gpu_process(const std::string& dir, const std::function<void()>& body, std::string* why) {
  return run_processes_on_gpu(
      1, [](int) { return EnvMap{}; }, [&](int) { body(); }, dir, why, std::chrono::seconds(120));
}

void expect_invalid_argument(const std::function<void()>& action, const std::vector<std::string>& phrases) {
  try {
    action();
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    for (const auto& phrase : phrases)
      if (what.find(phrase) == std::string::npos)
        throw std::runtime_error("the refusal does not say '" + phrase + "': " + what);
    return;
  }
  throw std::runtime_error("no InvalidArgument");
}

}  // namespace lockstep::testing
