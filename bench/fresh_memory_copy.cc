// How fast a copy fills memory new to the process, against memory it
// touched before: what bounds a replacement's feeding, which receives its
// optimizer state into tensors it has just made (docs/performance.md,
// "Feeding a replacement: fresh memory"). Each try maps --bytes anew and
// copies a touched source into it, six ways:
//   touched   into a mapping written once before (as a model's parameters);
//   fresh     into a new mapping: each 4 KiB page faults in as the copy
//             first writes it;
//   present   made present first in one call (MADV_POPULATE_WRITE, Linux
//             5.14), the time of that call counted;
//   huge      advised to take transparent huge pages (MADV_HUGEPAGE);
//   helped    fresh, while a second thread makes its pages present, last
//             MiB first (a second core taking half the faults);
//   read      fresh, filled by cross-memory attach (process_vm_readv, as a
//             single-copy receive would), from this process itself; left
//             out where the system refuses it (a seccomp filter).
// Prints each way's time per try, then one line of JSON with the least.
//
// Usage: fresh_memory_copy [--bytes 70M] [--tries 5]
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kHugePage = std::size_t{2} << 20;

// A private anonymous mapping with a 2 MiB-aligned span of `bytes` in it.
class Mapping {
 public:
  explicit Mapping(std::size_t bytes) : length_(bytes + kHugePage) {
    base_ = ::mmap(nullptr, length_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base_ == MAP_FAILED) throw std::runtime_error("mmap failed");
    const auto start = (reinterpret_cast<std::uintptr_t>(base_) + kHugePage - 1) / kHugePage * kHugePage;
    aligned_ = reinterpret_cast<char*>(start);
  }
  ~Mapping() { ::munmap(base_, length_); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  char* data() const { return aligned_; }

 private:
  std::size_t length_;
  void* base_;
  char* aligned_;
};

// Copies by cross-memory attach from this process to itself; false where
// the system refuses it.
bool read_from_self(char* local, const char* remote, std::size_t bytes) {
  iovec to{local, bytes};
  iovec from{const_cast<char*>(remote), bytes};
  return ::process_vm_readv(::getpid(), &to, 1, &from, 1, 0) == static_cast<ssize_t>(bytes);
}

double copy_ms(const std::string& way, const char* source, std::size_t bytes) {
  Mapping target(bytes);
  if (way == "touched") std::memset(target.data(), 0, bytes);
  const auto start = Clock::now();
  if (way == "present") ::madvise(target.data(), bytes, MADV_POPULATE_WRITE);
  if (way == "huge") ::madvise(target.data(), bytes, MADV_HUGEPAGE);
  std::thread helper;
  if (way == "helped")
    helper = std::thread([&] {
      constexpr std::size_t kChunk = std::size_t{1} << 20;
      for (std::size_t end = bytes; end > 0;) {
        const std::size_t begin = end > kChunk ? end - kChunk : 0;
        ::madvise(target.data() + begin, end - begin, MADV_POPULATE_WRITE);
        end = begin;
      }
    });
  if (way == "read") {
    if (!read_from_self(target.data(), source, bytes)) throw std::runtime_error("process_vm_readv failed");
  } else {
    std::memcpy(target.data(), source, bytes);
  }
  if (helper.joinable()) helper.join();
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"How fast a copy fills memory new to the process"};
  std::size_t bytes = 70u << 20;
  int tries = 5;
  app.add_option("--bytes", bytes, "Bytes to copy")->transform(CLI::AsSizeValue(false));
  app.add_option("--tries", tries, "Tries of each way, interleaved")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  std::vector<char> source(bytes, 1);
  std::vector<std::string> ways{"touched", "fresh", "present", "huge", "helped", "read"};
  char probe = 0;
  if (!read_from_self(&probe, source.data(), 1)) {
    std::printf("read     left out: process_vm_readv is refused here\n");
    ways.pop_back();
  }
  std::map<std::string, std::vector<double>> times;
  for (int t = 0; t < tries; ++t)
    for (const auto& way : ways) times[way].push_back(copy_ms(way, source.data(), bytes));
  std::string json = "{\"bytes\": " + std::to_string(bytes);
  for (const auto& way : ways) {
    std::printf("%-8s", way.c_str());
    for (double ms : times[way]) std::printf(" %8.1f ms (%5.2f GB/s)", ms, static_cast<double>(bytes) / ms / 1e6);
    std::printf("\n");
    const double least = *std::min_element(times[way].begin(), times[way].end());
    json += ", \"" + way + "_gbps\": " + std::to_string(static_cast<double>(bytes) / least / 1e6);
  }
  std::printf("%s}\n", json.c_str());
  return 0;
}
