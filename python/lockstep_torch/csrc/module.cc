// The Python module lockstep_torch._C: the factory torch.distributed calls
// (through Backend.register_backend, extended API) to form a "lockstep"
// backend for a process group.
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "backend.h"
#include "cuda_support.h"

namespace {

c10::intrusive_ptr<c10d::Backend> create_backend(const c10d::DistributedBackendOptions& options,
                                                 const py::object& /*backend_options*/) {
  py::gil_scoped_release no_gil;  // the rendezvous waits on other ranks
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(options.timeout);
  return c10::make_intrusive<lockstep_torch::LockstepBackend>(options.store, options.group_rank,
                                                              options.group_size, timeout, options.group_id);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "lockstep's collectives as the torch.distributed backend \"lockstep\"";
  py::class_<lockstep_torch::LockstepBackend, c10d::Backend, c10::intrusive_ptr<lockstep_torch::LockstepBackend>>(
      m, "LockstepBackend")
      .def_property_readonly("transport", &lockstep_torch::LockstepBackend::transport,
                             "the lockstep backend underneath: shm, tcp or hier");
  m.def("_create_backend", &create_backend, py::arg("options"), py::arg("backend_options"));
  m.attr("with_cuda") = lockstep_torch::kWithCuda;
  m.def("_without_cuda_message", &lockstep_torch::without_cuda_message, py::arg("device"),
        "what the CPU build says of a tensor on `device`");
}
