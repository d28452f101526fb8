// A store kept in one append-only file. Each operation opens the file, takes
// an flock (shared to read, exclusive to write), replays the records appended
// since this object last looked, and appends its own record. Opening per
// operation means objects copied into forked children never share a lock.
// Thread-safe: a mutex serialises this object's use of its replay cache.
//
// Record: [u8 kind][u32 key length][key][u32 value length][value], little
// endian; kind 1 = set, 2 = delete.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/unique_fd.h"
#include "lockstep/error.h"
#include "lockstep/store.h"
#include "store/key_value_map.h"
#include "store/store_errors.h"

namespace lockstep {
namespace {

constexpr std::uint8_t kSetRecord = 1;
constexpr std::uint8_t kDeleteRecord = 2;

void append_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint32_t read_u32(const char* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// An open, locked store file for the duration of one operation.
class LockedFile {
 public:
  LockedFile(const std::string& path, bool exclusive) {
    fd_ = UniqueFd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!fd_.valid())
      throw ConfigError(fmt::format("FileStore: cannot open '{}': {}; check the directory exists and is writable",
                                    path, std::strerror(errno)));
    while (::flock(fd_.fd(), exclusive ? LOCK_EX : LOCK_SH) != 0) {
      if (errno != EINTR) throw Error(fmt::format("FileStore: flock '{}': {}", path, std::strerror(errno)));
    }
  }
  int fd() const { return fd_.fd(); }

 private:
  UniqueFd fd_;  // closing it releases the lock
};

}  // namespace

struct FileStore::State {
  std::mutex mutex;
  KeyValueMap map;
  off_t replayed = 0;  // bytes of the file already applied to `map`

  // Applies records appended since the last replay. Caller holds the file lock.
  void replay(int fd, const std::string& path) {
    struct stat st {};
    if (fstat(fd, &st) != 0) throw Error(fmt::format("FileStore: stat '{}': {}", path, std::strerror(errno)));
    if (st.st_size < replayed) {  // the file was replaced: start over
      map = KeyValueMap();
      replayed = 0;
    }
    if (st.st_size == replayed) return;
    std::string data(static_cast<std::size_t>(st.st_size - replayed), '\0');
    std::size_t got = 0;
    while (got < data.size()) {
      const ssize_t n = ::pread(fd, data.data() + got, data.size() - got, replayed + static_cast<off_t>(got));
      if (n <= 0) throw Error(fmt::format("FileStore: read '{}': {}", path, n == 0 ? "short file" : std::strerror(errno)));
      got += static_cast<std::size_t>(n);
    }
    std::size_t pos = 0;
    while (pos + 9 <= data.size()) {
      const std::uint8_t kind = static_cast<std::uint8_t>(data[pos]);
      const std::uint32_t key_len = read_u32(&data[pos + 1]);
      if (pos + 5 + key_len + 4 > data.size()) break;
      const std::uint32_t value_len = read_u32(&data[pos + 5 + key_len]);
      const std::size_t end = pos + 9 + key_len + value_len;
      if (end > data.size()) break;
      std::string_view key(&data[pos + 5], key_len);
      if (kind == kSetRecord)
        map.set(key, std::string_view(&data[pos + 9 + key_len], value_len));
      else if (kind == kDeleteRecord)
        map.erase(key);
      else
        throw Error(fmt::format("FileStore: '{}' is corrupt (record kind {} at offset {}); delete it and restart the job",
                                path, kind, replayed + static_cast<off_t>(pos)));
      pos = end;
    }
    replayed += static_cast<off_t>(pos);
  }

  static void append(int fd, const std::string& path, std::uint8_t kind, std::string_view key,
                     std::string_view value) {
    std::string record;
    record.push_back(static_cast<char>(kind));
    append_u32(record, static_cast<std::uint32_t>(key.size()));
    record.append(key);
    append_u32(record, static_cast<std::uint32_t>(value.size()));
    record.append(value);
    const off_t end = ::lseek(fd, 0, SEEK_END);
    std::size_t put = 0;
    while (put < record.size()) {
      const ssize_t n = ::pwrite(fd, record.data() + put, record.size() - put, end + static_cast<off_t>(put));
      if (n <= 0) throw Error(fmt::format("FileStore: write '{}': {}", path, std::strerror(errno)));
      put += static_cast<std::size_t>(n);
    }
  }
};

FileStore::FileStore(std::string path) : path_(std::move(path)), state_(std::make_unique<State>()) {
  LockedFile file(path_, /*exclusive=*/false);  // fail now, with a clear message, if it cannot be opened
}

FileStore::~FileStore() = default;

void FileStore::set(std::string_view key, std::string_view value) {
  std::lock_guard lock(state_->mutex);
  LockedFile file(path_, true);
  State::append(file.fd(), path_, kSetRecord, key, value);
  state_->replay(file.fd(), path_);
}

std::string FileStore::get(std::string_view key) {
  const std::string k(key);
  wait({k});
  std::lock_guard lock(state_->mutex);
  return *state_->map.get(k);
}

std::int64_t FileStore::add(std::string_view key, std::int64_t delta) {
  std::lock_guard lock(state_->mutex);
  LockedFile file(path_, true);
  state_->replay(file.fd(), path_);
  const std::int64_t value = state_->map.add(key, delta);
  State::append(file.fd(), path_, kSetRecord, key, std::to_string(value));
  state_->replay(file.fd(), path_);
  return value;
}

std::string FileStore::compare_set(std::string_view key, std::string_view expected, std::string_view desired) {
  std::lock_guard lock(state_->mutex);
  LockedFile file(path_, true);
  state_->replay(file.fd(), path_);
  const auto before = state_->map.get(key);
  std::string after = state_->map.compare_set(key, expected, desired);
  if (state_->map.get(key) != before) State::append(file.fd(), path_, kSetRecord, key, after);
  state_->replay(file.fd(), path_);
  return after;
}

void FileStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  const Deadline deadline = Deadline::after(timeout);
  auto pause = std::chrono::microseconds(200);
  for (;;) {
    std::vector<std::string> missing;
    {
      std::lock_guard lock(state_->mutex);
      LockedFile file(path_, false);
      state_->replay(file.fd(), path_);
      missing = state_->map.missing(keys);
    }
    if (missing.empty()) return;
    if (deadline.expired()) throw store_wait_timeout(fmt::format("FileStore '{}'", path_), missing, timeout);
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(20));
  }
}

bool FileStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(state_->mutex);
  LockedFile file(path_, false);
  state_->replay(file.fd(), path_);
  return state_->map.missing(keys).empty();
}

bool FileStore::delete_key(std::string_view key) {
  std::lock_guard lock(state_->mutex);
  LockedFile file(path_, true);
  state_->replay(file.fd(), path_);
  if (!state_->map.contains(key)) return false;
  State::append(file.fd(), path_, kDeleteRecord, key, {});
  state_->replay(file.fd(), path_);
  return true;
}

std::shared_ptr<Store> FileStore::clone() const {
  auto copy = std::make_shared<FileStore>(path_);
  copy->set_timeout(timeout());
  return copy;
}

std::int64_t FileStore::num_keys() {
  std::lock_guard lock(state_->mutex);
  LockedFile file(path_, false);
  state_->replay(file.fd(), path_);
  return state_->map.size();
}

}  // namespace lockstep
