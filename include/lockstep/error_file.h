// The error file of torchrun's error handler: a launcher (torchrun, or
// `lockstep run`) gives each rank a path in TORCHELASTIC_ERROR_FILE, and a
// rank that fails writes why there, so the launcher's failure report quotes
// the error itself rather than only an exit code. Python programs write it
// with torch.distributed.elastic's @record; a C++ program calls
// record_error() where it catches what ends it:
//
//   } catch (const std::exception& e) {
//     lockstep::record_error(e);
//     std::fprintf(stderr, "train: %s\n", e.what());
//     return 1;
//   }
//
// The format is torchrun's ({"message": {"message": "...", "extraInfo":
// {"timestamp": "..."}}}), so torchrun reads what lockstep writes and the
// other way round. Thread-safe.
#pragma once

#include <exception>
#include <optional>
#include <string>

namespace lockstep {

// Writes `e` (its type where lockstep knows it, and its message) to the
// file TORCHELASTIC_ERROR_FILE names, atomically; does nothing when the
// variable is unset. Never throws: it runs on the way out of a failure
// (TORCHELASTIC_ERROR_FILE is read here, not through Config, because a bad
// environment may be the failure being recorded).
void record_error(const std::exception& e) noexcept;

// The message an error file holds, as written by record_error() or by
// PyTorch's @record ("RuntimeError: ..."); nullopt when the file is missing
// or holds no message.
std::optional<std::string> read_error_file(const std::string& path);

}  // namespace lockstep
