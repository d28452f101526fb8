// Which way the shm backend moves an ordinary buffer (the caller's own
// memory) in a large all-reduce or broadcast, under
// LOCKSTEP_SHM_ORDINARY_PATH=auto: through the shared slots, or by single
// copy (cross-memory attach). Neither wins everywhere: where every rank
// runs undisturbed on a core of its own, the slots' user-space copies beat
// the kernel's by 1.3-1.9x here; where ranks lose their cores to other
// work (busy neighbours, more ranks than cores, a build), single copy's two
// synchronisations per operation beat the slots' several per round by up
// to 8x (docs/performance.md). So each rank measures what each way costs
// it per byte, by size class, and votes for the cheaper; the ranks take
// the way most of them vote for.
//
// A way's cost is the least of its last kWindow measurements at that size:
// one slow operation (a preempted rank, a page fault) moves nothing, a load
// that lasts kWindow operations does. Each way is measured kFirst times
// before the votes compare them, and single copy must be cheaper by
// kMargin to win, so that noise leaves the slots, the quiet machine's
// choice, in place.
//
// Every rank must take the same way for the same operation: the votes go
// through one inline exchange, and the refreshes are decided by the count
// of such operations, the same on every rank.
//
// Pure bookkeeping; not thread-safe (the group's progress thread only).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace lockstep::shm {

class OrdinaryPaths {
 public:
  enum class Path : std::int64_t { slots = 0, single_copy = 1 };

  // Every kRefreshEvery-th choosing operation takes the slots, and the one
  // half-way between takes single copy, whatever the votes: the way not
  // taken lately is measured again, so a change in the machine's load
  // shows (at most 1/kRefreshEvery of the operations on the slower way).
  static constexpr std::uint64_t kRefreshEvery = 64;
  static constexpr std::size_t kWindow = 4;
  static constexpr std::size_t kFirst = 2;
  static constexpr double kMargin = 0.9;

  // The way choosing operation number `n` must take, or nullopt: vote.
  static std::optional<Path> forced(std::uint64_t n);

  // This rank's vote for an operation of `bytes`: at that size class, a
  // way measured fewer than kFirst times (the slots first), else single
  // copy if its cost is below kMargin times the slots'.
  Path vote(std::size_t bytes) const;
  // The ranks' choice from every rank's vote (`votes[q]`, q < n): single
  // copy only if more than half vote for it.
  static Path decide(const std::int64_t* votes, int n);
  // What an operation of `bytes` took this way (nanoseconds, this rank's
  // clock from its start to its end).
  void record(Path path, std::size_t bytes, std::int64_t nanos);

  // Sizes within a factor of 4 share a class.
  static std::size_t size_class(std::size_t bytes);
  // `path`'s cost per byte at `bytes`' class (the least of its window),
  // 0 if never measured (logs, tests).
  double cost_per_byte(Path path, std::size_t bytes) const;

 private:
  struct Measurements {
    std::array<double, kWindow> per_byte{};  // nanoseconds per byte, newest at (count - 1) % kWindow
    std::size_t count = 0;
    double least() const;
  };
  static constexpr std::size_t kClasses = 32;
  // measured_[class][path]
  std::array<std::array<Measurements, 2>, kClasses> measured_{};
};

}  // namespace lockstep::shm
