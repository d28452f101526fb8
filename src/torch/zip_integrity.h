// Checks a zip archive's stored entries against the CRC-32 its central
// directory records for each. A libtorch checkpoint is such an archive,
// and libtorch's reader does not check these sums: a checkpoint whose
// tensor bytes changed on disk loaded silently and training resumed into
// NaN. load_checkpoint runs this first.
//
// No libtorch here (plain bytes in, a sentence out), so the fuzz build,
// which has no libtorch, fuzzes it. Thread-safe: a pure function.
#pragma once

#include <cstddef>
#include <span>
#include <string>

namespace lockstep::torch {

// "" when every stored entry matches its recorded sum; otherwise one
// clause saying what is wrong ("its entry 'archive/data/0' (4096 bytes)
// does not match its checksum"), for a message that names the file.
// Entries whose recorded sum is 0 (a writer that skipped them) and
// compressed entries (libtorch stores every entry) are not checked.
// Malformed archives are left to libtorch's reader, which names them.
std::string zip_integrity_problem(std::span<const std::byte> archive);

}  // namespace lockstep::torch
