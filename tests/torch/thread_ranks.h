// Thread ranks for the libtorch tests: a ThreadWorld whose run() fails when
// a rank drew from, or reseeded, libtorch's one process-wide CPU generator.
// Thread ranks share that generator, so what each draws depends on how the
// threads interleave: a model built with ::torch::manual_seed inside a rank
// gets other weights from run to run, and a test comparing it with a
// reference silently compares something else (the companions' CPU twin did,
// and a GPU run had to find it). Build models and data before run() and
// hand them in, or draw from a generator of the rank's own.
// Thread-safety: drive a TorchThreadWorld from one test thread.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "harness/thread_world.h"

namespace lockstep::testing {

class TorchThreadWorld {
 public:
  explicit TorchThreadWorld(int size, std::string backend = "tcp", Duration timeout = std::chrono::seconds(60),
                            GroupOptions extra = {}, std::vector<std::string> hosts = {});

  int size() const { return world_.size(); }
  ProcessGroup& group(int rank) { return world_.group(rank); }

  // Runs fn(rank, group) on every rank at once; rethrows the first
  // exception, and throws if a rank touched the process-wide generator.
  void run(const std::function<void(int rank, ProcessGroup& pg)>& fn);

  // Like run(), but returns each rank's exception (null on success); the
  // generator check still throws.
  std::vector<std::exception_ptr> run_collecting(const std::function<void(int rank, ProcessGroup& pg)>& fn);

 private:
  ThreadWorld world_;
};

// make(rank) for every rank, on the calling thread: what each thread rank
// is handed (its model, its data), made before the ranks run.
template <class Make>
auto per_rank(int n, Make make) {
  std::vector<decltype(make(0))> out;
  for (int rank = 0; rank < n; ++rank) out.push_back(make(rank));
  return out;
}

// Calls `body` and throws std::logic_error, naming `what`, if libtorch's
// default CPU generator is in another state afterwards. For thread ranks
// that are not a TorchThreadWorld (run_threads).
void expect_generator_untouched(const std::string& what, const std::function<void()>& body);

}  // namespace lockstep::testing
