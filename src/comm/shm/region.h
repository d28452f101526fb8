// Shared-memory regions for the shm backend: created by their owner (who
// touches every page first, so on NUMA machines the memory sits next to the
// owner's core) and mapped by peers.
//
// A region normally never has a name: it is an unnamed file in /dev/shm's
// tmpfs (O_TMPFILE, so /dev/shm's size still bounds it), which peers open
// through /proc/<pid>/fd/<fd> while the owner holds the descriptor. Nothing
// can be left in /dev/shm, whatever kills the owner and whenever.
// Where a peer cannot open it that way (another pid namespace, a process
// that is not dumpable), regions are created under a name instead and
// unlinked as soon as everyone has mapped them (region_sharing.h). Names
// carry the creator's pid, so leftovers of a process killed during that
// window can be recognised and swept, and under `lockstep run` the
// launcher's tag, so the launcher removes its own job's leftovers (and only
// those) when its ranks are gone. A Region is move-only; not shared between
// threads.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

#include "common/os.h"

namespace lockstep::shm {

class Region {
 public:
  Region() = default;
  ~Region();
  Region(Region&& other) noexcept;
  Region& operator=(Region&& other) noexcept;
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  // Creates, sizes, maps and zero-fills a new region under `name`. Throws
  // Error, or ConfigError when /dev/shm has no room. The system calls go
  // through `os`, which must outlive the region.
  static Region create(const std::string& name, std::size_t bytes, Os& os = Os::real());
  // The same without a name. Returns an empty region (data() null) and
  // sets `why` where this system has no unnamed files in /dev/shm; throws
  // as create() otherwise. The region keeps its descriptor open for peers
  // until stop_sharing().
  static Region create_unnamed(std::size_t bytes, std::string& why, Os& os = Os::real());
  // Maps an existing region. Throws PeerError if it is gone.
  static Region open(const std::string& name, std::size_t bytes, Os& os = Os::real());
  // Maps process `pid`'s unnamed region through its descriptor `fd`.
  // Returns an empty region and sets `why` where this process may not
  // open it (errno's text, with the likely cause).
  static Region open_unnamed(pid_t pid, int fd, std::size_t bytes, std::string& why, Os& os = Os::real());
  // The descriptor peers open an unnamed region through (-1: none).
  int shared_fd() const { return fd_; }
  // Closes that descriptor: every peer has opened the region.
  void stop_sharing();
  // Removes the name (mappings stay valid). Safe to call twice.
  void unlink();

  std::byte* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  void unmap();

  Os* os_ = &Os::real();
  std::string name_;
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  bool linked_ = false;
  int fd_ = -1;  // an unnamed region's, while peers may still open it
};

// "/lockstep.<stem>.<what>.<pid>", where the stem is the group's nonce,
// preceded by the launcher's tag under `lockstep run` ("<tag>.<nonce>").
std::string region_name(const std::string& stem, const std::string& what);
// The same name as created by process `pid`.
std::string region_name_of(const std::string& stem, const std::string& what, pid_t pid);

// A launcher's tag (LOCKSTEP_SHM_TAG): 1 to kMaxSegmentTagLength letters,
// digits, '-' or '_', so that "lockstep.<tag>." never prefixes another tag's names.
inline constexpr std::size_t kMaxSegmentTagLength = 32;
bool is_segment_tag(const std::string& tag);

// Unlinks every /dev/shm/lockstep.<tag>.* segment; returns how many. For
// the launcher once all of its ranks have exited: whatever they left is
// garbage (peers that mapped a segment keep their mapping).
std::size_t remove_tagged_segments(const std::string& tag);

// Unlinks /dev/shm/lockstep.* files whose creating process no longer
// exists (left by a process killed between creating and unlinking them).
void sweep_stale_regions();

}  // namespace lockstep::shm
