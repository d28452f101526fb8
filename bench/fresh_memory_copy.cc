// How fast a copy fills memory new to the process, against memory it
// touched before: what bounds a replacement's feeding, which receives its
// optimizer state into tensors it has just made (docs/performance.md,
// "Feeding a replacement: fresh memory"). Each try maps --bytes anew and
// copies a touched source into it, seven ways:
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
//             out where the system refuses it (a seccomp filter);
//   written   fresh, filled by another process (process_vm_writev, a
//             sender writing into a receiver's tensors: the faults are
//             taken on the sender's core) while this one makes the pages
//             present from the last MiB back until they meet; left out
//             with read.
// Prints each way's time per try, then one line of JSON with the least.
//
// Usage: fresh_memory_copy [--bytes 70M] [--tries 5]
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
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

constexpr std::size_t kChunk = std::size_t{1} << 20;

// A child process that writes its copy of the source into this process's
// memory on request, a MiB at a time, saying how far it has come in
// memory both share (the front), so that this process stops making pages
// present where the writer has been.
class Writer {
 public:
  Writer(const char* source, std::size_t bytes) {
    front_ = static_cast<std::atomic<std::size_t>*>(
        ::mmap(nullptr, sizeof(*front_), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if (front_ == MAP_FAILED || ::pipe(ask_) != 0 || ::pipe(done_) != 0) throw std::runtime_error("writer setup failed");
    const pid_t parent = ::getpid();
    child_ = ::fork();
    if (child_ < 0) throw std::runtime_error("fork failed");
    if (child_ == 0) serve(parent, source, bytes);  // never returns
    ::close(ask_[0]);
    ::close(done_[1]);
  }
  ~Writer() {
    ::close(ask_[1]);
    ::waitpid(child_, nullptr, 0);
  }
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Starts the write into `target`; the front is 0 until it moves.
  void start(char* target) {
    front_->store(0);
    if (::write(ask_[1], &target, sizeof(target)) != sizeof(target)) throw std::runtime_error("writer gone");
  }
  std::size_t front() const { return front_->load(std::memory_order_relaxed); }
  void wait() {
    char ok = 0;
    if (::read(done_[0], &ok, 1) != 1 || ok != 1) throw std::runtime_error("process_vm_writev failed");
  }

 private:
  [[noreturn]] void serve(pid_t parent, const char* source, std::size_t bytes) {
    ::close(ask_[1]);  // else the parent's close would not end the loop below
    ::close(done_[0]);
    char* target = nullptr;
    while (::read(ask_[0], &target, sizeof(target)) == sizeof(target)) {
      char ok = 1;
      for (std::size_t at = 0; at < bytes && ok; at += kChunk) {
        const std::size_t n = std::min(kChunk, bytes - at);
        iovec from{const_cast<char*>(source + at), n};
        iovec to{target + at, n};
        ok = ::process_vm_writev(parent, &from, 1, &to, 1, 0) == static_cast<ssize_t>(n);
        if (!ok) std::perror("process_vm_writev");
        front_->store(at + n);
      }
      if (::write(done_[1], &ok, 1) != 1) break;
    }
    ::_exit(0);
  }

  std::atomic<std::size_t>* front_;
  int ask_[2];
  int done_[2];
  pid_t child_;
};

double copy_ms(const std::string& way, const char* source, std::size_t bytes, Writer* writer) {
  Mapping target(bytes);
  if (way == "touched") std::memset(target.data(), 0, bytes);
  const auto start = Clock::now();
  if (way == "present") ::madvise(target.data(), bytes, MADV_POPULATE_WRITE);
  if (way == "huge") ::madvise(target.data(), bytes, MADV_HUGEPAGE);
  std::thread helper;
  if (way == "helped")
    helper = std::thread([&] {
      for (std::size_t end = bytes; end > 0;) {
        const std::size_t begin = end > kChunk ? end - kChunk : 0;
        ::madvise(target.data() + begin, end - begin, MADV_POPULATE_WRITE);
        end = begin;
      }
    });
  if (way == "written") {
    writer->start(target.data());
    for (std::size_t end = bytes; end > writer->front() + kChunk;) {
      const std::size_t begin = end > kChunk ? end - kChunk : 0;
      ::madvise(target.data() + begin, end - begin, MADV_POPULATE_WRITE);
      end = begin;
    }
    writer->wait();
  } else if (way == "read") {
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
  std::vector<std::string> ways{"touched", "fresh", "present", "huge", "helped", "read", "written"};
  char probe = 0;
  std::unique_ptr<Writer> writer;
  if (read_from_self(&probe, source.data(), 1)) {
    writer = std::make_unique<Writer>(source.data(), bytes);
  } else {
    std::printf("read and written left out: cross-memory attach is refused here\n");
    ways.resize(ways.size() - 2);
  }
  std::map<std::string, std::vector<double>> times;
  for (int t = 0; t < tries; ++t)
    for (const auto& way : ways) times[way].push_back(copy_ms(way, source.data(), bytes, writer.get()));
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
