// POSIX shared-memory regions for the shm backend: created by their owner
// (who touches every page first, so on NUMA machines the memory sits next to
// the owner's core), mapped by peers, and unlinked as soon as everyone has
// mapped them, so nothing is left in /dev/shm after a normal exit or a kill.
// Names carry the creator's pid, so leftovers of a process killed during
// set-up can be recognised and swept. A Region is move-only; not shared
// between threads.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

namespace lockstep::shm {

class Region {
 public:
  Region() = default;
  ~Region();
  Region(Region&& other) noexcept;
  Region& operator=(Region&& other) noexcept;
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  // Creates, sizes, maps and zero-fills a new region. Throws Error.
  static Region create(const std::string& name, std::size_t bytes);
  // Maps an existing region. Throws PeerError if it is gone.
  static Region open(const std::string& name, std::size_t bytes);
  // Removes the name (mappings stay valid). Safe to call twice.
  void unlink();

  std::byte* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  bool linked_ = false;
};

// "/lockstep.<job nonce>.<what>.<pid>"
std::string region_name(const std::string& nonce, const std::string& what);

// Unlinks /dev/shm/lockstep.* files whose creating process no longer
// exists (left by a process killed between creating and unlinking them).
void sweep_stale_regions();

}  // namespace lockstep::shm
