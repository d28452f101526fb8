// ProcessGroup::allgather_shards and reduce_scatter_shards: a sharded
// step's all-gather and reduce-scatter over logical shards, whose results
// do not depend on which rank holds which shard (docs/faults.md, "Logical
// shards"). A job that lost ranks gives their shards to survivors, which
// then hold several; the blocks still belong to shards, and each element
// is still combined in shard order by the same kernel, so the bits are a
// full group's.
//
// allgather_shards: one allgather_v of each rank's blocks, end to end in
// rank order, then put in shard order (no copy where the two agree: each
// rank's shards consecutive, as a clean job's are).
//
// reduce_scatter_shards: an all_to_all in which every rank sends the holder
// of each block its shards' pieces of that block (shard q's block from each
// of its inputs); each holder folds each of its blocks from every shard's
// piece in shard order, in one reduce_many. Where each rank holds its own
// shard on the shm backend, its reduce_scatter already folds every element
// over the ranks in rank order with the same kernel (shm_backend.h), so
// that runs instead.
#include <cstring>

#include <fmt/format.h>

#include "comm/block_counts.h"
#include "comm/group_impl.h"
#include "comm/reduce_kernels.h"
#include "comm/shard_map.h"
#include "common/enforce.h"
#include "common/format.h"

namespace lockstep {
namespace {

using Bytes = std::vector<std::byte>;

const std::byte* bytes_of(const ConstBuffer& b) { return static_cast<const std::byte*>(b.data); }

// Whether the shards lie in rank order: every rank's consecutive, lower
// ranks' first. Then rank order is shard order.
bool shards_in_rank_order(const std::vector<int>& holder) {
  for (std::size_t s = 1; s < holder.size(); ++s)
    if (holder[s] < holder[s - 1]) return false;
  return true;
}

void allgather_shards_by_exchange(Backend& b, const OpContext& ctx, const std::vector<ConstBuffer>& held,
                                  const std::vector<int>& holder, Buffer output, int size) {
  const std::size_t block = output.count / holder.size();
  const std::size_t block_bytes = block * dtype_size(output.dtype);
  const std::vector<std::size_t> held_by = shards_per_rank(holder, size);
  std::vector<std::size_t> counts;
  for (std::size_t k : held_by) counts.push_back(k * block);

  Bytes packed;  // this rank's blocks end to end, where it holds several
  ConstBuffer input = held.empty() ? ConstBuffer{nullptr, 0, output.dtype} : held[0];
  if (held.size() > 1) {
    packed.resize(held.size() * block_bytes);
    for (std::size_t i = 0; i < held.size(); ++i) std::memcpy(packed.data() + i * block_bytes, held[i].data, block_bytes);
    input = ConstBuffer{packed.data(), held.size() * block, output.dtype};
  }
  const bool direct = shards_in_rank_order(holder);
  Bytes gathered(direct ? 0 : output.bytes());
  Buffer into = direct ? output : Buffer{gathered.data(), output.count, output.dtype};
  OpContext gather = ctx;
  gather.info.collective = Collective::allgather_v;
  gather.info.counts_digest = counts_digest(counts);
  b.allgather_v(gather, input, into, counts);
  if (direct) return;

  // Rank q's blocks arrived at first[q], in its shard order.
  const std::vector<std::size_t> first = first_shard_of_rank(held_by);
  std::vector<std::size_t> seen(held_by.size(), 0);
  auto* out = static_cast<std::byte*>(output.data);
  for (std::size_t s = 0; s < holder.size(); ++s) {
    const auto q = static_cast<std::size_t>(holder[s]);
    std::memcpy(out + s * block_bytes, gathered.data() + (first[q] + seen[q]++) * block_bytes, block_bytes);
  }
}

void reduce_scatter_shards_by_exchange(Backend& b, const OpContext& ctx, const std::vector<ConstBuffer>& held,
                                       const std::vector<int>& holder, const std::vector<Buffer>& outputs,
                                       ReduceOp op, int rank, int size) {
  const DType dtype = outputs[0].dtype;
  const std::size_t block = outputs[0].count;
  const std::size_t block_bytes = block * dtype_size(dtype);
  const int total = static_cast<int>(holder.size());
  const std::vector<std::size_t> held_by = shards_per_rank(holder, size);

  // matrix[r * size + q]: rank r's pieces of rank q's blocks, one per
  // (block of q, shard of r); sent by block, then by shard, ascending.
  std::vector<std::size_t> matrix(static_cast<std::size_t>(size) * static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r)
    for (int q = 0; q < size; ++q)
      matrix[static_cast<std::size_t>(r * size + q)] =
          held_by[static_cast<std::size_t>(r)] * held_by[static_cast<std::size_t>(q)] * block;
  Bytes send(held.size() * static_cast<std::size_t>(total) * block_bytes);
  std::byte* at = send.data();
  for (int q = 0; q < size; ++q)
    for (int c : shards_held(holder, q))
      for (const ConstBuffer& input : held) {
        std::memcpy(at, bytes_of(input) + static_cast<std::size_t>(c) * block_bytes, block_bytes);
        at += block_bytes;
      }
  const std::size_t mine = outputs.size();
  Bytes received(static_cast<std::size_t>(total) * mine * block_bytes);
  OpContext exchange = ctx;
  exchange.info.collective = Collective::all_to_all;
  exchange.info.count = send.size() / dtype_size(dtype);
  exchange.info.counts_digest = counts_digest(matrix);
  b.all_to_all(exchange, ConstBuffer{send.data(), send.size() / dtype_size(dtype), dtype},
               Buffer{received.data(), received.size() / dtype_size(dtype), dtype}, BlockCounts(size, rank, matrix));

  // From rank r, at first[r] * mine blocks: for each block of this rank
  // (j), r's shards' pieces in r's shard order.
  const std::vector<std::size_t> first = first_shard_of_rank(held_by);
  std::vector<std::size_t> place(static_cast<std::size_t>(total));  // shard s's place among its holder's
  std::vector<std::size_t> seen(held_by.size(), 0);
  for (std::size_t s = 0; s < place.size(); ++s) place[s] = seen[static_cast<std::size_t>(holder[s])]++;
  std::vector<const void*> sources(static_cast<std::size_t>(total));
  for (std::size_t j = 0; j < mine; ++j) {
    for (int s = 0; s < total; ++s) {
      const auto r = static_cast<std::size_t>(holder[static_cast<std::size_t>(s)]);
      sources[static_cast<std::size_t>(s)] =
          received.data() + (first[r] * mine + j * held_by[r] + place[static_cast<std::size_t>(s)]) * block_bytes;
    }
    reduce_many(outputs[j].data, sources.data(), total, block, dtype, op);
  }
}

}  // namespace

std::shared_ptr<Work> ProcessGroup::allgather_shards(std::vector<ConstBuffer> held, std::vector<int> holder,
                                                     Buffer output) {
  check_buffer(output, "allgather_shards output");
  check_shard_map("allgather_shards", holder, size(), rank(), held.size());
  LOCKSTEP_CHECK_ARG(output.count % holder.size() == 0,
                     "allgather_shards: the output holds {} elements, not a block for each of the {} shards",
                     output.count, holder.size());
  const std::size_t block = output.count / holder.size();
  for (const ConstBuffer& b : held) {
    check_buffer(b, "allgather_shards input");
    LOCKSTEP_CHECK_ARG(b.dtype == output.dtype && b.count == block,
                       "allgather_shards: every shard's block is {} x {} (the output's {} over {} shards), not {} x {}",
                       output.dtype, block, output.count, holder.size(), b.dtype, b.count);
    LOCKSTEP_CHECK_ARG(b.device == Device::host() && output.device == Device::host(),
                       "allgather_shards: host memory only");
  }
  const Route r = route(*impl_, "allgather_shards", {{"output", output}});
  OpInfo info;
  info.collective = Collective::allgather;
  info.dtype = output.dtype;
  info.count = output.count;
  info.counts_digest = holders_digest(holder);
  const int n = size();
  return submit_routed(*impl_, info, r,
                       [held = std::move(held), holder = std::move(holder), output, n](Backend& b,
                                                                                      const OpContext& ctx) {
                         if (output.count == 0) return;
                         if (n == 1) {  // every shard here, in shard order
                           const std::size_t bytes = output.bytes() / held.size();
                           for (std::size_t s = 0; s < held.size(); ++s)
                             std::memcpy(static_cast<std::byte*>(output.data) + s * bytes, held[s].data, bytes);
                           return;
                         }
                         allgather_shards_by_exchange(b, ctx, held, holder, output, n);
                       });
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter_shards(std::vector<ConstBuffer> held, std::vector<int> holder,
                                                          std::vector<Buffer> outputs, Reduction op) {
  check_shard_map("reduce_scatter_shards", holder, size(), rank(), held.size());
  LOCKSTEP_CHECK_ARG(!held.empty(),
                     "reduce_scatter_shards: rank {} holds no shard by the map; every rank takes part with at least one "
                     "(its blocks' size is the operation's)",
                     rank());
  LOCKSTEP_CHECK_ARG(outputs.size() == held.size(),
                     "reduce_scatter_shards: one output block per held shard ({}), not {}", held.size(),
                     outputs.size());
  check_fold_over_shards("reduce_scatter_shards", op.op);
  const std::size_t block = outputs[0].count;
  const DType dtype = outputs[0].dtype;
  for (const Buffer& out : outputs) {
    check_buffer(out, "reduce_scatter_shards output");
    LOCKSTEP_CHECK_ARG(out.dtype == dtype && out.count == block,
                       "reduce_scatter_shards: every output block is {} x {} like the first, not {} x {}", dtype,
                       block, out.dtype, out.count);
    LOCKSTEP_CHECK_ARG(out.device == Device::host(), "reduce_scatter_shards: host memory only");
  }
  for (const ConstBuffer& in : held) {
    check_buffer(in, "reduce_scatter_shards input");
    LOCKSTEP_CHECK_ARG(in.dtype == dtype && in.count == block * holder.size(),
                       "reduce_scatter_shards: every input is {} x {} (a block of {} for each of the {} shards), "
                       "not {} x {}",
                       dtype, block * holder.size(), block, holder.size(), in.dtype, in.count);
    LOCKSTEP_CHECK_ARG(in.device == Device::host(), "reduce_scatter_shards: host memory only");
  }
  const Route r = route(*impl_, "reduce_scatter_shards", {{"output", outputs[0]}});
  OpInfo info;
  info.collective = Collective::reduce_scatter;
  info.dtype = dtype;
  info.count = block;
  info.op = op.op;
  info.counts_digest = holders_digest(holder);
  const ReduceOp kernel_op = op.op;
  const int me = rank(), n = size();
  const bool own_shards_on_shm = backend() == "shm" && each_rank_holds_its_own(holder, n);
  return submit_routed(
      *impl_, info, r,
      [held = std::move(held), holder = std::move(holder), outputs = std::move(outputs), kernel_op, me, n,
       own_shards_on_shm](Backend& b, const OpContext& ctx) {
        const std::size_t block = outputs[0].count;
        if (block == 0) return;
        if (n == 1) {  // every shard here, in shard order
          const std::size_t block_bytes = outputs[0].bytes();
          std::vector<const void*> sources(held.size());
          for (std::size_t j = 0; j < outputs.size(); ++j) {
            for (std::size_t s = 0; s < held.size(); ++s) sources[s] = bytes_of(held[s]) + j * block_bytes;
            reduce_many(outputs[j].data, sources.data(), static_cast<int>(held.size()), block, outputs[j].dtype,
                        kernel_op);
          }
          return;
        }
        if (own_shards_on_shm) {
          OpContext plain = ctx;
          plain.info.counts_digest = 0;
          return b.reduce_scatter(plain, held[0], outputs[0], kernel_op);
        }
        reduce_scatter_shards_by_exchange(b, ctx, held, holder, outputs, kernel_op, me, n);
      });
}

}  // namespace lockstep
