// SharedAllocations; see shared_allocations.h.
#include "comm/shm/shared_allocations.h"

namespace lockstep::shm {

void SharedAllocations::add(std::uint64_t id, std::size_t bytes, int self, std::vector<Region> regions) {
  std::lock_guard lock(mutex_);
  Allocation a;
  a.bytes = bytes;
  a.own = regions[static_cast<std::size_t>(self)].data();
  a.regions = std::move(regions);
  allocations_.emplace(id, std::move(a));
}

void SharedAllocations::remove(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  allocations_.erase(id);  // unmaps this rank's view of every copy
}

std::optional<SharedAllocations::Location> SharedAllocations::find(const void* p, std::size_t bytes) const {
  const auto* b = static_cast<const std::byte*>(p);
  std::lock_guard lock(mutex_);
  for (const auto& [id, a] : allocations_)
    if (b >= a.own && b + bytes <= a.own + a.bytes) return Location{id, static_cast<std::size_t>(b - a.own)};
  return std::nullopt;
}

std::vector<std::byte*> SharedAllocations::bases(std::uint64_t id) const {
  std::lock_guard lock(mutex_);
  std::vector<std::byte*> out;
  auto it = allocations_.find(id);
  if (it == allocations_.end()) return out;
  for (const auto& r : it->second.regions) out.push_back(r.data());
  return out;
}

}  // namespace lockstep::shm
