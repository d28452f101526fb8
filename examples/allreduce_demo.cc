// The smallest complete lockstep program: every rank contributes a vector,
// an asynchronous all-reduce averages them, and each rank checks the result
// and reports the bandwidth it saw. Run it with:
//   build/lockstep run --nproc-per-node 2 -- build/examples/allreduce_demo
#include <lockstep/error.h>
#include <lockstep/error_file.h>
#include <lockstep/process_group.h>

#include <chrono>
#include <cstdio>
#include <vector>

namespace {

int demo() {
  auto pg = lockstep::init_process_group();
  const int rank = pg->rank(), size = pg->size();
  // 16 MiB of floats; rank r contributes r + 1 everywhere.
  std::vector<float> data(4u << 20, static_cast<float>(rank + 1));
  const float expected = static_cast<float>(size + 1) / 2.0f;  // mean of 1..size

  constexpr int kIters = 10;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kIters; ++i) {
    std::fill(data.begin(), data.end(), static_cast<float>(rank + 1));
    auto work = pg->allreduce(lockstep::view(std::span(data)), lockstep::ReduceOp::avg);
    work->wait();  // the collective ran on the group's progress thread meanwhile
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::size_t wrong = 0;
  for (float v : data) wrong += v != expected;
  const double gbps = kIters * static_cast<double>(data.size() * sizeof(float)) / seconds / 1e9;
  std::printf("rank %d/%d (%s backend): averaged %zu floats %d times, every element %.2f (expected %.2f), %zu wrong, "
              "%.2f GB/s algorithm bandwidth\n",
              rank, size, pg->backend().c_str(), data.size(), kIters, data[0], expected, wrong, gbps);
  return wrong == 0 ? 0 : 1;
}

}  // namespace

int main() {
  try {
    return demo();
  } catch (const lockstep::Error& e) {
    // A bad launcher environment, a dead peer, a timeout: the message says
    // what happened and what to do, so print it rather than abort.
    lockstep::record_error(e);  // TORCHELASTIC_ERROR_FILE, for the launcher's report
    std::fprintf(stderr, "allreduce_demo: %s\n", e.what());
    return 2;
  }
}
