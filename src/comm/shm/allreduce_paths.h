// Which way the shm backend all-reduces an ordinary buffer larger than
// one-shot (LOCKSTEP_SHM_SINGLE_COPY_ALLREDUCE=auto): through the shared
// slots, or by single copy (cross-memory attach). Neither wins everywhere:
// where every rank runs undisturbed on a core of its own the slots' user
// copies beat the kernel's by 1.3-1.9x here, and where ranks lose their
// cores to other work (busy neighbours, more ranks than cores, a build),
// single copy's two synchronisations per operation beat the slots' three
// per round by up to 8x (docs/performance.md). So each rank measures what
// each way costs it per byte, by size class, and votes for the cheaper;
// the ranks take the way most of them vote for.
//
// Every rank must take the same way for the same operation: the votes go
// through one inline exchange, and the refreshes are decided by the count
// of such operations, which is the same on every rank.
//
// Pure bookkeeping; not thread-safe (the group's progress thread only).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace lockstep::shm {

class AllreducePaths {
 public:
  enum class Path : std::int64_t { slots = 0, single_copy = 1 };

  // Every kRefreshEvery-th choosing operation takes the slots, and the one
  // half-way between takes single copy, whatever the votes: the way not
  // taken lately is measured again, so a change in the machine's load
  // shows (at most 1/kRefreshEvery of the operations on the slower way).
  static constexpr std::uint64_t kRefreshEvery = 64;
  // The way choosing operation number `n` must take, or nullopt: vote.
  static std::optional<Path> forced(std::uint64_t n);

  // This rank's vote for an operation of `bytes`: at that size class, a
  // way not yet measured (the slots first), else the cheaper per byte.
  Path vote(std::size_t bytes) const;
  // The ranks' choice from every rank's vote (`votes[q]`, q < n): single
  // copy only if more than half vote for it.
  static Path decide(const std::int64_t* votes, int n);
  // What an operation of `bytes` took this way (nanoseconds, this rank's
  // clock from its start to its end).
  void record(Path path, std::size_t bytes, std::int64_t nanos);

  // Sizes within a factor of 4 share a class.
  static std::size_t size_class(std::size_t bytes);
  // The smoothed cost per byte of `path` at `bytes`' class, 0 if never
  // measured (logs, tests).
  double cost_per_byte(Path path, std::size_t bytes) const;

 private:
  static constexpr std::size_t kClasses = 32;
  static constexpr double kWeight = 0.25;  // of the newest measurement
  // cost_[class][path]: nanoseconds per byte, smoothed; 0: not measured.
  std::array<std::array<double, 2>, kClasses> cost_{};
};

}  // namespace lockstep::shm
