// See gpu_ranks.h.
#include "torch/gpu_ranks.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "harness/process_ranks.h"
#include "harness/reserved_port.h"
#include "lockstep/process_group.h"

namespace lockstep::testing {

void exact_fp32() {
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
}

bool run_on_gpu(int n, const std::string& backend, const std::string& dir,
                const std::function<void(int rank, ProcessGroup& pg)>& body, std::string* why,
                std::chrono::seconds deadline) {
  const ReservedPort reserved_port;
  const int port = reserved_port.number();
  const std::string no_gpu = dir + "/no-gpu";
  {
    ProcessRanks ranks(
        n,
        [&](int rank) {
          return EnvMap{{"RANK", std::to_string(rank)},   {"WORLD_SIZE", std::to_string(n)},
                        {"MASTER_ADDR", "127.0.0.1"},     {"MASTER_PORT", std::to_string(port)},
                        {"LOCKSTEP_BACKEND", backend},    {"LOCKSTEP_TIMEOUT", "60"},
                        {"LOCKSTEP_CONNECT_TIMEOUT", "60"}};
        },
        [&](int rank) {
          if (!::torch::cuda::is_available()) {
            if (rank == 0) std::ofstream(no_gpu) << "libtorch sees no CUDA device (or has no CUDA)";
            return;
          }
          at::set_num_threads(1);
          exact_fp32();
          auto pg = init_process_group();
          body(rank, *pg);
        });
    for (const auto& r : ranks.wait_all(deadline)) EXPECT_EQ(r.exit_code, kExitOk) << describe(r);
  }
  std::ifstream reason(no_gpu);
  return !(reason && std::getline(reason, *why));
}

}  // namespace lockstep::testing
