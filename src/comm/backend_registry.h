// The backends a group can be formed with, by name, and the process-wide
// hooks a backend's own runtime brings to a job (MPI's: a store formed
// through mpirun, and ending the job with MPI_Abort after a failure).
// comm's core (init.cc) looks backends up here and calls the hooks of
// every registered backend, so it includes no backend folder's header;
// the table itself is in backends.cc, the one file that names each
// folder's entry points.
//
// A constant table; thread-safe.
#pragma once

#include <exception>
#include <memory>
#include <span>
#include <string_view>

#include "comm/backend.h"
#include "comm/launch_env.h"
#include "lockstep/store.h"

namespace lockstep {

// A rendezvous store formed by a launcher's runtime (mpirun) rather than
// from MASTER_ADDR/MASTER_PORT.
struct BootstrappedStore {
  std::unique_ptr<TcpStoreServer> server;  // the rank that hosts it: keep it alive while the job runs
  std::shared_ptr<TcpStore> client;
};

struct BackendRegistration {
  std::string_view name;
  std::unique_ptr<Backend> (*make)(const BackendContext& ctx) = nullptr;

  // The hooks below are optional (null: none).
  // The launcher whose runtime this backend brings (mpirun for mpi): a job
  // that launcher started without MASTER_ADDR/MASTER_PORT forms its store
  // through bootstrap_store, whichever backend its groups then use.
  LaunchSource launched_by = LaunchSource::none;
  BootstrappedStore (*bootstrap_store)(const LaunchInfo& launch, TcpStoreOptions options) = nullptr;
  // Told of every failed group of this process (mpi: so that the job ends
  // with MPI_Abort when the process exits).
  void (*on_group_failed)(std::exception_ptr error) = nullptr;
  // Whether this process will end the whole job at exit anyway.
  bool (*job_ends_at_exit)() = nullptr;
};

std::span<const BackendRegistration> registered_backends();

// The backend called `name`; ConfigError naming the ones there are otherwise.
const BackendRegistration& registered_backend(std::string_view name);

// The registration that forms the store of a job `source` started without
// MASTER_ADDR/MASTER_PORT; null when none does.
const BackendRegistration* store_bootstrap_for(LaunchSource source);

// The process-wide hooks, over every registered backend.
void note_group_failed(std::exception_ptr error);
bool job_ends_at_exit();

}  // namespace lockstep
