// AdoptedBuffers; see adopted_buffers.h.
#include "comm/shm/adopted_buffers.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>

#include <fmt/format.h>

namespace lockstep::shm {
namespace {

constexpr std::uintptr_t kPage = 4096;

std::byte* round_up_to_page(std::byte* p) {
  return reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(p) + kPage - 1) / kPage * kPage);
}
std::byte* round_down_to_page(std::byte* p) {
  return reinterpret_cast<std::byte*>(reinterpret_cast<std::uintptr_t>(p) / kPage * kPage);
}

// The whole of a /proc file, read with plain system calls (also usable in a
// forked child of a threaded process).
std::string read_proc_file(const char* path) {
  std::string text;
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return text;
  char buffer[16384];
  for (;;) {
    const ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got <= 0) break;
    text.append(buffer, static_cast<std::size_t>(got));
  }
  ::close(fd);
  return text;
}

// One line of /proc/self/maps: "start-end perms offset dev inode   path".
struct Mapping {
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;
  char perms[5] = {};
  unsigned long long inode = 0;
  std::string_view path;
};

template <typename Visit>
void for_each_mapping(const std::string& maps, Visit visit) {
  std::size_t at = 0;
  while (at < maps.size()) {
    std::size_t eol = maps.find('\n', at);
    if (eol == std::string::npos) eol = maps.size();
    const std::string_view line(maps.data() + at, eol - at);
    at = eol + 1;
    Mapping m;
    unsigned long long offset = 0;
    unsigned dev_major = 0, dev_minor = 0;
    int path_at = 0;
    const std::string copy(line);  // sscanf needs a terminated string
    if (std::sscanf(copy.c_str(), "%" SCNxPTR "-%" SCNxPTR " %4s %llx %x:%x %llu %n", &m.begin, &m.end, m.perms,
                    &offset, &dev_major, &dev_minor, &m.inode, &path_at) < 7)
      continue;
    m.path = line.substr(std::min<std::size_t>(static_cast<std::size_t>(path_at), line.size()));
    visit(m);
  }
}

// "/dev/shm/NAME" or "/dev/shm/NAME (deleted)" -> "/NAME"; empty if not in /dev/shm.
std::string shm_name_of_path(std::string_view path) {
  constexpr std::string_view kDir = "/dev/shm", kDeleted = " (deleted)";
  if (path.substr(0, kDir.size()) != kDir) return {};
  path.remove_prefix(kDir.size());
  if (path.size() >= kDeleted.size() && path.substr(path.size() - kDeleted.size()) == kDeleted)
    path.remove_suffix(kDeleted.size());
  return std::string(path);
}

[[noreturn]] void die_in_child(const char* why) {
  const char* text = "lockstep: a forked child could not get a private copy of a buffer adopted into shared memory: ";
  (void)!::write(2, text, std::strlen(text));
  (void)!::write(2, why, std::strlen(why));
  (void)!::write(2, "\n", 1);
  std::abort();
}

// In a forked child (one thread): replaces each adopted range with a
// private copy of its contents, so the child's writes stay its own.
void privatize_in_child() {
  const std::string maps = read_proc_file("/proc/self/maps");
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
  for_each_mapping(maps, [&](const Mapping& m) {
    if (is_adoption_name(shm_name_of_path(m.path))) ranges.emplace_back(m.begin, m.end);
  });
  for (const auto& [begin, end] : ranges) {
    const std::size_t len = end - begin;
    void* copy = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (copy == MAP_FAILED) die_in_child("out of memory");
    std::memcpy(copy, reinterpret_cast<const void*>(begin), len);
    if (::mremap(copy, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(begin)) == MAP_FAILED)
      die_in_child(std::strerror(errno));
  }
}

}  // namespace

