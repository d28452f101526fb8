// Single-copy reads from a peer's private memory (Linux cross-memory
// attach, process_vm_readv), so the block collectives can copy a peer's
// input straight into this rank's output instead of through a shared slot
// (two copies). Needs the right to trace the peer (same user and Yama's
// ptrace_scope 0, or CAP_SYS_PTRACE) and a shared pid namespace; the shm
// backend probes it once at set-up and falls back to the slots when any
// rank cannot.
// Stateless; thread-safe.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

namespace lockstep::shm {

// Copies `bytes` from `remote` in process `pid` to `local`. Returns "" or
// why it failed (errno's text).
std::string read_peer(pid_t pid, void* local, const void* remote, std::size_t bytes);

}  // namespace lockstep::shm
