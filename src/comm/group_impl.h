// ProcessGroup's private state, and the factory that forms a group from a
// store: rendezvous, backend choice, connection. Shared by
// init_process_group and ProcessGroup::new_group.
// Impl is guarded by ProcessGroup's rules (see process_group.h).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "comm/group_diagnostics.h"
#include "comm/progress_engine.h"
#include "lockstep/process_group.h"

namespace lockstep {

// What it takes to form a group; the parts a sub-group inherits.
struct GroupSpec {
  int rank = 0;
  int size = 1;
  bool world = false;  // formed by init_process_group (sub-groups: false)
  std::string backend = "auto";
  std::shared_ptr<Store> root_store;  // not prefixed
  std::string key;                    // store prefix and identity of the group
  Duration timeout{0};
  Duration connect_timeout{0};
  std::string listen_address;  // empty: choose
  std::size_t tcp_small_bytes = 0;
  // Keeps the store server (if this process hosts it) alive while any group
  // uses it.
  std::shared_ptr<void> keepalive;
  // Key every rank increments when its world group ends (empty for sub-groups).
  std::string finished_key;
  Logger log;
  // The timeline, shared by a world group and its sub-groups.
  std::shared_ptr<diag::Tracer> tracer;
  DiagnosticsSettings diagnostics;
};

struct ProcessGroup::Impl {
  GroupSpec spec;
  std::string backend_name;
  std::shared_ptr<Store> store;  // prefixed with spec.key
  std::vector<std::string> host_ids;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<GroupDiagnostics> diagnostics;  // outlives the engine, which points into it
  std::unique_ptr<detail::ProgressEngine> engine;
  std::atomic<std::uint64_t> collectives{0};      // collectives issued (fingerprints number them)
  Logger log;

  std::mutex subgroups_mutex;
  std::map<std::vector<int>, int> subgroups_created;  // per rank list, how many so far
};

std::shared_ptr<ProcessGroup> make_group(GroupSpec spec);

// "auto" -> a concrete backend for these hosts; others are checked and kept.
std::string resolve_backend(const std::string& requested, const std::vector<std::string>& host_ids);
std::unique_ptr<Backend> make_backend(const std::string& name, const BackendContext& ctx);

}  // namespace lockstep
