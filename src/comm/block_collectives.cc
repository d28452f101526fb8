// ProcessGroup front end of the collectives that move blocks between ranks
// without reducing them: gather, scatter, all_to_all (equal blocks or
// per-rank counts) and allgather with per-rank counts. Argument checks,
// the agreement on per-rank counts, and queueing onto the progress engine.
// Thread-safety: as ProcessGroup (process_group.h).

#include <fmt/format.h>

#include "comm/block_counts.h"
#include "comm/group_impl.h"
#include "common/enforce.h"
#include "common/format.h"

namespace lockstep {
namespace {

OpInfo block_info(Collective c, DType dtype, std::size_t count, int root = -1) {
  OpInfo info;
  info.collective = c;
  info.dtype = dtype;
  info.count = count;
  info.peer = root;
  return info;
}

// The sum of per-rank counts; counts whose sum does not fit are refused
// rather than wrapped around to something that matches the buffer.
std::size_t sum(const std::vector<std::size_t>& counts) {
  std::size_t total = 0;
  for (const std::size_t c : counts)
    LOCKSTEP_CHECK_ARG(!__builtin_add_overflow(total, c, &total),
                       "the per-rank counts add up to more than any buffer can hold; a count is wrong (an overflow, "
                       "or a length that was never set)");
  return total;
}

// Every rank shares the counts it sends and expects (an allgather of
// 2 x size words, described as the all_to_all itself so the collective
// check still compares it with what the peers run), and every rank checks
// the whole table, so all of them fail alike, naming the same pairs.
// Returns the matrix: rank r sends matrix[r * n + q] elements to rank q.
std::vector<std::size_t> agree_on_counts(Backend& backend, const OpContext& op, int rank, int n,
                                         const std::vector<std::size_t>& send, const std::vector<std::size_t>& recv) {
  const auto un = static_cast<std::size_t>(n);
  std::vector<std::uint64_t> mine(2 * un);
  for (std::size_t q = 0; q < un; ++q) {
    mine[q] = send[q];
    mine[un + q] = recv[q];
  }
  std::vector<std::uint64_t> all(2 * un * un);
  OpContext exchange = op;
  exchange.info.dtype = DType::i64;
  exchange.info.count = 2 * un;
  exchange.info.counts_digest = 0;
  backend.allgather(exchange, ConstBuffer{mine.data(), mine.size(), DType::i64},
                    Buffer{all.data(), all.size(), DType::i64});
  std::vector<std::size_t> matrix(un * un);
  std::string wrong;
  int mismatches = 0;
  for (std::size_t r = 0; r < un; ++r) {
    for (std::size_t q = 0; q < un; ++q) {
      const std::uint64_t sends = all[r * 2 * un + q];
      const std::uint64_t expects = all[q * 2 * un + un + r];
      matrix[r * un + q] = static_cast<std::size_t>(sends);
      if (sends == expects) continue;
      if (mismatches++ < 4)
        wrong += fmt::format("{}rank {} sends {} elements to rank {}, which expects {} from it", wrong.empty() ? "" : "; ",
                             r, sends, q, expects);
    }
  }
  if (mismatches > 0)
    throw MismatchError(fmt::format("rank {}/{}: {}: the split sizes do not match across ranks ({} pair{}): {}. Rank "
                                    "r's input count for rank q must equal rank q's output count for rank r",
                                    rank, n, op.description(), mismatches, mismatches == 1 ? "" : "s", wrong));
  return matrix;
}

// Blocks move between ranks while both buffers are in use: they must not
// share memory.
void check_apart(ConstBuffer input, ConstBuffer output, const char* what) {
  const auto* in = static_cast<const std::byte*>(input.data);
  const auto* out = static_cast<const std::byte*>(output.data);
  LOCKSTEP_CHECK_ARG(input.count == 0 || output.count == 0 || in + input.bytes() <= out || out + output.bytes() <= in,
                     "{}: input and output overlap; use separate buffers", what);
}

}  // namespace

std::shared_ptr<Work> ProcessGroup::gather(ConstBuffer input, Buffer output, int root) {
  check_buffer(input, "gather input");
  LOCKSTEP_CHECK_ARG(root >= 0 && root < size(), "gather: root {} is not a rank of this group of {}", root, size());
  const bool is_root = rank() == root;
  if (is_root) {
    check_buffer(output, "gather output");
    LOCKSTEP_CHECK_ARG(input.dtype == output.dtype, "gather: input is {} but output is {}", input.dtype, output.dtype);
    LOCKSTEP_CHECK_ARG(is_product(output.count, size(), input.count),
                       "gather: the root's output must hold size() x input = {} x {} elements, not {}", size(),
                       input.count, output.count);
  } else {
    output = Buffer{nullptr, 0, input.dtype};
  }
  const Route r = route(*impl_, "gather", {{"input", input}, {"output", output}});
  return submit_routed(*impl_, block_info(Collective::gather, input.dtype, input.count, root), r,
                       [input, output, root](Backend& b, const OpContext& ctx) { b.gather(ctx, input, output, root); });
}

std::shared_ptr<Work> ProcessGroup::scatter(ConstBuffer input, Buffer output, int root) {
  check_buffer(output, "scatter output");
  LOCKSTEP_CHECK_ARG(root >= 0 && root < size(), "scatter: root {} is not a rank of this group of {}", root, size());
  if (rank() == root) {
    check_buffer(input, "scatter input");
    LOCKSTEP_CHECK_ARG(input.dtype == output.dtype, "scatter: input is {} but output is {}", input.dtype, output.dtype);
    LOCKSTEP_CHECK_ARG(is_product(input.count, size(), output.count),
                       "scatter: the root's input must hold size() x output = {} x {} elements, not {}", size(),
                       output.count, input.count);
  } else {
    input = ConstBuffer{nullptr, 0, output.dtype};
  }
  const Route r = route(*impl_, "scatter", {{"input", input}, {"output", output}});
  return submit_routed(*impl_, block_info(Collective::scatter, output.dtype, output.count, root), r,
                       [input, output, root](Backend& b, const OpContext& ctx) { b.scatter(ctx, input, output, root); });
}

std::shared_ptr<Work> ProcessGroup::all_to_all(ConstBuffer input, Buffer output) {
  check_buffer(input, "all_to_all input");
  check_buffer(output, "all_to_all output");
  const auto n = static_cast<std::size_t>(size());
  LOCKSTEP_CHECK_ARG(input.dtype == output.dtype, "all_to_all: input is {} but output is {}", input.dtype, output.dtype);
  LOCKSTEP_CHECK_ARG(input.count == output.count, "all_to_all: input ({}) and output ({}) must have the same length",
                     input.count, output.count);
  LOCKSTEP_CHECK_ARG(input.count % n == 0,
                     "all_to_all: the input's {} elements do not split into {} equal blocks; pass per-rank counts",
                     input.count, n);
  check_apart(input, output, "all_to_all");
  const std::size_t block = input.count / n;
  auto counts = std::make_shared<BlockCounts>(BlockCounts::uniform(size(), rank(), block));
  const Route r = route(*impl_, "all_to_all", {{"input", input}, {"output", output}});
  return submit_routed(*impl_, block_info(Collective::all_to_all, input.dtype, block), r,
                       [input, output, counts](Backend& b, const OpContext& ctx) {
                         b.all_to_all(ctx, input, output, *counts);
                       });
}

std::shared_ptr<Work> ProcessGroup::all_to_all(ConstBuffer input, std::vector<std::size_t> input_counts, Buffer output,
                                               std::vector<std::size_t> output_counts) {
  check_buffer(input, "all_to_all input");
  check_buffer(output, "all_to_all output");
  const auto n = static_cast<std::size_t>(size());
  LOCKSTEP_CHECK_ARG(input.dtype == output.dtype, "all_to_all: input is {} but output is {}", input.dtype, output.dtype);
  LOCKSTEP_CHECK_ARG(input_counts.size() == n && output_counts.size() == n,
                     "all_to_all: need one input and one output count per rank ({}), got {} and {}", n,
                     input_counts.size(), output_counts.size());
  LOCKSTEP_CHECK_ARG(sum(input_counts) == input.count, "all_to_all: the input counts add up to {}, but the input has {} "
                     "elements", sum(input_counts), input.count);
  LOCKSTEP_CHECK_ARG(sum(output_counts) == output.count, "all_to_all: the output counts add up to {}, but the output "
                     "has {} elements", sum(output_counts), output.count);
  check_apart(input, output, "all_to_all");
  OpInfo info = block_info(Collective::all_to_all, input.dtype, input.count);
  info.counts_digest = 1;  // per-rank counts; the agreed table's digest replaces it when the operation runs
  const Route route_ = route(*impl_, "all_to_all", {{"input", input}, {"output", output}});
  // The counts are host memory: the group's own backend agrees on them.
  Backend* host = impl_->backend.get();
  const int r = rank(), world = size();
  return submit_routed(
      *impl_, info, route_,
      [host, input, output, r, world, send = std::move(input_counts), recv = std::move(output_counts)](
          Backend& b, const OpContext& ctx) {
        OpContext on_host = ctx;
        on_host.streams = nullptr;
        on_host.info.device = Device::host();
        std::vector<std::size_t> matrix = agree_on_counts(*host, on_host, r, world, send, recv);
        OpContext agreed = ctx;
        agreed.info.counts_digest = counts_digest(matrix);
        b.all_to_all(agreed, input, output, BlockCounts(world, r, std::move(matrix)));
      });
}

std::shared_ptr<Work> ProcessGroup::allgather(ConstBuffer input, Buffer output, std::vector<std::size_t> counts) {
  check_buffer(input, "allgather input");
  check_buffer(output, "allgather output");
  LOCKSTEP_CHECK_ARG(input.dtype == output.dtype, "allgather: input is {} but output is {}", input.dtype, output.dtype);
  LOCKSTEP_CHECK_ARG(counts.size() == static_cast<std::size_t>(size()),
                     "allgather: need one count per rank ({}), got {}", size(), counts.size());
  LOCKSTEP_CHECK_ARG(counts[static_cast<std::size_t>(rank())] == input.count,
                     "allgather: counts[{}] (this rank's) is {}, but the input has {} elements", rank(),
                     counts[static_cast<std::size_t>(rank())], input.count);
  LOCKSTEP_CHECK_ARG(output.count == sum(counts), "allgather: the output must hold the sum of the counts ({}), not {}",
                     sum(counts), output.count);
  OpInfo info = block_info(Collective::allgather_v, input.dtype, output.count);
  info.counts_digest = counts_digest(counts);
  const Route r = route(*impl_, "allgather", {{"input", input}, {"output", output}});
  return submit_routed(*impl_, info, r, [input, output, counts = std::move(counts)](Backend& b, const OpContext& ctx) {
    b.allgather_v(ctx, input, output, counts);
  });
}

}  // namespace lockstep
