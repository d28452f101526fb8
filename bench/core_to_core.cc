// How fast data moves between two cores, the way the shm backend's slots
// move it: two threads pinned to two CPUs hand a cache line back and forth
// (round trip), and one writes a slot's worth of data that the other then
// copies out (hand-over rate), with ordinary stores and with the streaming
// stores of src/comm/shm/handoff_copy.h.
//
// A virtual machine's host may place its vCPUs on cores that share a die or
// on cores that do not, and move them while a job runs; this tells which
// placement the machine is in now (docs/performance.md, "The ordinary
// path's slow mode"). One line of JSON per run.
//
// Usage: core_to_core [--cpus 0,1] [--bytes 131072] [--rounds 2000]
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "comm/shm/handoff_copy.h"

namespace {

using Clock = std::chrono::steady_clock;

// A flag alone on its lines (the adjacent-line prefetcher takes pairs), so
// that only the hand-over moves them, not a neighbour on the stack.
struct alignas(128) Flag {
  std::atomic<long> value{0};
  char padding[128 - sizeof(std::atomic<long>)];
};

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0)
    throw std::runtime_error("cannot pin a thread to CPU " + std::to_string(cpu) + " (is it in this process's mask?)");
}

// Runs `rounds` turns between two threads pinned to `first` and `second`:
// on its turn the first does `first_work` and passes the turn (an odd
// number in one cache line), the second does `second_work` and passes it
// back (the next even one). Returns the seconds the turns took.
template <class FirstWork, class SecondWork>
double take_turns(int first, int second, long rounds, FirstWork first_work, SecondWork second_work) {
  const auto flag = std::make_unique<Flag>();
  std::atomic<long>& turn = flag->value;
  std::thread answerer([&] {
    pin_to(second);
    for (long i = 1; i <= rounds; ++i) {
      while (turn.load(std::memory_order_acquire) != 2 * i - 1) {
      }
      second_work();
      turn.store(2 * i, std::memory_order_release);
    }
  });
  pin_to(first);
  const auto start = Clock::now();
  for (long i = 1; i <= rounds; ++i) {
    first_work();
    turn.store(2 * i - 1, std::memory_order_release);
    while (turn.load(std::memory_order_acquire) != 2 * i) {
    }
  }
  const auto end = Clock::now();
  answerer.join();
  return std::chrono::duration<double>(end - start).count();
}

// Nanoseconds for a line to go to the other core and back: turns with no work.
double round_trip_nanos(int first, int second, long rounds) {
  return take_turns(first, second, rounds, [] {}, [] {}) * 1e9 / static_cast<double>(rounds);
}

// GB/s of slot bytes handed over: the first thread copies `bytes` from its
// buffer into the slot (streaming stores from `streaming_from` bytes on, 0:
// never), the second copies the slot out, then the next round begins.
double hand_over_rate(int first, int second, std::size_t bytes, long rounds, std::size_t streaming_from) {
  std::vector<unsigned char> source(bytes, 1), slot(bytes, 0), destination(bytes, 0);
  const double seconds = take_turns(
      first, second, rounds,
      [&] { lockstep::shm::copy_for_peer(slot.data(), source.data(), bytes, streaming_from); },
      [&] { std::memcpy(destination.data(), slot.data(), bytes); });
  return static_cast<double>(bytes) * static_cast<double>(rounds) / seconds / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"How fast a cache line and a slot's worth of data move between two cores"};
  std::vector<int> cpus = {0, 1};
  std::size_t bytes = 128 * 1024;  // the shm backend's chunk
  int rounds = 2000;
  app.add_option("--cpus", cpus, "the two CPUs")->delimiter(',')->expected(2);
  app.add_option("--bytes", bytes, "bytes handed over per round")->check(CLI::Range(std::size_t{64}, std::size_t{1} << 30));
  app.add_option("--rounds", rounds, "rounds per measurement")->check(CLI::Range(1, 100'000'000));
  CLI11_PARSE(app, argc, argv);
  try {
    const double trip = round_trip_nanos(cpus[0], cpus[1], rounds * 100L);
    const double ordinary = hand_over_rate(cpus[0], cpus[1], bytes, rounds, 0);
    const double streaming = hand_over_rate(cpus[0], cpus[1], bytes, rounds, 1);
    std::printf(
        "{\"cpus\": [%d, %d], \"round_trip_ns\": %.1f, \"bytes\": %zu, \"hand_over_gbps\": %.2f, "
        "\"hand_over_streaming_gbps\": %.2f}\n",
        cpus[0], cpus[1], trip, bytes, ordinary, streaming);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "core_to_core: %s\n", e.what());
    return 1;
  }
  return 0;
}