bool is_adoption_name(const std::string& name) {
  // "/lockstep.<stem>.adopt-<generation>.<pid>" (region_name); the stem may
  // hold a dot (tag.nonce) and a tag may begin with "adopt-", so look at
  // the second field from the end only.
  if (name.rfind("/lockstep.", 0) != 0) return false;
  const std::size_t last_dot = name.rfind('.');
  if (last_dot == std::string::npos || last_dot == 0) return false;
  const std::size_t what_dot = name.rfind('.', last_dot - 1);
  if (what_dot == std::string::npos || what_dot < std::strlen("/lockstep")) return false;
  return name.compare(what_dot + 1, 6, "adopt-") == 0;
}

void privatize_adopted_ranges_in_forked_children() {
  // Process-wide by nature: a fork copies the whole address space, whatever
  // group adopted what; installed once, never removed.
  static std::once_flag installed;
  std::call_once(installed, [] { ::pthread_atfork(nullptr, nullptr, privatize_in_child); });
}

AdoptedBuffers::AdoptedBuffers(bool enabled, std::function<std::string(std::int64_t)> name_of)
    : enabled_(enabled), name_of_(std::move(name_of)) {
  if (enabled_) privatize_adopted_ranges_in_forked_children();
}

AdoptedBuffers::~AdoptedBuffers() {
  for (Seen& seen : seen_) unlink(seen);
}

bool AdoptedBuffers::can_check_mappings() {
  const int fd = ::memfd_create("lockstep-mapping-probe", MFD_CLOEXEC);
  if (fd < 0) return false;
  bool ok = false;
  if (::ftruncate(fd, kPage) == 0) {
    void* p = ::mmap(nullptr, kPage, PROT_READ, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      const auto begin = reinterpret_cast<std::uintptr_t>(p);
      const std::string link = fmt::format("/proc/self/map_files/{:x}-{:x}", begin, begin + kPage);
      char target[256] = {};
      const ssize_t got = ::readlink(link.c_str(), target, sizeof target - 1);
      ok = got > 0 && std::string_view(target, static_cast<std::size_t>(got)).find("lockstep-mapping-probe") !=
                          std::string_view::npos;
      ::munmap(p, kPage);
    }
  }
  ::close(fd);
  return ok;
}

bool AdoptedBuffers::still_mapped(const std::byte* begin, const std::byte* end, const std::string& name) {
  const std::string link = fmt::format("/proc/self/map_files/{:x}-{:x}", reinterpret_cast<std::uintptr_t>(begin),
                                       reinterpret_cast<std::uintptr_t>(end));
  char target[512];
  const ssize_t got = ::readlink(link.c_str(), target, sizeof target);
  if (got <= 0 || static_cast<std::size_t>(got) >= sizeof target) return false;
  return shm_name_of_path(std::string_view(target, static_cast<std::size_t>(got))) == name;
}

bool AdoptedBuffers::private_anonymous(const std::string& maps, const std::byte* begin, const std::byte* end) {
  auto covered_to = reinterpret_cast<std::uintptr_t>(begin);
  const auto until = reinterpret_cast<std::uintptr_t>(end);
  bool ordinary = true;
  for_each_mapping(maps, [&](const Mapping& m) {
    if (m.end <= covered_to || m.begin >= until || !ordinary) return;
    const bool anonymous = m.inode == 0 && (m.path.empty() || m.path == "[heap]");
    ordinary = m.begin <= covered_to && anonymous && std::strcmp(m.perms, "rw-p") == 0;
    covered_to = m.end;
  });
  return ordinary && covered_to >= until;
}

std::string AdoptedBuffers::dma_device_mapped(const std::string& maps) {
  // GPUs (NVIDIA, AMD) and RDMA NICs: once one is open, its driver may hold
  // host pages for DMA (cudaHostRegister, ibv_reg_mr) that /proc/self/maps
  // cannot tell from others, and a page replaced under a device is a
  // device reading or writing the old one: a silent wrong result.
  constexpr std::string_view kDevices[] = {"/dev/nvidia", "/dev/kfd", "/dev/infiniband/", "/dev/accel/"};
  std::string found;
  for_each_mapping(maps, [&](const Mapping& m) {
    for (std::string_view device : kDevices)
      if (found.empty() && m.path.substr(0, device.size()) == device) found = std::string(m.path);
    if (found.empty() && m.path.find("/libcuda.so") != std::string_view::npos) found = std::string(m.path);
  });
  return found;
}

