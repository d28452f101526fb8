// Test harness: the ranks of a world as threads of this process, each with
// its own ProcessGroup over one shared HashStore. Groups are formed once and
// reused for many cases: run() calls a function on every rank concurrently
// and rethrows the first failure, prefixed with its rank.
//
// Nothing hangs: every group has a short collective timeout, so a stuck
// collective fails with TimeoutError instead of blocking the test.
// Thread-safety: drive a ThreadWorld from one test thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/process_group.h"

namespace lockstep::testing {

class ThreadWorld {
 public:
  // `backend` "hierK" (hier2, hier3): the hier backend with the ranks placed
  // on pretend hosts of K consecutive ranks each (the last may have fewer).
  // `hosts`, when given, names each rank's pretend host (GroupOptions::
  // host_id; one per rank): the ranks still share this machine, but hier
  // and auto see several hosts.
  explicit ThreadWorld(int size, std::string backend = "tcp", Duration timeout = std::chrono::seconds(60),
                       GroupOptions extra = {}, std::vector<std::string> hosts = {});
  ~ThreadWorld();

  int size() const { return static_cast<int>(groups_.size()); }
  ProcessGroup& group(int rank) { return *groups_[static_cast<std::size_t>(rank)]; }
  const std::shared_ptr<Store>& store() const { return store_; }

  // Runs fn(rank, group) on every rank at once; rethrows the first exception.
  void run(const std::function<void(int rank, ProcessGroup& pg)>& fn);

  // Like run(), but returns each rank's exception (null on success).
  std::vector<std::exception_ptr> run_collecting(const std::function<void(int rank, ProcessGroup& pg)>& fn);

 private:
  std::shared_ptr<Store> store_;
  std::vector<std::shared_ptr<ProcessGroup>> groups_;
};

// Pretend host names for ranks placed host by host: {2, 2} -> host0, host0,
// host1, host1.
std::vector<std::string> pretend_hosts(const std::vector<int>& ranks_per_host);

// Calls fn(rank) on `n` threads at once; returns each thread's exception.
std::vector<std::exception_ptr> run_threads(int n, const std::function<void(int rank)>& fn);

}  // namespace lockstep::testing
