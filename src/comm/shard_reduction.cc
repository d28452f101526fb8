// ProcessGroup::reduce_shards: the reduction over logical shards whose
// result does not depend on which rank holds which shard
// (docs/faults.md, "Logical shards"). One operation on the progress
// thread:
//   1. an all_to_all in which every rank sends the owner of each n-th of
//      the elements (rank j owns chunk j) its held shards' pieces of it, in
//      ascending shard order;
//   2. each owner reduces its chunk from every shard's piece, in shard order
//      0..total-1, in one reduce_many (a left fold; avg divides by total);
//   3. an allgather of the reduced chunks into every rank's output.
// Each element is combined in the same order with the same kernel whoever
// held its shards, so the bits are the same in any group.
//
// Where each rank holds exactly its own shard on the shm backend, its
// all-reduce already folds every element over the ranks in rank order with
// the same kernel (shm_backend.h), so that runs instead: the same bits,
// without the packing or the extra exchange.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/block_counts.h"
#include "comm/chunks.h"
#include "comm/group_impl.h"
#include "comm/reduce_kernels.h"
#include "comm/shard_map.h"
#include "common/enforce.h"
#include "common/format.h"

namespace lockstep {
namespace {

// Steps 1-3 above, on backend `b`.
void reduce_shards_by_exchange(Backend& b, const OpContext& ctx, const std::vector<ConstBuffer>& held,
                               const std::vector<int>& holder, Buffer output, ReduceOp op, int rank, int size) {
  const DType dtype = output.dtype;
  const std::size_t elem = dtype_size(dtype);
  const int total = static_cast<int>(holder.size());
  const Chunks chunks(output.count, size);
  const std::vector<std::size_t> held_by = shards_per_rank(holder, size);

  // 1. matrix[r * size + q]: what rank r sends rank q, its shards' pieces of chunk q.
  std::vector<std::size_t> matrix(static_cast<std::size_t>(size) * static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r)
    for (int q = 0; q < size; ++q)
      matrix[static_cast<std::size_t>(r * size + q)] = held_by[static_cast<std::size_t>(r)] * chunks.size(q);
  std::vector<std::byte> send(static_cast<std::size_t>(held.size()) * output.count * elem);
  std::byte* at = send.data();
  for (int q = 0; q < size; ++q)
    for (const ConstBuffer& shard : held) {
      std::memcpy(at, static_cast<const std::byte*>(shard.data) + chunks.begin(q) * elem, chunks.size(q) * elem);
      at += chunks.size(q) * elem;
    }
  const std::size_t mine = chunks.size(rank);
  std::vector<std::byte> received(static_cast<std::size_t>(total) * mine * elem);
  OpContext exchange = ctx;
  exchange.info.collective = Collective::all_to_all;
  exchange.info.count = send.size() / elem;
  exchange.info.counts_digest = counts_digest(matrix);
  b.all_to_all(exchange, ConstBuffer{send.data(), send.size() / elem, dtype},
               Buffer{received.data(), received.size() / elem, dtype}, BlockCounts(size, rank, matrix));

  // 2. Rank q's pieces arrive in rank order, each rank's in its shard order:
  // shard s is piece number (shards held by ranks before its holder) +
  // (its place among its holder's).
  std::vector<const void*> sources(static_cast<std::size_t>(total));
  std::vector<std::size_t> seen(static_cast<std::size_t>(size), 0);
  const std::vector<std::size_t> first = first_shard_of_rank(held_by);
  for (int s = 0; s < total; ++s) {
    const auto q = static_cast<std::size_t>(holder[static_cast<std::size_t>(s)]);
    sources[static_cast<std::size_t>(s)] = received.data() + (first[q] + seen[q]++) * mine * elem;
  }
  std::vector<std::byte> reduced(mine * elem);
  if (mine > 0) reduce_many(reduced.data(), sources.data(), total, mine, dtype, op);

  // 3. Every owner's chunk, in chunk (= rank) order, into every output.
  std::vector<std::size_t> counts(static_cast<std::size_t>(size));
  for (int q = 0; q < size; ++q) counts[static_cast<std::size_t>(q)] = chunks.size(q);
  OpContext gather = ctx;
  gather.info.collective = Collective::allgather_v;
  gather.info.count = output.count;
  gather.info.counts_digest = counts_digest(counts);
  b.allgather_v(gather, ConstBuffer{reduced.data(), mine, dtype}, output, counts);
}

}  // namespace

void check_shard_map(const char* op, const std::vector<int>& holder, int size, int rank, std::size_t passed) {
  LOCKSTEP_CHECK_ARG(!holder.empty(), "{}: the shard map is empty (one holder per logical shard)", op);
  for (std::size_t s = 0; s < holder.size(); ++s)
    LOCKSTEP_CHECK_ARG(holder[s] >= 0 && holder[s] < size,
                       "{}: shard {} is held by rank {}, which is not a rank of this group of {}", op, s, holder[s],
                       size);
  const std::vector<int> mine = shards_held(holder, rank);
  LOCKSTEP_CHECK_ARG(passed == mine.size(), "{}: rank {} holds {} shard(s) by the map ({}) but passed {} buffer(s)",
                     op, rank, mine.size(), fmt::join(mine, ", "), passed);
}

void check_fold_over_shards(const char* op, ReduceOp reduction) {
  LOCKSTEP_CHECK_ARG(reduction == ReduceOp::sum || reduction == ReduceOp::avg || reduction == ReduceOp::min ||
                         reduction == ReduceOp::max || reduction == ReduceOp::prod,
                     "{}: {} is not supported (sum, avg, min, max, prod)", op, reduction);
}

std::shared_ptr<Work> ProcessGroup::reduce_shards(std::vector<ConstBuffer> held, std::vector<int> holder, Buffer output,
                                                  Reduction op) {
  check_buffer(output, "reduce_shards output");
  check_shard_map("reduce_shards", holder, size(), rank(), held.size());
  for (const ConstBuffer& b : held) {
    check_buffer(b, "reduce_shards input");
    LOCKSTEP_CHECK_ARG(b.dtype == output.dtype && b.count == output.count,
                       "reduce_shards: every shard is {} x {} like the output, not {} x {}", output.dtype,
                       output.count, b.dtype, b.count);
    LOCKSTEP_CHECK_ARG(b.device == Device::host() && output.device == Device::host(),
                       "reduce_shards: host memory only (a shard's gradients staged on the host)");
  }
  check_fold_over_shards("reduce_shards", op.op);
  const Route r = route(*impl_, "reduce_shards", {{"output", output}});
  OpInfo info;
  info.collective = Collective::allreduce;
  info.dtype = output.dtype;
  info.count = output.count;
  info.op = op.op;
  info.counts_digest = holders_digest(holder);
  const ReduceOp kernel_op = op.op;
  const int me = rank(), n = size();
  const bool own_shards_on_shm = backend() == "shm" && each_rank_holds_its_own(holder, n);
  return submit_routed(*impl_, info, r,
                       [held = std::move(held), holder = std::move(holder), output, kernel_op, me, n,
                        own_shards_on_shm](Backend& b, const OpContext& ctx) {
                         if (output.count == 0) return;
                         if (n == 1) {  // every shard here, in shard order
                           std::vector<const void*> sources;
                           for (const ConstBuffer& shard : held) sources.push_back(shard.data);
                           reduce_many(output.data, sources.data(), static_cast<int>(sources.size()), output.count,
                                       output.dtype, kernel_op);
                           return;
                         }
                         if (own_shards_on_shm) {
                           OpContext plain = ctx;
                           plain.info.counts_digest = 0;
                           return b.allreduce_into(plain, held[0], output, kernel_op);
                         }
                         reduce_shards_by_exchange(b, ctx, held, holder, output, kernel_op, me, n);
                       });
}

}  // namespace lockstep
