// What `lockstep --version` (-V) prints, as `mpirun --version` does: this
// lockstep's version, the libtorch its build found, the backends built in
// and whether collectives take CUDA memory. Thread-safe (no state).
#pragma once

#include <string>

namespace lockstep::cli {

// One "what: value" line for each, after "lockstep <version>"; no newline
// at the end (CLI11 adds one).
std::string version_text();

}  // namespace lockstep::cli
