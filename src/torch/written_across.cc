// Buffers written into a receiver's memory by the root; see
// written_across.h. Per buffer, with the tag of the transfer it replaces
// (messages between two ranks on one tag arrive in order):
//   1. receiver to root: its pid, the buffer's address and length, a
//      random word and the address where it holds that word until step 3;
//      or a length of 0 where most of the buffer's pages are present
//      already (a model's parameters): the transport's copy into them is
//      faster than the kernel's, which pins each page it writes;
//   2. the root reads that word from that pid; where it matches, it
//      writes the buffer there, else it writes nothing;
//   3. root to receiver: whether it wrote (1) or not (0); on 0 the buffer
//      follows by the transport.
#include "written_across.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <random>
#include <vector>

#include "comm/shm/single_copy.h"

namespace lockstep::torch {
namespace {

constexpr std::size_t kLeastBytes = std::size_t{2} << 20;
// The receiver makes its pages present a chunk at a time, last first,
// toward the middle: the root's writes go first to last.
constexpr std::size_t kPopulateChunk = std::size_t{1} << 20;

struct Request {
  std::int64_t pid;
  std::int64_t address;
  std::int64_t bytes;
  std::uint64_t word;
  std::int64_t word_address;
};
constexpr std::size_t kRequestWords = sizeof(Request) / sizeof(std::int64_t);

template <typename T>
std::int64_t address_of(T* p) {
  return static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(p));
}

template <typename T>
T* pointer_at(std::int64_t address) {
  return reinterpret_cast<T*>(static_cast<std::uintptr_t>(address));
}

// The second half of [data, data + bytes) made present, whole pages only.
// A kernel before 5.14 refuses the advice: the copy then takes the faults.
void make_second_half_present(void* data, std::size_t bytes) {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  const auto middle = (begin + bytes / 2 + page - 1) / page * page;
  for (auto end = (begin + bytes) / page * page; end > middle;) {
    const auto from = end - middle > kPopulateChunk ? end - kPopulateChunk : middle;
    if (::madvise(reinterpret_cast<void*>(from), end - from, MADV_POPULATE_WRITE) != 0) return;
    end = from;
  }
}

// Whether most of the pages of [data, data + bytes) are not present yet
// (memory just allocated): the pages the writes would fault in.
bool mostly_absent(void* data, std::size_t bytes) {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(data) / page * page;
  const auto end = reinterpret_cast<std::uintptr_t>(data) + bytes;
  std::vector<unsigned char> present((end - begin + page - 1) / page);
  if (::mincore(reinterpret_cast<void*>(begin), end - begin, present.data()) != 0) return false;
  std::size_t absent = 0;
  for (unsigned char p : present) absent += (p & 1) == 0 ? 1 : 0;
  return 2 * absent > present.size();
}

// Whether process `pid` holds `word` at `address`: the process that asked.
bool is_the_asker(pid_t pid, std::int64_t address, std::uint64_t word) {
  std::uint64_t seen = ~word;
  return shm::read_peer(pid, &seen, pointer_at<void>(address), sizeof(seen)).empty() && seen == word;
}

// Runs `body`; where it throws, waits for `transfers` first (none may
// write into a buffer once the caller has the error), then rethrows.
template <typename Body>
void waiting_on_error(std::vector<std::shared_ptr<Work>>& transfers, Body&& body) {
  try {
    body();
  } catch (...) {
    try {
      wait_all(transfers);
    } catch (...) {  // the first error is the one the caller gets
    }
    throw;
  }
}

}  // namespace

bool goes_written_across(const Buffer& b) { return b.device.kind == DeviceKind::host && b.bytes() >= kLeastBytes; }

void receive_written_across(ProcessGroup& group, Buffer b, int root, int tag,
                            std::vector<std::shared_ptr<Work>>& transfers) {
  waiting_on_error(transfers, [&] {
    // Held until the root answers: it reads the word before it writes.
    const std::uint64_t word = std::random_device{}() | (std::uint64_t{std::random_device{}()} << 32);
    const bool ask = mostly_absent(b.data, b.bytes());
    const Request request{::getpid(), address_of(b.data), ask ? static_cast<std::int64_t>(b.bytes()) : 0, word,
                          address_of(&word)};
    group.send(ConstBuffer{&request, kRequestWords, DType::i64}, root, tag)->wait();
    std::int64_t written = 0;
    if (ask) {
      make_second_half_present(b.data, b.bytes());
      group.recv(Buffer{&written, 1, DType::i64}, root, tag)->wait();
    }
    if (written == 0) transfers.push_back(group.recv(b, root, tag));
  });
}

void write_across(ProcessGroup& group, Buffer b, int receiver, int tag, std::vector<std::shared_ptr<Work>>& transfers) {
  waiting_on_error(transfers, [&] {
    Request request{};
    group.recv(Buffer{&request, kRequestWords, DType::i64}, receiver, tag)->wait();
    const auto pid = static_cast<pid_t>(request.pid);
    const bool asked_for_this = request.bytes == static_cast<std::int64_t>(b.bytes());
    if (request.bytes == 0) {  // its pages are present: the transport's copy is faster
      transfers.push_back(group.send(b, receiver, tag));
      return;
    }
    const std::int64_t written =
        asked_for_this && is_the_asker(pid, request.word_address, request.word) &&
                shm::write_peer(pid, pointer_at<void>(request.address), b.data, b.bytes()).empty()
            ? 1
            : 0;
    group.send(ConstBuffer{&written, 1, DType::i64}, receiver, tag)->wait();
    if (written == 0) transfers.push_back(group.send(b, receiver, tag));
  });
}

}  // namespace lockstep::torch