std::string AdoptedBuffers::replacement_allocator_mapped(const std::string& maps) {
  // Allocators that take a page given back with MADV_DONTNEED to read as
  // zeros afterwards (jemalloc marks such extents zeroed and serves calloc
  // from them): true of private anonymous memory, not of a shared file,
  // which keeps its contents. glibc's malloc never relies on it.
  constexpr std::string_view kAllocators[] = {"jemalloc", "tcmalloc", "mimalloc", "snmalloc", "hoard"};
  std::string found;
  for_each_mapping(maps, [&](const Mapping& m) {
    const std::string_view file = m.path.substr(m.path.rfind('/') == std::string_view::npos ? 0 : m.path.rfind('/') + 1);
    for (std::string_view allocator : kAllocators)
      if (found.empty() && file.find(allocator) != std::string_view::npos) found = std::string(m.path);
  });
  return found;
}

bool AdoptedBuffers::leaves_room(std::size_t bytes, std::uint64_t free_bytes, std::uint64_t total_bytes) {
  // /dev/shm is shared with everything else on the host that uses it
  // (PyTorch's data-loader workers pass batches through it): keep half of
  // it, and at least 1 GiB, free. A container's default 64 MiB is never used.
  constexpr std::uint64_t kKeepFree = 1ull << 30;
  return free_bytes >= bytes && free_bytes - bytes >= std::max<std::uint64_t>(kKeepFree, total_bytes / 2);
}

std::string AdoptedBuffers::refusal(std::byte* first_page, std::byte* end_page) const {
  const std::string maps = read_proc_file("/proc/self/maps");
  if (!private_anonymous(maps, first_page, end_page))
    return "its pages are not all private anonymous memory (another mapping, perhaps another group's adoption)";
  if (const std::string device = dma_device_mapped(maps); !device.empty())
    return fmt::format("this process has {} mapped, whose driver may hold host pages for DMA", device);
  if (const std::string allocator = replacement_allocator_mapped(maps); !allocator.empty())
    return fmt::format("this process has {} loaded, an allocator that may take pages it gave back to read as zeros",
                       allocator);
  struct statvfs shm {};
  if (::statvfs("/dev/shm", &shm) != 0) return "/dev/shm cannot be examined";
  const std::size_t bytes = static_cast<std::size_t>(end_page - first_page);
  if (!leaves_room(bytes, std::uint64_t{shm.f_bavail} * shm.f_frsize, std::uint64_t{shm.f_blocks} * shm.f_frsize))
    return fmt::format("/dev/shm would have less than half of its {} MiB, or less than 1 GiB, free",
                       std::uint64_t{shm.f_blocks} * shm.f_frsize >> 20);
  if (free_slot() < 0) return fmt::format("{} buffers are adopted already", kSlots);
  return "";
}

