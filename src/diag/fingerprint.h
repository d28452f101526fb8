// Collective fingerprints for LOCKSTEP_DEBUG=DETAIL: before each collective
// every rank shares (op, dtype, count, root, reduction, its collective
// number) and all compare, so a rank that issued something else is named at
// once instead of corrupting data or hanging. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/types.h"

namespace lockstep::diag {

struct Fingerprint {
  std::uint8_t collective = 0;
  std::uint8_t dtype = 0;
  std::uint8_t op = 0;
  std::uint8_t reserved = 0;
  std::int32_t root = -1;
  std::uint64_t count = 0;
  std::uint64_t number = 0;  // collectives issued before this one on the group
  bool operator==(const Fingerprint&) const = default;
};
static_assert(sizeof(Fingerprint) == 24);

Fingerprint fingerprint(const OpInfo& info, std::uint64_t number);
// "allreduce #5 (float x 1000, sum)"
std::string describe(const Fingerprint& f);
// "" if every rank's fingerprint is the same; otherwise which ranks issued
// what, e.g. "rank 1 issued broadcast #5 (...) while ranks 0, 2 issued
// allreduce #5 (...)".
std::string compare_fingerprints(const std::vector<Fingerprint>& all);

// "0, 2, 5-7"
std::string rank_list(const std::vector<int>& ranks);

}  // namespace lockstep::diag
