// ThreadWorld; see thread_world.h.
#include "harness/thread_world.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

namespace lockstep::testing {

std::vector<std::exception_ptr> run_threads(int n, const std::function<void(int rank)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

namespace {

void rethrow_first(const std::vector<std::exception_ptr>& errors) {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("rank {}: {}", r, e.what()));
    }
  }
}

}  // namespace

std::vector<std::string> pretend_hosts(const std::vector<int>& ranks_per_host) {
  std::vector<std::string> hosts;
  for (std::size_t h = 0; h < ranks_per_host.size(); ++h)
    for (int i = 0; i < ranks_per_host[h]; ++i) hosts.push_back(fmt::format("host{}", h));
  return hosts;
}

namespace {

// "hier2" -> hier on pretend hosts of 2 ranks each; see thread_world.h.
void expand_hier_shorthand(int size, std::string& backend, std::vector<std::string>& hosts) {
  if (backend.size() <= 4 || backend.compare(0, 4, "hier") != 0) return;
  const int per_host = std::stoi(backend.substr(4));
  std::vector<int> layout;
  for (int left = size; left > 0; left -= per_host) layout.push_back(std::min(left, per_host));
  hosts = pretend_hosts(layout);
  backend = "hier";
}

}  // namespace

ThreadWorld::ThreadWorld(int size, std::string backend, Duration timeout, GroupOptions extra,
                         std::vector<std::string> hosts)
    : store_(std::make_shared<HashStore>()), groups_(static_cast<std::size_t>(size)) {
  expand_hier_shorthand(size, backend, hosts);
  store_->set_timeout(timeout);
  rethrow_first(run_threads(size, [&](int rank) {
    GroupOptions options = extra;
    options.rank = rank;
    options.world_size = size;
    options.store = store_;
    options.backend = backend;
    options.timeout = timeout;
    options.connect_timeout = timeout;
    if (!hosts.empty()) {
      options.host_id = hosts.at(static_cast<std::size_t>(rank));
      options.listen_address = "127.0.0.1";  // the pretend hosts are this machine
    }
    groups_[static_cast<std::size_t>(rank)] = init_process_group(options);
  }));
}

ThreadWorld::~ThreadWorld() {
  // Groups say goodbye to each other when destroyed, so destroy them together.
  run_threads(size(), [&](int rank) { groups_[static_cast<std::size_t>(rank)].reset(); });
}

void ThreadWorld::run(const std::function<void(int, ProcessGroup&)>& fn) { rethrow_first(run_collecting(fn)); }

// A rank whose body fails (an exception, an ASSERT) aborts its group, and
// through it every rank's, so the others fail within a second instead of
// waiting out the timeout in a collective it will never issue.
std::vector<std::exception_ptr> ThreadWorld::run_collecting(const std::function<void(int, ProcessGroup&)>& fn) {
  return run_threads(size(), [&](int rank) {
    ProcessGroup& pg = group(rank);
    try {
      fn(rank, pg);
    } catch (const std::exception& e) {
      pg.abort(fmt::format("rank {}'s test body threw: {}", rank, e.what()));
      throw;
    }
    if (::testing::Test::HasFatalFailure()) pg.abort(fmt::format("a fatal test assertion failed (seen on rank {})", rank));
  });
}

}  // namespace lockstep::testing
