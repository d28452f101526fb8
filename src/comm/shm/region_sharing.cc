// Regions shared among ranks; see region_sharing.h.
#include "comm/shm/region_sharing.h"

#include <fmt/format.h>

#include "common/env.h"

namespace lockstep::shm {
namespace {

std::string key_of(const std::string& key, const char* part, int rank) { return fmt::format("{}/{}/{}", key, part, rank); }

// Step 2 for one peer: "" or why its copy could not be opened.
std::string open_peer(const RegionSharing& how, const std::string& published, int q, std::size_t bytes, Region& out) {
  const auto fd = parse_int(published.substr(0, published.find(' ')));
  if (!fd || *fd < 0) return fmt::format("rank {} made no unnamed copy ({})", q, published.substr(published.find(' ') + 1));
  std::string why;
  out = Region::open_unnamed(how.pids[static_cast<std::size_t>(q)], static_cast<int>(*fd), bytes, why, *how.os);
  return why.empty() ? "" : fmt::format("rank {}'s copy: {}", q, why);
}

SharedRegions share_by_name(const RegionSharing& how, const std::string& key, const std::string& what,
                            std::size_t bytes, const std::function<void(std::byte*)>& init, std::string why) {
  SharedRegions out{std::vector<Region>(static_cast<std::size_t>(how.size)), std::move(why)};
  Region& own = out.regions[static_cast<std::size_t>(how.rank)];
  own = Region::create(region_name(how.stem, what), bytes, *how.os);
  init(own.data());
  how.store->set(key_of(key, "name", how.rank), own.name());
  for (int q = 0; q < how.size; ++q)
    if (q != how.rank)
      out.regions[static_cast<std::size_t>(q)] = Region::open(how.store->get(key_of(key, "name", q)), bytes, *how.os);
  how.store->set(key_of(key, "mapped", how.rank), "1");
  std::vector<std::string> mapped;
  for (int q = 0; q < how.size; ++q) mapped.push_back(key_of(key, "mapped", q));
  how.store->wait(mapped, how.timeout);
  own.unlink();
  return out;
}

}  // namespace

SharedRegions share_regions(const RegionSharing& how, const std::string& key, const std::string& what,
                            std::size_t bytes, const std::function<void(std::byte*)>& init) {
  std::vector<Region> regions(static_cast<std::size_t>(how.size));
  std::string why;
  Region own = Region::create_unnamed(bytes, why, *how.os);
  if (own.data() != nullptr) init(own.data());
  how.store->set(key_of(key, "fd", how.rank), own.data() ? std::to_string(own.shared_fd()) : "-1 " + why);

  std::string cannot;  // why this rank could not open some peer's copy
  for (int q = 0; q < how.size && own.data() != nullptr; ++q) {
    if (q == how.rank) continue;
    cannot = open_peer(how, how.store->get(key_of(key, "fd", q)), q, bytes, regions[static_cast<std::size_t>(q)]);
    if (!cannot.empty()) break;
  }
  if (own.data() == nullptr) cannot = "this rank made no unnamed copy (" + why + ")";
  how.store->set(key_of(key, "opened", how.rank), cannot.empty() ? "1" : "0 " + cannot);

  std::string first_refusal;
  for (int q = 0; q < how.size; ++q) {
    const std::string answer = q == how.rank ? (cannot.empty() ? "1" : "0 " + cannot) : how.store->get(key_of(key, "opened", q));
    if (answer != "1" && first_refusal.empty()) first_refusal = fmt::format("rank {}: {}", q, answer.substr(2));
  }
  if (first_refusal.empty()) {
    // Every peer holds its own mapping now: the descriptor has done its work.
    own.stop_sharing();
    regions[static_cast<std::size_t>(how.rank)] = std::move(own);
    return SharedRegions{std::move(regions), ""};
  }
  regions.clear();
  own = Region();
  return share_by_name(how, key, what, bytes, init, first_refusal);
}

}  // namespace lockstep::shm
