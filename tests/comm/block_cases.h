// One case of the collectives that move blocks (gather, scatter,
// all_to_all with equal or per-rank counts, allgather with per-rank counts)
// and of premul_sum, as every rank runs it: build this rank's input, run
// the collective, check the result element by element against the
// reference. Shared by the thread-rank sweep and the mpi sweep.
// Thread-safe (no shared state).
#pragma once

#include <string>
#include <vector>

#include "lockstep/process_group.h"
#include "placement.h"
#include "reference.h"

namespace lockstep::testing {

enum class BlockCase { gather, scatter, all_to_all, all_to_all_uneven, allgather_uneven };
inline constexpr BlockCase kAllBlockCases[] = {BlockCase::gather, BlockCase::scatter, BlockCase::all_to_all,
                                               BlockCase::all_to_all_uneven, BlockCase::allgather_uneven};

inline std::string_view to_string(BlockCase c) {
  switch (c) {
    case BlockCase::gather: return "gather";
    case BlockCase::scatter: return "scatter";
    case BlockCase::all_to_all: return "all_to_all";
    case BlockCase::all_to_all_uneven: return "all_to_all_uneven";
    case BlockCase::allgather_uneven: return "allgather_uneven";
  }
  return "?";
}

// Elements rank `from` sends rank `to` in an uneven all_to_all of about
// `count` elements per rank: some pairs exchange nothing, the others
// differ by a few elements.
inline std::size_t uneven_block(int from, int to, int n, std::size_t count) {
  if (count == 0 || (from * 5 + to * 3) % 4 == 0) return 0;
  return count / static_cast<std::size_t>(n) + static_cast<std::size_t>((from + to) % 3);
}

// Rank r's count in an uneven allgather: every third rank has none.
inline std::size_t uneven_share(int r, int n, std::size_t count) {
  if (count == 0 || r % 3 == 1) return 0;
  return count / static_cast<std::size_t>(n) + static_cast<std::size_t>(r);
}

namespace detail {

// Writes elements [from_at, from_at + count) of rank q's input (input_of)
// at element to_at of `to`.
inline void copy_elements(std::vector<std::byte>& to, std::size_t to_at, int q, std::size_t from_at,
                          std::size_t count, DType dtype) {
  fill_periodic(to.data() + to_at * dtype_size(dtype), count, dtype_size(dtype), [&](std::size_t i) {
    store_value(to.data(), dtype, to_at + i, input_value(q, from_at + i, ReduceOp::sum));
  });
}

// An output of `count` elements preset to a pattern no input has, plus a
// guard byte past the end.
inline std::vector<std::byte> poisoned(std::size_t count, std::size_t elem) {
  return std::vector<std::byte>(count * elem + 1, std::byte{0x5a});
}

// Inputs depend on the rank and the index, so a block in the wrong place
// or from the wrong rank shows.
inline std::vector<std::byte> input_of(int r, std::size_t count, DType dtype) {
  return make_input(r, count, dtype, ReduceOp::sum);
}

}  // namespace detail

// Returns "" if this rank's result is right, else what is wrong. For
// gather and scatter `count` is each rank's block; for all_to_all about
// each rank's total; for the uneven allgather, about the total. The
// collective's buffers are where `at` puts them (host memory by default).
inline std::string run_block_case(ProcessGroup& pg, BlockCase c, std::size_t count, DType dtype, int root,
                                  Placement&& at = HostPlacement()) {
  using detail::copy_elements;
  const int n = pg.size();
  const int r = pg.rank();
  const auto un = static_cast<std::size_t>(n);
  const std::size_t elem = dtype_size(dtype);
  std::vector<std::byte> got, want;
  std::size_t check_count = 0;
  switch (c) {
    case BlockCase::gather: {
      const auto input = detail::input_of(r, count, dtype);
      const bool is_root = r == root;
      got = detail::poisoned(is_root ? count * un : 0, elem);
      at.finish(*pg.gather(at.place_input(input, count, dtype), at.place(got, is_root ? count * un : 0, dtype), root));
      want = got;
      if (is_root)
        for (int q = 0; q < n; ++q) copy_elements(want, static_cast<std::size_t>(q) * count, q, 0, count, dtype);
      check_count = got.size() / elem;
      want.back() = std::byte{0x5a};
      break;
    }
    case BlockCase::scatter: {
      // The root's input: block q is rank q's part of a buffer the root made.
      const auto input = r == root ? detail::input_of(root, count * un, dtype) : std::vector<std::byte>(1);
      got = detail::poisoned(count, elem);
      at.finish(*pg.scatter(at.place_input(input, r == root ? count * un : 0, dtype), at.place(got, count, dtype), root));
      want = got;
      copy_elements(want, 0, root, static_cast<std::size_t>(r) * count, count, dtype);
      check_count = count;
      break;
    }
    case BlockCase::all_to_all: {
      const std::size_t block = (count + un - 1) / un;
      const auto input = detail::input_of(r, block * un, dtype);
      got = detail::poisoned(block * un, elem);
      at.finish(*pg.all_to_all(at.place_input(input, block * un, dtype), at.place(got, block * un, dtype)));
      want = got;
      for (int q = 0; q < n; ++q)
        copy_elements(want, static_cast<std::size_t>(q) * block, q, static_cast<std::size_t>(r) * block, block, dtype);
      check_count = block * un;
      break;
    }
    case BlockCase::all_to_all_uneven: {
      std::vector<std::size_t> sends(un), recvs(un);
      for (int q = 0; q < n; ++q) {
        sends[static_cast<std::size_t>(q)] = uneven_block(r, q, n, count);
        recvs[static_cast<std::size_t>(q)] = uneven_block(q, r, n, count);
      }
      std::size_t send_total = 0, recv_total = 0;
      for (std::size_t q = 0; q < un; ++q) send_total += sends[q], recv_total += recvs[q];
      const auto input = detail::input_of(r, send_total, dtype);
      got = detail::poisoned(recv_total, elem);
      at.finish(*pg.all_to_all(at.place_input(input, send_total, dtype), sends, at.place(got, recv_total, dtype), recvs));
      want = got;
      std::size_t at = 0;
      for (int q = 0; q < n; ++q) {
        // Where rank q's block for this rank starts in q's input.
        std::size_t from = 0;
        for (int p = 0; p < r; ++p) from += uneven_block(q, p, n, count);
        const std::size_t len = uneven_block(q, r, n, count);
        copy_elements(want, at, q, from, len, dtype);
        at += len;
      }
      check_count = recv_total;
      break;
    }
    case BlockCase::allgather_uneven: {
      std::vector<std::size_t> counts(un);
      std::size_t total = 0;
      for (int q = 0; q < n; ++q) total += counts[static_cast<std::size_t>(q)] = uneven_share(q, n, count);
      const std::size_t mine = counts[static_cast<std::size_t>(r)];
      const auto input = detail::input_of(r, mine, dtype);
      got = detail::poisoned(total, elem);
      at.finish(*pg.allgather(at.place_input(input, mine, dtype), at.place(got, total, dtype), counts));
      want = got;
      std::size_t at = 0;
      for (int q = 0; q < n; ++q) {
        const std::size_t len = counts[static_cast<std::size_t>(q)];
        copy_elements(want, at, q, 0, len, dtype);
        at += len;
      }
      check_count = total;
      break;
    }
  }
  std::string diff = compare_elements(got.data(), want.data(), check_count, dtype);
  if (diff.empty() && got.back() != std::byte{0x5a}) diff = "wrote past the end of the output";
  if (diff.empty()) return "";
  return fmt::format("rank {}/{}: {} of {} x {} root {}: {}", r, n, to_string(c), dtype, count, root, diff);
}

// premul_sum (floating types): every rank's input multiplied by 0.5, then
// summed, through allreduce (in and out of place), reduce and
// reduce_scatter. The inputs are small integers, so the halves and their
// sums are exact in every floating type. Returns "" or what is wrong.
inline std::string run_premul_case(ProcessGroup& pg, Collective c, std::size_t count, DType dtype, int root) {
  const int n = pg.size();
  const int r = pg.rank();
  const std::size_t elem = dtype_size(dtype);
  const Reduction half = Reduction::premul_sum(0.5);
  const auto expected = [&](std::size_t pos, std::size_t index, std::vector<std::byte>& into) {
    store_expected_at(into.data(), dtype, pos, index, n, ReduceOp::sum);
    store_value(into.data(), dtype, pos, load_value(into.data(), dtype, pos) * 0.5);
  };
  std::vector<std::byte> got, want;
  std::size_t check_count = count;
  switch (c) {
    case Collective::allreduce: {
      // In place on even ranks, out of place (input unchanged) on odd ones.
      const auto input = make_input(r, count, dtype, ReduceOp::sum);
      got = r % 2 == 0 ? input : std::vector<std::byte>(input.size());
      if (r % 2 == 0)
        pg.allreduce(Buffer{got.data(), count, dtype}, half)->wait();
      else
        pg.allreduce(ConstBuffer{input.data(), count, dtype}, Buffer{got.data(), count, dtype}, half)->wait();
      if (input != make_input(r, count, dtype, ReduceOp::sum)) return fmt::format("rank {}: the input changed", r);
      want.resize(got.size());
      fill_periodic(want.data(), count, elem, [&](std::size_t i) { expected(i, i, want); });
      break;
    }
    case Collective::reduce: {
      got = make_input(r, count, dtype, ReduceOp::sum);
      pg.reduce(Buffer{got.data(), count, dtype}, root, half)->wait();
      want = make_input(r, count, dtype, ReduceOp::sum);  // non-roots keep their input
      if (r == root) fill_periodic(want.data(), count, elem, [&](std::size_t i) { expected(i, i, want); });
      break;
    }
    case Collective::reduce_scatter: {
      const std::size_t total = count * static_cast<std::size_t>(n);
      const auto input = make_input(r, total, dtype, ReduceOp::sum);
      got.assign(count * elem + 1, std::byte{0x5a});
      pg.reduce_scatter(ConstBuffer{input.data(), total, dtype}, Buffer{got.data(), count, dtype}, half)->wait();
      want.assign(got.size(), std::byte{0x5a});
      fill_periodic(want.data(), count, elem,
                    [&](std::size_t i) { expected(i, static_cast<std::size_t>(r) * count + i, want); });
      break;
    }
    default:
      return "premul_sum is not a reduction of this collective";
  }
  std::string diff = compare_elements(got.data(), want.data(), check_count, dtype);
  if (diff.empty()) return "";
  return fmt::format("rank {}/{}: {} premul_sum of {} x {} root {}: {}", r, n, c, dtype, count, root, diff);
}

}  // namespace lockstep::testing
