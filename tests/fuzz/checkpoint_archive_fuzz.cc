// Fuzz target: the checkpoint integrity check (src/torch/zip_integrity.h),
// the first code that parses a checkpoint file's bytes, before libtorch's
// reader. Whatever the bytes, it returns a verdict (the same one each
// time) without reading outside them; the sanitizers of the fuzz build
// catch any read past the end.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "zip_integrity.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // A copy of exactly `size` bytes, so that a read past the end is caught
  // even where the fuzzer's buffer is larger.
  const std::vector<std::byte> bytes(reinterpret_cast<const std::byte*>(data),
                                     reinterpret_cast<const std::byte*>(data) + size);
  const std::string first = lockstep::torch::zip_integrity_problem(bytes);
  if (lockstep::torch::zip_integrity_problem(bytes) != first) std::abort();
  return 0;
}
