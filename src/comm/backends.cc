// The table of backend_registry.h: every backend folder's entry points, and
// the hooks of the runtimes they bring. Adding a backend is a line here and
// its folder; nothing else in comm names it.
#include <iterator>

#include <fmt/format.h>

#include "comm/backend_registry.h"
#include "comm/mpi/bootstrap.h"
#include "comm/mpi/job_end.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

// In the order `unknown backend` errors list them.
constexpr BackendRegistration kBackends[] = {
    {"tcp", make_tcp_backend},
    {"shm", make_shm_backend},
    {"hier", make_hier_backend},
    {"mpi", make_mpi_backend, LaunchSource::open_mpi, bootstrap_store_with_mpi, mpi::note_failed_group,
     mpi::job_ends_with_abort},
    {"nccl", make_nccl_backend},
};

}  // namespace

std::span<const BackendRegistration> registered_backends() { return kBackends; }

const BackendRegistration& registered_backend(std::string_view name) {
  for (const auto& backend : kBackends)
    if (backend.name == name) return backend;
  std::string names = "auto";
  for (std::size_t i = 0; i < std::size(kBackends); ++i)
    names += fmt::format("{}{}", i + 1 == std::size(kBackends) ? " or " : ", ", kBackends[i].name);
  throw ConfigError(fmt::format("unknown backend '{}'; choose {}", name, names));
}

const BackendRegistration* store_bootstrap_for(LaunchSource source) {
  for (const auto& backend : kBackends)
    if (backend.bootstrap_store != nullptr && backend.launched_by == source) return &backend;
  return nullptr;
}

void note_group_failed(std::exception_ptr error) {
  for (const auto& backend : kBackends)
    if (backend.on_group_failed != nullptr) backend.on_group_failed(error);
}

bool job_ends_at_exit() {
  for (const auto& backend : kBackends)
    if (backend.job_ends_at_exit != nullptr && backend.job_ends_at_exit()) return true;
  return false;
}

}  // namespace lockstep
