// Files that readers never see half-written: diagnostics are written while
// ranks are failing and may be killed at any moment, and other tools (the
// launcher's trace merge, `lockstep doctor`) read them afterwards; a
// checkpoint must survive a full disk or a crash with the previous one
// intact. Stateless; thread-safe.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "common/os.h"

namespace lockstep {

enum class FileSync {
  none,     // readers see the old file or the new one (enough for diagnostics)
  to_disk,  // also after a power loss: the data and the rename are flushed
};

// Hands bytes to the file, in order; throws Error when they cannot be written.
using ByteWriter = std::function<void(const void* data, std::size_t len)>;

// Writes to a temporary file beside `path` (`<path>.tmp.<pid>`, a name
// readers that scan a directory must skip), then renames it over `path`: a
// reader finds the old file, the new one, or none, never a part. On any
// failure (a full disk, a short write, a failed rename) the temporary is
// removed, `path` is left as it was, and Error names the path and the cause.
// `produce` writes the contents through the sink it is given.
void write_file_atomically(const std::string& path, const std::function<void(const ByteWriter&)>& produce,
                           FileSync sync = FileSync::none, Os& os = Os::real());
void write_file_atomically(const std::string& path, std::string_view contents, FileSync sync = FileSync::none,
                           Os& os = Os::real());

// The whole of `path`'s contents; Error naming the path and the cause when
// it cannot be read.
std::string read_whole_file(const std::string& path);

// The temporary that write_file_atomically uses for `path` in process `pid`.
std::string temporary_path(const std::string& path, long pid);

}  // namespace lockstep
