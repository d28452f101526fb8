// `lockstep bench --busy N`: N processes that spin beside the ranks for as
// long as the benchmark runs, so that collectives can be measured while the
// cores are shared (as with data-loader workers, or other jobs on the
// node), reproducibly and the same for every peer compared.
//
// The processes are forked children, unpinned (the scheduler shares the
// cores between them and the ranks), killed and reaped when the BusyLoad
// goes, and killed by the kernel should this process die first.
// Not thread-safe; one owner.
#pragma once

#include <sys/types.h>

#include <vector>

namespace lockstep::cli {

class BusyLoad {
 public:
  explicit BusyLoad(int processes);
  ~BusyLoad();
  BusyLoad(const BusyLoad&) = delete;
  BusyLoad& operator=(const BusyLoad&) = delete;

  int size() const { return static_cast<int>(children_.size()); }

 private:
  void stop();  // kills and reaps them

  std::vector<pid_t> children_;
};

}  // namespace lockstep::cli
