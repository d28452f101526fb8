// Routing an operation by where its memory is (group_impl.h): host memory
// goes to the group's backend; CUDA memory to the backend itself when it
// moves CUDA memory (nccl), else through staging over it. Thread-safety: as
// ProcessGroup; the group's DeviceRuntime is made once, under device_mutex.
#include <fmt/format.h>

#include "comm/group_impl.h"

namespace lockstep {
namespace {

// The group's DeviceRuntime and the backend for CUDA memory, made at the
// first call that needs them.
Backend& device_backend(ProcessGroup::Impl& s) {
  std::lock_guard lock(s.device_mutex);
  if (!s.device_runtime) s.device_runtime = make_device_runtime(s.spec.config, s.log);
  if (s.backend->handles_device_memory()) return *s.backend;
  if (!s.staged_backend) s.staged_backend = s.device_runtime->staged_over(*s.backend, s.spec.rank);
  return *s.staged_backend;
}

}  // namespace

Route route(ProcessGroup::Impl& s, const char* what, std::initializer_list<NamedBuffer> buffers) {
  const NamedBuffer* first = nullptr;
  for (const NamedBuffer& b : buffers) {
    if (b.buffer.count == 0) continue;
    if (first == nullptr) {
      first = &b;
      continue;
    }
    if (b.buffer.device != first->buffer.device)
      throw InvalidArgument(fmt::format("{}: the {} is on {} but the {} on {}; pass buffers on one device (copy one "
                                        "of them first)",
                                        what, first->name, to_string(first->buffer.device), b.name,
                                        to_string(b.buffer.device)));
    if (b.buffer.device.is_cuda() && b.buffer.stream != first->buffer.stream)
      throw InvalidArgument(fmt::format("{}: the {} and the {} name different CUDA streams; pass the stream whose "
                                        "work produces and reads both",
                                        what, first->name, b.name));
  }
  if (first == nullptr || !first->buffer.device.is_cuda()) return Route{s.backend.get(), Device::host(), nullptr};
  Backend& backend = device_backend(s);
  const Device device = first->buffer.device;
  return Route{&backend, device, s.device_runtime->order_after(device, first->buffer.stream)};
}

}  // namespace lockstep
