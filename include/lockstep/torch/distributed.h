// torch.distributed's collectives for libtorch tensors, on a lockstep
// ProcessGroup. The names, arguments and meaning follow torch.distributed,
// with the group as the first argument (there is no default group):
//
//   auto pg = lockstep::init_process_group();
//   namespace dist = lockstep::torch;
//   auto loss = torch::tensor({local_loss});
//   dist::all_reduce(*pg, loss, lockstep::ReduceOp::avg);          // blocking
//   auto work = dist::all_gather_into_tensor(*pg, out, x, /*async_op=*/true);
//   ...                                                            // overlap
//   work->wait();
//
// Every function returns the group's Work; with async_op = false it has
// already finished (and its error was thrown). With async_op = true the
// tensors are kept alive until the Work is done; do not read or write them
// before wait().
//
// Tensors must be CPU or CUDA tensors of a type lockstep moves (float,
// double, half, bfloat16, int32, int64, uint8; int8 and bool too where
// nothing is reduced). CUDA tensors (a libtorch with CUDA) are handed to the
// group with the current stream, under its stream contract (docs/gpu.md):
// the collective is ordered after the work queued there, and wait() orders
// that stream after the collective. Where results are copied from a
// temporary into a list (all_gather, gather, all_to_all), the call on CUDA
// tensors waits for the collective's host side even with async_op = true,
// then queues the copies on the current stream. A tensor the
// collective only reads may be non-contiguous: it is copied to a
// contiguous one first, as PyTorch does. A tensor the collective writes
// must be contiguous (elementwise collectives — all_reduce, broadcast,
// reduce — also take any dense layout, e.g. channels-last), else
// InvalidArgument says so: a silent copy would leave the caller's tensor
// unchanged. Lists of output tensors (all_gather, gather, all_to_all) may
// hold any tensors of the right size and type: results are copied in.
//
// Thread-safety: as the group's collectives (lockstep/process_group.h).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "lockstep/object_collectives.h"
#include "lockstep/process_group.h"

namespace lockstep::torch {

using WorkHandle = std::shared_ptr<Work>;
using ::torch::Tensor;

// In place: `tensor` becomes the reduction over every rank.
// Reduction::premul_sum(f) multiplies each rank's tensor by f, then sums.
WorkHandle all_reduce(ProcessGroup& group, const Tensor& tensor, Reduction op = ReduceOp::sum, bool async_op = false);
WorkHandle broadcast(ProcessGroup& group, const Tensor& tensor, int src, bool async_op = false);
// dst's `tensor` becomes the reduction; other ranks' tensors are unchanged.
WorkHandle reduce(ProcessGroup& group, const Tensor& tensor, int dst, Reduction op = ReduceOp::sum,
                  bool async_op = false);
// tensor_list[r] receives rank r's `tensor`. The list has one tensor per
// rank; their sizes may differ (the same list of sizes on every rank).
WorkHandle all_gather(ProcessGroup& group, std::vector<Tensor>& tensor_list, const Tensor& tensor,
                      bool async_op = false);
// `output` (size() x input's elements, contiguous) receives every rank's input in rank order.
WorkHandle all_gather_into_tensor(ProcessGroup& group, const Tensor& output, const Tensor& input,
                                  bool async_op = false);
// `input` holds size() x output's elements; rank r's `output` receives the
// reduction of every rank's r-th part.
WorkHandle reduce_scatter_tensor(ProcessGroup& group, const Tensor& output, const Tensor& input,
                                 Reduction op = ReduceOp::sum, bool async_op = false);
// dst's gather_list (one tensor per rank) receives every rank's `tensor`;
// other ranks pass an empty list.
WorkHandle gather(ProcessGroup& group, const Tensor& tensor, std::vector<Tensor>& gather_list, int dst,
                  bool async_op = false);
// Rank r's `tensor` receives src's scatter_list[r]; other ranks pass an empty list.
WorkHandle scatter(ProcessGroup& group, const Tensor& tensor, const std::vector<Tensor>& scatter_list, int src,
                   bool async_op = false);
// Splits along dimension 0: input_split_sizes[q] rows go to rank q,
// output_split_sizes[q] rows come from rank q; empty: equal splits.
// Split sizes that do not match across ranks are a MismatchError on every
// rank, naming the pairs.
WorkHandle all_to_all_single(ProcessGroup& group, const Tensor& output, const Tensor& input,
                             const std::vector<std::int64_t>& output_split_sizes = {},
                             const std::vector<std::int64_t>& input_split_sizes = {}, bool async_op = false);
// input_list[q] goes to rank q; output_list[q] receives rank q's input_list[this rank].
WorkHandle all_to_all(ProcessGroup& group, std::vector<Tensor>& output_list, const std::vector<Tensor>& input_list,
                      bool async_op = false);

// Point to point (the pair must agree on size, dtype and tag).
void send(ProcessGroup& group, const Tensor& tensor, int dst, int tag = 0);
void recv(ProcessGroup& group, const Tensor& tensor, int src, int tag = 0);
WorkHandle isend(ProcessGroup& group, const Tensor& tensor, int dst, int tag = 0);
WorkHandle irecv(ProcessGroup& group, const Tensor& tensor, int src, int tag = 0);
// From whichever rank sends first (torch.distributed's recv without src;
// ProcessGroup::recv_any): recv_any returns the sender's rank, irecv_any's
// Work says it in source_rank() once done.
int recv_any(ProcessGroup& group, const Tensor& tensor, int tag = 0);
WorkHandle irecv_any(ProcessGroup& group, const Tensor& tensor, int tag = 0);

struct P2POp {
  enum class Kind { isend, irecv };
  Kind op = Kind::isend;
  Tensor tensor;
  int peer = 0;
  int tag = 0;
};
// Issues every operation and returns their Works in the order given. The
// operations are started pair by pair in an order every rank derives alike
// (lower rank sends first), so a batch that exchanges with several peers
// cannot deadlock however each rank listed it.
std::vector<WorkHandle> batch_isend_irecv(ProcessGroup& group, const std::vector<P2POp>& ops);

WorkHandle barrier(ProcessGroup& group, bool async_op = false);
// A barrier that names the ranks that did not arrive: rank 0 waits up to
// `timeout` for every rank, through the group's store (no collective, so a
// rank stuck in one is still found). Throws TimeoutError on every rank that
// gets that far, naming the first missing rank, or all of them with
// wait_all_ranks. Timeout 0: the group's timeout.
void monitored_barrier(ProcessGroup& group, Duration timeout = Duration(0), bool wait_all_ranks = false);

// libtorch archives as bytes for the object collectives
// (lockstep/object_collectives.h):
//
//   torch::serialize::OutputArchive out;  out.write("state", tensor);
//   auto all = lockstep::all_gather_object(*pg, dist::archive_bytes(out));
//   torch::serialize::InputArchive in;    dist::load_archive(in, all[1]);
Bytes archive_bytes(::torch::serialize::OutputArchive& archive);
void load_archive(::torch::serialize::InputArchive& archive, const Bytes& bytes);

}  // namespace lockstep::torch
