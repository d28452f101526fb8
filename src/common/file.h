// Files that readers never see half-written: diagnostics are written while
// ranks are failing and may be killed at any moment, and other tools (the
// launcher's trace merge, `lockstep doctor`) read them afterwards.
#pragma once

#include <string>

namespace lockstep {

// Writes `contents` to a temporary file beside `path`, then renames it over
// `path`: a reader finds the old file, the new one, or none, never a part.
// Throws Error naming the path and the cause.
void write_file_atomically(const std::string& path, const std::string& contents);

}  // namespace lockstep
