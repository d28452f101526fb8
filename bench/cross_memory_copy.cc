// How fast the kernel copies another process's memory (process_vm_readv,
// what the shm backend's single copy uses) against memcpy of the same
// pages: a child process reads its parent's buffer in chunks into a small
// buffer (the cache-sized scratch of the single-copy all-reduce), and
// straight into a buffer as large as the source, and copies its own copy
// of the same pages with memcpy. The least time of --tries, one line of
// JSON. docs/performance.md ("Ordinary buffers without adoption") explains
// what the ratio decides.
//
// Usage: cross_memory_copy [--bytes 48M] [--chunk 256K] [--tries 5]
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include <CLI/CLI.hpp>

namespace {

using Clock = std::chrono::steady_clock;

double fastest_ms(int tries, const std::function<void()>& run) {
  double best = 1e300;
  for (int t = 0; t < tries; ++t) {
    const auto start = Clock::now();
    run();
    best = std::min(best, std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  return best;
}

// Reads [remote, remote + bytes) of `pid` into `local`, `chunk` bytes at a
// time, each chunk to local + (offset % local_bytes).
void read_in_chunks(pid_t pid, char* local, std::size_t local_bytes, const char* remote, std::size_t bytes,
                    std::size_t chunk) {
  for (std::size_t at = 0; at < bytes; at += chunk) {
    const std::size_t n = std::min(chunk, bytes - at);
    iovec mine{local + at % local_bytes, n};
    iovec theirs{const_cast<char*>(remote) + at, n};
    if (::process_vm_readv(pid, &mine, 1, &theirs, 1, 0) != static_cast<ssize_t>(n)) {
      std::perror("process_vm_readv");
      std::exit(1);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"process_vm_readv against memcpy"};
  std::size_t bytes = 48 << 20, chunk = 256 << 10;
  int tries = 5;
  app.add_option("--bytes", bytes, "Bytes to copy")->transform(CLI::AsSizeValue(false));
  app.add_option("--chunk", chunk, "Bytes per process_vm_readv call")->transform(CLI::AsSizeValue(false));
  app.add_option("--tries", tries, "Runs of each; the fastest counts")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  chunk = std::max<std::size_t>(4096, std::min(chunk, bytes));

  std::vector<char> source(bytes, 1);  // touched: the pages exist before the child reads them
  const pid_t parent = ::getpid();
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child == 0) {
    std::vector<char> scratch(chunk), whole(bytes, 0);
    const double to_scratch = fastest_ms(tries, [&] { read_in_chunks(parent, scratch.data(), chunk, source.data(), bytes, chunk); });
    const double to_whole = fastest_ms(tries, [&] { read_in_chunks(parent, whole.data(), bytes, source.data(), bytes, chunk); });
    // The child's own view of the same pages (shared until written): memcpy.
    const double by_memcpy = fastest_ms(tries, [&] { std::memcpy(whole.data(), source.data(), bytes); });
    const auto gbps = [&](double ms) { return static_cast<double>(bytes) / ms / 1e6; };
    std::printf("{\"bytes\": %zu, \"chunk\": %zu, \"readv_to_scratch_gbps\": %.2f, \"readv_to_buffer_gbps\": %.2f, "
                "\"memcpy_gbps\": %.2f}\n",
                bytes, chunk, gbps(to_scratch), gbps(to_whole), gbps(by_memcpy));
    std::fflush(stdout);
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
