// Dumping every group's flight recorder when the process gets SIGUSR1
// (`kill -USR1 <pid>` on a rank that seems stuck). Signals belong to the
// whole process, so this is the one process-wide registry in lockstep: the
// handler only writes a byte to a pipe; a thread reads it and dumps the
// groups registered at that moment. The handler is installed only if
// SIGUSR1 still has its default action (which would kill the process), so a
// program's own handler is never replaced. Thread-safe.
#pragma once

namespace lockstep {

class GroupDiagnostics;

void register_for_signal_dumps(GroupDiagnostics* diagnostics);
void unregister_from_signal_dumps(GroupDiagnostics* diagnostics);

}  // namespace lockstep
