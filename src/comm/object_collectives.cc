// Object collectives: a size exchange (64-bit counts), then the bytes in
// one collective with per-rank counts. See lockstep/object_collectives.h.
// Stateless; thread-safety as the group's.
#include "lockstep/object_collectives.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>

#include "common/enforce.h"

namespace lockstep {
namespace {

std::vector<std::size_t> all_sizes(ProcessGroup& group, std::size_t mine) {
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(group.size()));
  const auto own = static_cast<std::int64_t>(mine);
  group.allgather(ConstBuffer{&own, 1, DType::i64}, Buffer{sizes.data(), sizes.size(), DType::i64})->wait();
  return std::vector<std::size_t>(sizes.begin(), sizes.end());
}

std::vector<Bytes> split(const Bytes& packed, const std::vector<std::size_t>& sizes) {
  std::vector<Bytes> out;
  out.reserve(sizes.size());
  std::size_t at = 0;
  for (std::size_t s : sizes) {
    out.emplace_back(packed.begin() + static_cast<std::ptrdiff_t>(at), packed.begin() + static_cast<std::ptrdiff_t>(at + s));
    at += s;
  }
  return out;
}

}  // namespace

std::vector<Bytes> all_gather_object(ProcessGroup& group, const Bytes& object) {
  const std::vector<std::size_t> sizes = all_sizes(group, object.size());
  Bytes packed(std::accumulate(sizes.begin(), sizes.end(), std::size_t{0}));
  group.allgather(ConstBuffer{object.data(), object.size(), DType::u8}, Buffer{packed.data(), packed.size(), DType::u8},
                  sizes)
      ->wait();
  return split(packed, sizes);
}

// Sizes go to everyone (one small allgather) so that every rank can pad its
// bytes to the largest object and one fixed-size gather carries them all.
std::vector<Bytes> gather_object(ProcessGroup& group, const Bytes& object, int root) {
  LOCKSTEP_CHECK_ARG(root >= 0 && root < group.size(), "gather_object: root {} is not a rank of this group of {}", root,
                     group.size());
  const std::vector<std::size_t> sizes = all_sizes(group, object.size());
  const std::size_t widest = *std::max_element(sizes.begin(), sizes.end());
  Bytes padded(widest);
  if (!object.empty()) std::memcpy(padded.data(), object.data(), object.size());
  const bool is_root = group.rank() == root;
  Bytes all(is_root ? widest * sizes.size() : 0);
  group.gather(ConstBuffer{padded.data(), widest, DType::u8}, Buffer{all.data(), all.size(), DType::u8}, root)->wait();
  if (!is_root) return {};
  std::vector<Bytes> out;
  for (std::size_t q = 0; q < sizes.size(); ++q)
    out.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(q * widest),
                     all.begin() + static_cast<std::ptrdiff_t>(q * widest + sizes[q]));
  return out;
}

// Root sends the number of objects and their sizes, then their bytes in
// one broadcast.
void broadcast_object_list(ProcessGroup& group, std::vector<Bytes>& objects, int root) {
  LOCKSTEP_CHECK_ARG(root >= 0 && root < group.size(), "broadcast_object_list: root {} is not a rank of this group of {}",
                     root, group.size());
  const bool is_root = group.rank() == root;
  std::int64_t count = is_root ? static_cast<std::int64_t>(objects.size()) : 0;
  group.broadcast(Buffer{&count, 1, DType::i64}, root)->wait();
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(count));
  if (is_root)
    for (std::size_t i = 0; i < objects.size(); ++i) sizes[i] = static_cast<std::int64_t>(objects[i].size());
  group.broadcast(Buffer{sizes.data(), sizes.size(), DType::i64}, root)->wait();
  const std::vector<std::size_t> lengths(sizes.begin(), sizes.end());
  Bytes packed(std::accumulate(lengths.begin(), lengths.end(), std::size_t{0}));
  if (is_root) {
    std::size_t at = 0;
    for (const Bytes& o : objects) {
      if (!o.empty()) std::memcpy(packed.data() + at, o.data(), o.size());
      at += o.size();
    }
  }
  group.broadcast(Buffer{packed.data(), packed.size(), DType::u8}, root)->wait();
  if (!is_root) objects = split(packed, lengths);
}

Bytes to_bytes(std::string_view text) {
  Bytes out(text.size());
  if (!text.empty()) std::memcpy(out.data(), text.data(), text.size());
  return out;
}

std::string to_string(const Bytes& bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

}  // namespace lockstep
