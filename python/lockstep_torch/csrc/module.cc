// The Python module lockstep_torch._C: the factory torch.distributed calls
// (through Backend.register_backend, extended API) to form a "lockstep"
// backend for a process group.
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include <map>
#include <string>

#include "backend.h"
#include "lockstep/config.h"
#include "cuda_support.h"

namespace {

c10::intrusive_ptr<c10d::Backend> create_backend(const c10d::DistributedBackendOptions& options,
                                                 const py::object& /*backend_options*/) {
  py::gil_scoped_release no_gil;  // the rendezvous waits on other ranks
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(options.timeout);
  return c10::make_intrusive<lockstep_torch::LockstepBackend>(options.store, options.group_rank,
                                                              options.group_size, timeout, options.group_id);
}

// torch.distributed's env:// rendezvous reads RANK, WORLD_SIZE,
// MASTER_ADDR and MASTER_PORT, which srun does not set: the values lockstep
// reads from Slurm's variables instead (its rank, world and local placement,
// the store on the step's first node at a port from the job id), for those
// the environment lacks. Empty when Slurm did not start this process.
std::map<std::string, std::string> slurm_environment() {
  const lockstep::Config config = lockstep::Config::from_environment();
  if (config.launcher.source != lockstep::LaunchSource::slurm) return {};
  const auto& p = config.launcher;
  std::map<std::string, std::string> vars = {{"RANK", std::to_string(p.rank)},
                                             {"WORLD_SIZE", std::to_string(p.world_size)},
                                             {"LOCAL_RANK", std::to_string(p.local_rank)},
                                             {"LOCAL_WORLD_SIZE", std::to_string(p.local_world_size)}};
  if (!config.master_addr.empty()) vars["MASTER_ADDR"] = config.master_addr;
  if (config.master_port) vars["MASTER_PORT"] = std::to_string(*config.master_port);
  return vars;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "lockstep's collectives as the torch.distributed backend \"lockstep\"";
  py::class_<lockstep_torch::LockstepBackend, c10d::Backend, c10::intrusive_ptr<lockstep_torch::LockstepBackend>>(
      m, "LockstepBackend")
      .def_property_readonly("transport", &lockstep_torch::LockstepBackend::transport,
                             "the lockstep backend underneath: shm, tcp or hier");
  m.def("_create_backend", &create_backend, py::arg("options"), py::arg("backend_options"));
  m.def("_slurm_environment", &slurm_environment,
        "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT from Slurm's variables");
  m.attr("with_cuda") = lockstep_torch::kWithCuda;
  m.def("_without_cuda_message", &lockstep_torch::without_cuda_message, py::arg("device"),
        "what the CPU build says of a tensor on `device`");
}
