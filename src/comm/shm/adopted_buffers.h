// Ordinary buffers adopted into shared memory in place: a buffer a rank
// all-reduces in place again and again (PyTorch's DDP buckets, which its
// Reducer allocates itself) has the pages wholly inside it replaced by a
// shared-memory file mapped at the same address with the same contents,
// so peers can map it and the all-reduce skips the slots' two copies.
//
// Rules, each for a reason:
// - Only on the second sighting of the same (address, bytes), in place:
//   a buffer seen once is likely a temporary.
// - Only pages wholly inside the buffer, and only where every one of them
//   is ordinary private anonymous memory (the heap or an anonymous
//   mapping): a page shared with a neighbouring allocation or with malloc's
//   bookkeeping stays private, and a range another group (or anything else)
//   has mapped is left alone.
// - Never in a process with a GPU or RDMA device mapped: their drivers may
//   hold host pages for DMA, which a replaced page would leave behind.
//   Nor with a malloc replacement loaded (jemalloc, tcmalloc, ...) that may
//   count on a page given back with MADV_DONTNEED reading as zeros, which
//   holds for private memory only.
// - Only while /dev/shm keeps half of itself and 1 GiB free.
// - Before every use the range is checked to still be this mapping
//   (/proc/self/map_files names the file behind an exact range): the
//   allocator may have unmapped it and put private memory there. A range
//   that fails the check is never adopted again (its memory comes and
//   goes), and the operation takes the ordinary path.
// - A forked child gets private copies of every adopted range
//   (privatize_adopted_ranges_in_child, installed once per process), so
//   what it writes never reaches the parent and it sees the buffers as they
//   were at the fork, as fork promises.
// The mapping is never undone: the memory stays the caller's, now backed
// by shared memory, after the group is gone.
//
// Not thread-safe: used on the group's progress thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace lockstep::shm {

// What one rank tells its peers about a buffer before a large in-place
// all-reduce (small enough for an inline line).
struct AdoptionAnswer {
  // 0: not adopted; 1: the pages below are shared memory, which every peer
  // has mapped; 2: the same, adopted since the last operation all ranks ran
  // on adopted buffers (peers map it now).
  std::int64_t adopted = 0;
  std::int64_t generation = 0;      // names the file (a new one per adoption)
  std::int64_t slot = 0;            // which of the peer's views it replaces
  std::int64_t head_bytes = 0;      // from the buffer's start to its first whole page
  std::int64_t interior_bytes = 0;  // whole pages inside the buffer
};
static_assert(sizeof(AdoptionAnswer) == 40);

class AdoptedBuffers {
 public:
  // `name_of(generation)` names the shared-memory file of one adoption
  // (shm_open's form). `enabled` false: every answer is "not adopted".
  AdoptedBuffers(bool enabled, std::function<std::string(std::int64_t generation)> name_of);
  ~AdoptedBuffers();  // unlinks files no peer has mapped yet; mappings stay
  AdoptedBuffers(const AdoptedBuffers&) = delete;
  AdoptedBuffers& operator=(const AdoptedBuffers&) = delete;

  // Buffers of fewer bytes are never adopted.
  static constexpr std::size_t kMinBytes = 1 << 20;
  // At most this many adopted buffers per group (each peer keeps a view
  // per slot), and this many buffers remembered as seen once.
  static constexpr std::size_t kSlots = 32;
  static constexpr std::size_t kRemembered = 64;

  // This rank's answer for an all-reduce of [data, data + bytes) of
  // elements of `elem` bytes (`in_place` false: never adopted). Adopts the
  // buffer now if this is its second sighting and it qualifies.
  AdoptionAnswer answer(std::byte* data, std::size_t bytes, std::size_t elem, bool in_place);
  // After every peer has mapped the adoption named in `answer`: its file's
  // name is no longer needed.
  void peers_mapped(const AdoptionAnswer& answer);
  // How many buffers this rank has adopted (tests, logs).
  std::size_t adoptions() const { return static_cast<std::size_t>(next_generation_); }

  // Whether /proc/self/map_files can tell this process which file backs a
  // range (not in every sandbox); without it, nothing is adopted.
  static bool can_check_mappings();
  // Whether [begin, end) is exactly one mapping of the file named `name`
  // (a /dev/shm name as given to shm_open).
  static bool still_mapped(const std::byte* begin, const std::byte* end, const std::string& name);
  // Why the last answer() did not adopt a buffer it could have ("" if it
  // did, or if it was not the buffer's second sighting).
  const std::string& last_refusal() const { return last_refusal_; }

  // The rules, on /proc/self/maps' text. Whether every page of
  // [begin, end) is private anonymous memory:
  static bool private_anonymous(const std::string& maps, const std::byte* begin, const std::byte* end);
  // A mapped device whose driver may hold host pages for DMA (a GPU, an
  // RDMA NIC), or "": with one, nothing is adopted.
  static std::string dma_device_mapped(const std::string& maps);
  // A malloc replacement that may rely on pages given back with
  // MADV_DONTNEED reading as zeros (jemalloc, tcmalloc, mimalloc...), or
  // "": with one, nothing is adopted (a shared file keeps its contents).
  static std::string replacement_allocator_mapped(const std::string& maps);
  // Whether /dev/shm keeps enough free after `bytes` more.
  static bool leaves_room(std::size_t bytes, std::uint64_t free_bytes, std::uint64_t total_bytes);

 private:
  struct Seen {
    std::byte* data = nullptr;
    std::size_t bytes = 0;
    std::uint64_t last_use = 0;
    bool refused = false;  // did not qualify: never tried again
    bool adopted = false;
    std::int64_t generation = 0;
    std::int64_t slot = 0;
    bool linked = false;  // the file's name still exists (no peer mapped it yet)
  };
  // Why [first_page, end_page) may not be adopted now, or "".
  std::string refusal(std::byte* first_page, std::byte* end_page) const;
  bool adopt(Seen& seen, std::byte* first_page, std::byte* end_page);
  std::int64_t free_slot() const;
  void forget_oldest_unadopted();
  void unlink(Seen& seen);

  bool enabled_;
  std::function<std::string(std::int64_t)> name_of_;
  std::vector<Seen> seen_;
  std::uint64_t uses_ = 0;
  std::int64_t next_generation_ = 0;
  std::string last_refusal_;
};

// Installs, once per process, the fork handler that gives a child private
// copies of every adopted range (see above).
void privatize_adopted_ranges_in_forked_children();

// Whether a /dev/shm name (as shm_open takes it) is an adoption's.
bool is_adoption_name(const std::string& name);

}  // namespace lockstep::shm
