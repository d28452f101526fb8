// Single-copy reads from a peer's private memory (Linux cross-memory
// attach, process_vm_readv), so the block collectives can copy a peer's
// input straight into this rank's output instead of through a shared slot
// (two copies). Needs the right to trace the peer (same user, a dumpable
// peer and Yama's ptrace_scope 0, or CAP_SYS_PTRACE), a shared pid
// namespace, and no seccomp filter refusing the call (docs/algorithms.md);
// the shm backend probes it once at set-up and falls back to the slots
// when any rank cannot, saying why once.
// Stateless; thread-safe.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

namespace lockstep::shm {

// Copies `bytes` from `remote` in process `pid` to `local`. Returns "" or
// why it failed (cross_memory_refusal).
std::string read_peer(pid_t pid, void* local, const void* remote, std::size_t bytes);

// Copies `bytes` from `local` to `remote` in process `pid` (process_vm_writev).
std::string write_peer(pid_t pid, void* remote, const void* local, std::size_t bytes);

// Why the kernel refused cross-memory attach with `err`, with the likely
// cause on this system (Yama's ptrace_scope, a seccomp filter, another pid
// namespace) and what allows it.
std::string cross_memory_refusal(int err, pid_t pid);

}  // namespace lockstep::shm
