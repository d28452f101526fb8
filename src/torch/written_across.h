// A large host buffer from a root to a receiver on the same machine,
// written by the root straight into the receiver's memory (cross-memory
// attach, process_vm_writev) instead of through the transport. What it
// buys: a replacement receives its optimizer state into tensors it has
// just made, whose pages fault in one at a time as they are first
// written; written across, those faults are taken on the root's core
// while the receiver makes the buffer's second half present on its own,
// so two cores share what one took (docs/performance.md, "Feeding a
// replacement: the holder writes"). Used by Receivers::issue.
//
// The root writes only into the process that asked: the request carries a
// random word from the receiver's memory, which the root reads back from
// that process first. Where the receiver is on another machine, in another
// pid namespace, or the system refuses cross-memory attach (a seccomp
// filter, a ptrace policy), the root says so and the bytes go by the
// transport, as they did before.
#pragma once

#include <memory>
#include <vector>

#include "lockstep/process_group.h"

namespace lockstep::torch {

// Whether `b` goes written across: host memory of at least 2 MiB (below
// that the request's round trip costs more than the faults it moves).
bool goes_written_across(const Buffer& b);

// The receiver's side: asks the root to write `b`, makes its second half
// present meanwhile, and waits for the root's answer; where the root could
// not write, the transport's receive of `b` is appended to `transfers`.
// On an error, what `transfers` holds is waited for before it is thrown.
void receive_written_across(ProcessGroup& group, Buffer b, int root, int tag,
                            std::vector<std::shared_ptr<Work>>& transfers);

// The root's side, for one receiver: writes `b` where it asked, or, where
// that is refused, appends the transport's send of `b` to `transfers`.
void write_across(ProcessGroup& group, Buffer b, int receiver, int tag, std::vector<std::shared_ptr<Work>>& transfers);

}  // namespace lockstep::torch