AdoptionAnswer AdoptedBuffers::answer(std::byte* data, std::size_t bytes, std::size_t elem, bool in_place) {
  if (!enabled_ || !in_place || bytes < kMinBytes || reinterpret_cast<std::uintptr_t>(data) % elem != 0) return {};
  std::byte* first_page = round_up_to_page(data);
  std::byte* end_page = round_down_to_page(data + bytes);
  if (end_page <= first_page) return {};
  const auto adopted_answer = [&](const Seen& s) {
    return AdoptionAnswer{s.linked ? 2 : 1, s.generation, s.slot, first_page - data, end_page - first_page};
  };
  ++uses_;
  last_refusal_.clear();
  auto it = std::find_if(seen_.begin(), seen_.end(), [&](const Seen& s) { return s.data == data && s.bytes == bytes; });
  if (it == seen_.end()) {
    if (seen_.size() >= kSlots + kRemembered) forget_oldest_unadopted();
    seen_.push_back(Seen{data, bytes, uses_});
    return {};
  }
  Seen& seen = *it;
  seen.last_use = uses_;
  if (seen.refused) return {};
  if (seen.adopted) {
    if (still_mapped(first_page, end_page, name_of_(seen.generation))) return adopted_answer(seen);
    // The allocator unmapped it and may have put other memory there: this
    // buffer's memory comes and goes, and adopting it again would cost a
    // copy each time. The ordinary path from now on.
    unlink(seen);
    seen = Seen{data, bytes, uses_, /*refused=*/true};
    last_refusal_ = "its adopted pages were unmapped since (the allocator freed the buffer)";
    return {};
  }
  last_refusal_ = refusal(first_page, end_page);
  if (!last_refusal_.empty() || !adopt(seen, first_page, end_page)) {
    if (last_refusal_.empty()) last_refusal_ = "/dev/shm refused a file of that size";
    seen.refused = true;
    return {};
  }
  return adopted_answer(seen);
}

// Copies the pages into a new shared-memory file, then maps the file over
// them (MAP_FIXED replaces the old pages in one step: a thread reading the
// buffer meanwhile sees the same bytes either way). Nothing may write the
// buffer meanwhile: it is in this all-reduce's hands.
bool AdoptedBuffers::adopt(Seen& seen, std::byte* first_page, std::byte* end_page) {
  const std::int64_t slot = free_slot();
  if (slot < 0) return false;
  const std::int64_t generation = next_generation_;
  const std::string name = name_of_(generation);
  const std::size_t len = static_cast<std::size_t>(end_page - first_page);
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  // Reserved now: on a full /dev/shm the buffer stays as it is.
  void* staging = MAP_FAILED;
  if (::ftruncate(fd, static_cast<off_t>(len)) == 0 && ::posix_fallocate(fd, 0, static_cast<off_t>(len)) == 0)
    staging = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (staging == MAP_FAILED) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    return false;
  }
  std::memcpy(staging, first_page, len);
  void* at = ::mmap(first_page, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  ::close(fd);
  if (at == MAP_FAILED) {
    // mmap may have removed the old pages before failing: put private
    // pages back with the contents.
    if (::mmap(first_page, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED)
      std::memcpy(first_page, staging, len);
    ::munmap(staging, len);
    ::shm_unlink(name.c_str());
    return false;
  }
  ::munmap(staging, len);
  ++next_generation_;
  seen.adopted = true;
  seen.generation = generation;
  seen.slot = slot;
  seen.linked = true;
  return true;
}

void AdoptedBuffers::peers_mapped(const AdoptionAnswer& answer) {
  for (Seen& seen : seen_)
    if (seen.adopted && seen.generation == answer.generation) unlink(seen);
}

void AdoptedBuffers::unlink(Seen& seen) {
  if (seen.linked) ::shm_unlink(name_of_(seen.generation).c_str());
  seen.linked = false;
}

std::int64_t AdoptedBuffers::free_slot() const {
  for (std::int64_t slot = 0; slot < static_cast<std::int64_t>(kSlots); ++slot)
    if (std::none_of(seen_.begin(), seen_.end(), [&](const Seen& s) { return s.adopted && s.slot == slot; }))
      return slot;
  return -1;
}

void AdoptedBuffers::forget_oldest_unadopted() {
  auto oldest = seen_.end();
  for (auto it = seen_.begin(); it != seen_.end(); ++it)
    if (!it->adopted && (oldest == seen_.end() || it->last_use < oldest->last_use)) oldest = it;
  if (oldest != seen_.end()) seen_.erase(oldest);
}

}  // namespace lockstep::shm
