// See zip_integrity.h. The layout read here (little-endian throughout):
//   end of central directory  "PK\5\6": entry count, directory size and
//                             offset (0xffff.. when a zip64 record holds them)
//   zip64 locator / record    "PK\6\7" just before it, pointing at
//                             "PK\6\6": 64-bit count, size and offset
//   central directory entry   "PK\1\2": method, CRC-32, sizes, name, the
//                             zip64 extra field (id 1), local header offset
//   local header              "PK\3\4": 30 bytes, name and extra, then data
// Every read is bounds-checked: the bytes may be anything.
#include "zip_integrity.h"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include <fmt/format.h>

namespace lockstep::torch {
namespace {

constexpr std::uint32_t kEndOfDirectory = 0x06054b50;
constexpr std::uint32_t kZip64Locator = 0x07064b50;
constexpr std::uint32_t kZip64EndOfDirectory = 0x06064b50;
constexpr std::uint32_t kDirectoryEntry = 0x02014b50;
constexpr std::uint32_t kLocalHeader = 0x04034b50;
constexpr std::uint16_t kStored = 0;

class Reader {
 public:
  explicit Reader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  std::size_t size() const { return bytes_.size(); }
  // The little-endian value of `width` bytes at `at`, if they are inside.
  std::optional<std::uint64_t> read(std::uint64_t at, int width) const {
    if (at > bytes_.size() || static_cast<std::uint64_t>(width) > bytes_.size() - at) return std::nullopt;
    std::uint64_t value = 0;
    for (int i = width - 1; i >= 0; --i)
      value = value << 8 | static_cast<std::uint64_t>(bytes_[static_cast<std::size_t>(at) + static_cast<std::size_t>(i)]);
    return value;
  }
  std::optional<std::span<const std::byte>> range(std::uint64_t at, std::uint64_t length) const {
    if (at > bytes_.size() || length > bytes_.size() - at) return std::nullopt;
    return bytes_.subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(length));
  }

 private:
  std::span<const std::byte> bytes_;
};

struct Directory {
  std::uint64_t entries = 0;
  std::uint64_t offset = 0;
};

// The end-of-directory record: the last "PK\5\6" whose comment runs to the
// end of the file (a comment may be up to 65535 bytes).
std::optional<std::uint64_t> find_end_of_directory(const Reader& zip) {
  if (zip.size() < 22) return std::nullopt;
  const std::uint64_t last = zip.size() - 22;
  const std::uint64_t first = last > 65535 ? last - 65535 : 0;
  for (std::uint64_t at = last + 1; at-- > first;) {
    if (zip.read(at, 4) != kEndOfDirectory) continue;
    if (at + 22 + *zip.read(at + 20, 2) == zip.size()) return at;
  }
  return std::nullopt;
}

std::optional<Directory> find_directory(const Reader& zip) {
  const auto end = find_end_of_directory(zip);
  if (!end) return std::nullopt;
  Directory dir{*zip.read(*end + 10, 2), *zip.read(*end + 16, 4)};
  if (dir.entries != 0xffff && dir.offset != 0xffffffff) return dir;
  if (*end < 20 || zip.read(*end - 20, 4) != kZip64Locator) return std::nullopt;
  const auto record = zip.read(*end - 20 + 8, 8);
  if (!record || zip.read(*record, 4) != kZip64EndOfDirectory) return std::nullopt;
  const auto entries = zip.read(*record + 32, 8);
  const auto offset = zip.read(*record + 48, 8);
  if (!entries || !offset) return std::nullopt;
  return Directory{*entries, *offset};
}

struct Entry {
  std::string name;
  std::uint16_t method = 0;
  std::uint32_t crc = 0;
  std::uint64_t size = 0;  // as stored
  std::uint64_t local_header = 0;
  std::uint64_t next = 0;  // the following directory entry
};

// A directory entry at `at`, with zip64's 64-bit fields where the 32-bit
// ones say 0xffffffff (they appear in the extra field in this order).
std::optional<Entry> read_entry(const Reader& zip, std::uint64_t at) {
  if (zip.read(at, 4) != kDirectoryEntry || !zip.read(at, 46)) return std::nullopt;
  Entry e;
  e.method = static_cast<std::uint16_t>(*zip.read(at + 10, 2));
  e.crc = static_cast<std::uint32_t>(*zip.read(at + 16, 4));
  std::uint64_t stored = *zip.read(at + 20, 4);
  std::uint64_t plain = *zip.read(at + 24, 4);
  const std::uint64_t name_length = *zip.read(at + 28, 2);
  const std::uint64_t extra_length = *zip.read(at + 30, 2);
  const std::uint64_t comment_length = *zip.read(at + 32, 2);
  e.local_header = *zip.read(at + 42, 4);
  const auto name = zip.range(at + 46, name_length);
  if (!name) return std::nullopt;
  e.name.assign(reinterpret_cast<const char*>(name->data()), name->size());
  for (std::uint64_t x = at + 46 + name_length; x + 4 <= at + 46 + name_length + extra_length;) {
    const auto id = zip.read(x, 2);
    const auto length = zip.read(x + 2, 2);
    if (!id || !length) return std::nullopt;
    if (*id == 1) {
      std::uint64_t field = x + 4;
      for (std::uint64_t* value : {&plain, &stored, &e.local_header}) {
        if (*value != 0xffffffff) continue;
        const auto wide = zip.read(field, 8);
        if (!wide) return std::nullopt;
        *value = *wide;
        field += 8;
      }
    }
    x += 4 + *length;
  }
  e.size = stored;
  e.next = at + 46 + name_length + extra_length + comment_length;
  return e;
}

std::optional<std::span<const std::byte>> entry_data(const Reader& zip, const Entry& e) {
  if (zip.read(e.local_header, 4) != kLocalHeader) return std::nullopt;
  const auto name_length = zip.read(e.local_header + 26, 2);
  const auto extra_length = zip.read(e.local_header + 28, 2);
  if (!name_length || !extra_length) return std::nullopt;
  return zip.range(e.local_header + 30 + *name_length + *extra_length, e.size);
}

std::uint32_t crc32_of(std::span<const std::byte> bytes) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  const auto* p = reinterpret_cast<const Bytef*>(bytes.data());
  for (std::size_t left = bytes.size(); left > 0;) {  // zlib takes 32-bit lengths
    const auto piece = static_cast<uInt>(std::min<std::size_t>(left, 1u << 30));
    crc = ::crc32(crc, p, piece);
    p += piece;
    left -= piece;
  }
  return static_cast<std::uint32_t>(crc);
}

}  // namespace

std::string zip_integrity_problem(std::span<const std::byte> archive) {
  const Reader zip(archive);
  const auto dir = find_directory(zip);
  if (!dir) return "";  // not a zip the reader knows: libtorch's reader says so
  std::uint64_t at = dir->offset;
  for (std::uint64_t i = 0; i < dir->entries; ++i) {
    const auto entry = read_entry(zip, at);
    if (!entry) return fmt::format("its directory entry {} of {} is cut short or damaged", i + 1, dir->entries);
    at = entry->next;
    if (entry->method != kStored || entry->crc == 0) continue;
    const auto data = entry_data(zip, *entry);
    if (!data) return fmt::format("its entry '{}' lies outside the file (it is truncated)", entry->name);
    if (crc32_of(*data) != entry->crc)
      return fmt::format("its entry '{}' ({} bytes) does not match its checksum (the bytes changed after they were "
                         "written: a disk, copy or transfer error)",
                         entry->name, entry->size);
  }
  return "";
}

}  // namespace lockstep::torch
