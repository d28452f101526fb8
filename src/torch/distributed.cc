// torch.distributed's collectives over lockstep process groups: checks on
// each tensor (device, dtype, layout), the views the raw collectives take,
// and copies into and out of tensor lists. See lockstep/torch/distributed.h.
// Stateless; thread-safety as the group's.
#include "lockstep/torch/distributed.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>
#include <sstream>

#include "lockstep/error.h"
#include "lockstep/torch/ddp.h"
#include "cuda_stream.h"

namespace lockstep::torch {
namespace {

enum class Access { read, write };

std::string sizes_of(const Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

// Checks what every tensor a collective touches must satisfy and returns
// the lockstep dtype.
DType check_tensor(const Tensor& t, const char* fn, const char* what) {
  if (!t.defined()) throw InvalidArgument(fmt::format("{}: {} is an undefined tensor", fn, what));
  if (!t.device().is_cpu() && !t.device().is_cuda())
    throw InvalidArgument(fmt::format("{}: {} is on {}; lockstep takes CPU and CUDA tensors", fn, what,
                                      t.device().str()));
  if (t.layout() != ::torch::kStrided)
    throw InvalidArgument(fmt::format("{}: {} is a sparse or otherwise non-strided tensor; pass a dense one (.to_dense())",
                                      fn, what));
  try {
    return dtype_of(t.scalar_type());
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("{}: {}: {}", fn, what, e.what()));
  }
}

// A buffer over `count` elements at `data` on the tensor's device: for a
// CUDA tensor, its device and the current stream (the one its producers and
// readers are ordered on), which lockstep's stream contract takes.
template <typename B, typename P>
B located(const Tensor& t, P data, std::size_t count, DType dtype, const char* fn, const char* what) {
  if (t.device().is_cpu()) return B{data, count, dtype};
  try {
    return B{data, count, dtype, Device::cuda(t.device().index()), current_stream(t.device())};
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("{}: {}: {}", fn, what, e.what()));
  }
}

// Whether results copied out of a temporary like `t` are in CUDA memory,
// where finish() copies them on this thread after a host wait.
bool on_device(const Tensor& t) { return t.device().is_cuda(); }

// int8 and bool travel as bytes but are not uint8 numbers: refuse to reduce them.
void check_reducible(const Tensor& t, const char* fn) {
  const auto type = t.scalar_type();
  if (type == ::torch::kChar || type == ::torch::kBool)
    throw InvalidArgument(fmt::format("{}: lockstep does not reduce {} tensors; convert to int32 (or uint8) first", fn,
                                      c10::toString(type)));
}

// The memory of a tensor a collective writes: it must be that tensor's own
// (contiguous, or any dense layout for elementwise collectives).
Buffer written(const Tensor& t, const char* fn, const char* what, bool elementwise = false) {
  const DType dtype = check_tensor(t, fn, what);
  const bool usable = t.is_contiguous() || (elementwise && t.is_non_overlapping_and_dense());
  if (!usable)
    throw InvalidArgument(fmt::format("{}: {} (sizes {}) is not contiguous, and the collective writes it in place; pass "
                                      "a contiguous tensor (.contiguous()) and copy the result back",
                                      fn, what, sizes_of(t)));
  return located<Buffer>(t, t.data_ptr(), static_cast<std::size_t>(t.numel()), dtype, fn, what);
}

// A tensor a collective only reads: a contiguous copy when it is not
// contiguous (kept in `keep` while the collective runs).
ConstBuffer read(const Tensor& t, const char* fn, const char* what, std::vector<Tensor>& keep) {
  const DType dtype = check_tensor(t, fn, what);
  Tensor c = t.is_contiguous() ? t : t.contiguous();
  keep.push_back(c);
  return located<ConstBuffer>(c, static_cast<const void*>(c.data_ptr()), static_cast<std::size_t>(c.numel()), dtype,
                              fn, what);
}

void check_same_type(const Tensor& a, const Tensor& b, const char* fn, const char* what_a, const char* what_b) {
  if (a.scalar_type() != b.scalar_type())
    throw InvalidArgument(fmt::format("{}: {} is {} but {} is {}", fn, what_a, c10::toString(a.scalar_type()), what_b,
                                      c10::toString(b.scalar_type())));
}

void check_list_size(const std::vector<Tensor>& list, int n, const char* fn, const char* what) {
  if (static_cast<int>(list.size()) != n)
    throw InvalidArgument(fmt::format("{}: {} has {} tensors; it needs one per rank ({})", fn, what, list.size(), n));
}

// Blocking: waits and returns the finished Work. Async: keeps the tensors
// alive until the Work is done, then runs `then` (copies out of a
// temporary) if the operation succeeded. Copies out of a temporary in CUDA
// memory (`device`) are queued on the current stream after wait() ordered
// it after the collective, on this thread, so the call blocks the host
// until the collective's host side is done; its device side is not waited
// for.
WorkHandle finish(WorkHandle work, bool async_op, std::vector<Tensor> keep,
                  std::function<void()> then = nullptr, bool device = false) {
  if (!async_op || (then && device)) {
    work->wait();
    if (then) then();
    return work;
  }
  work->on_complete([keep = std::move(keep), then = std::move(then)](const Work& w) {
    if (then && !w.error()) then();
  });
  return work;
}

// Copies consecutive parts of a flat tensor into the tensors of a list.
void copy_into(std::vector<Tensor>& list, const Tensor& flat) {
  ::torch::NoGradGuard no_grad;
  std::int64_t at = 0;
  for (auto& t : list) {
    t.copy_(flat.slice(0, at, at + t.numel()).view(t.sizes()));
    at += t.numel();
  }
}

Tensor flat_cat(const std::vector<Tensor>& list) {
  std::vector<Tensor> flat;
  flat.reserve(list.size());
  for (const auto& t : list) flat.push_back(t.reshape({-1}));
  return ::torch::cat(flat).contiguous();
}

}  // namespace

WorkHandle all_reduce(ProcessGroup& group, const Tensor& tensor, Reduction op, bool async_op) {
  const Buffer b = written(tensor, "all_reduce", "the tensor", /*elementwise=*/true);
  check_reducible(tensor, "all_reduce");
  return finish(group.allreduce(b, op), async_op, {tensor});
}

WorkHandle broadcast(ProcessGroup& group, const Tensor& tensor, int src, bool async_op) {
  const Buffer b = written(tensor, "broadcast", "the tensor", /*elementwise=*/true);
  return finish(group.broadcast(b, src), async_op, {tensor});
}

WorkHandle reduce(ProcessGroup& group, const Tensor& tensor, int dst, Reduction op, bool async_op) {
  const Buffer b = written(tensor, "reduce", "the tensor", /*elementwise=*/true);
  check_reducible(tensor, "reduce");
  return finish(group.reduce(b, dst, op), async_op, {tensor});
}

WorkHandle all_gather(ProcessGroup& group, std::vector<Tensor>& tensor_list, const Tensor& tensor, bool async_op) {
  const char* fn = "all_gather";
  check_list_size(tensor_list, group.size(), fn, "tensor_list");
  std::vector<Tensor> keep;
  const ConstBuffer in = read(tensor, fn, "the input tensor", keep);
  std::vector<std::size_t> counts;
  for (const auto& t : tensor_list) {
    check_tensor(t, fn, "a tensor of tensor_list");
    check_same_type(t, tensor, fn, "a tensor of tensor_list", "the input");
    counts.push_back(static_cast<std::size_t>(t.numel()));
  }
  if (counts[static_cast<std::size_t>(group.rank())] != in.count)
    throw InvalidArgument(fmt::format("{}: tensor_list[{}] (this rank's) has {} elements but the input has {}", fn,
                                      group.rank(), counts[static_cast<std::size_t>(group.rank())], in.count));
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  Tensor flat = ::torch::empty({static_cast<std::int64_t>(total)}, tensor.options());
  keep.push_back(flat);
  const Buffer out{flat.data_ptr(), total, in.dtype, in.device, in.stream};
  const bool equal = std::all_of(counts.begin(), counts.end(), [&](std::size_t c) { return c == in.count; });
  auto work = equal ? group.allgather(in, out) : group.allgather(in, out, counts);
  auto list = tensor_list;  // shallow handles: copying into them fills the caller's tensors
  return finish(work, async_op, std::move(keep), [list, flat]() mutable { copy_into(list, flat); },
                on_device(tensor));
}

WorkHandle all_gather_into_tensor(ProcessGroup& group, const Tensor& output, const Tensor& input, bool async_op) {
  const char* fn = "all_gather_into_tensor";
  std::vector<Tensor> keep{output};
  const ConstBuffer in = read(input, fn, "the input", keep);
  const Buffer out = written(output, fn, "the output");
  check_same_type(output, input, fn, "the output", "the input");
  return finish(group.allgather(in, out), async_op, std::move(keep));
}

WorkHandle reduce_scatter_tensor(ProcessGroup& group, const Tensor& output, const Tensor& input, Reduction op,
                                 bool async_op) {
  const char* fn = "reduce_scatter_tensor";
  std::vector<Tensor> keep{output};
  const ConstBuffer in = read(input, fn, "the input", keep);
  const Buffer out = written(output, fn, "the output");
  check_same_type(output, input, fn, "the output", "the input");
  check_reducible(input, fn);
  return finish(group.reduce_scatter(in, out, op), async_op, std::move(keep));
}

WorkHandle gather(ProcessGroup& group, const Tensor& tensor, std::vector<Tensor>& gather_list, int dst, bool async_op) {
  const char* fn = "gather";
  std::vector<Tensor> keep;
  const ConstBuffer in = read(tensor, fn, "the tensor", keep);
  if (group.rank() != dst) {
    if (!gather_list.empty())
      throw InvalidArgument(fmt::format("{}: only the destination rank {} passes a gather_list; this is rank {}", fn, dst,
                                        group.rank()));
    return finish(group.gather(in, Buffer{nullptr, 0, in.dtype, in.device, in.stream}, dst), async_op,
                  std::move(keep));
  }
  check_list_size(gather_list, group.size(), fn, "gather_list");
  for (const auto& t : gather_list) {
    check_tensor(t, fn, "a tensor of gather_list");
    check_same_type(t, tensor, fn, "a tensor of gather_list", "the tensor");
    if (static_cast<std::size_t>(t.numel()) != in.count)
      throw InvalidArgument(fmt::format("{}: every tensor of gather_list must have the tensor's {} elements, not {}", fn,
                                        in.count, t.numel()));
  }
  Tensor flat = ::torch::empty({static_cast<std::int64_t>(in.count) * group.size()}, tensor.options());
  keep.push_back(flat);
  auto work = group.gather(
      in, Buffer{flat.data_ptr(), static_cast<std::size_t>(flat.numel()), in.dtype, in.device, in.stream}, dst);
  auto list = gather_list;
  return finish(work, async_op, std::move(keep), [list, flat]() mutable { copy_into(list, flat); },
                on_device(tensor));
}

WorkHandle scatter(ProcessGroup& group, const Tensor& tensor, const std::vector<Tensor>& scatter_list, int src,
                   bool async_op) {
  const char* fn = "scatter";
  const Buffer out = written(tensor, fn, "the tensor");
  std::vector<Tensor> keep{tensor};
  if (group.rank() != src) {
    if (!scatter_list.empty())
      throw InvalidArgument(fmt::format("{}: only the source rank {} passes a scatter_list; this is rank {}", fn, src,
                                        group.rank()));
    return finish(group.scatter(ConstBuffer{nullptr, 0, out.dtype, out.device, out.stream}, out, src), async_op,
                  std::move(keep));
  }
  check_list_size(scatter_list, group.size(), fn, "scatter_list");
  for (const auto& t : scatter_list) {
    check_tensor(t, fn, "a tensor of scatter_list");
    check_same_type(t, tensor, fn, "a tensor of scatter_list", "the tensor");
    if (static_cast<std::size_t>(t.numel()) != out.count)
      throw InvalidArgument(fmt::format("{}: every tensor of scatter_list must have the tensor's {} elements, not {}",
                                        fn, out.count, t.numel()));
  }
  Tensor flat = flat_cat(scatter_list);
  keep.push_back(flat);
  const ConstBuffer in{flat.data_ptr(), static_cast<std::size_t>(flat.numel()), out.dtype, out.device, out.stream};
  return finish(group.scatter(in, out, src), async_op, std::move(keep));
}

namespace {

// Split sizes in rows of dimension 0 as element counts; empty: equal splits.
std::vector<std::size_t> element_counts(const Tensor& t, const std::vector<std::int64_t>& splits, int n,
                                        const char* what) {
  const char* fn = "all_to_all_single";
  const std::int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const std::int64_t row = rows == 0 ? 0 : t.numel() / rows;
  std::vector<std::size_t> out;
  if (splits.empty()) {
    if (rows % n != 0)
      throw InvalidArgument(fmt::format("{}: the {} has {} rows, which do not split equally over {} ranks; pass {} "
                                        "split sizes",
                                        fn, what, rows, n, what));
    out.assign(static_cast<std::size_t>(n), static_cast<std::size_t>(rows / n * row));
    return out;
  }
  if (static_cast<int>(splits.size()) != n)
    throw InvalidArgument(fmt::format("{}: {} split sizes has {} entries; it needs one per rank ({})", fn, what,
                                      splits.size(), n));
  std::int64_t sum = 0;
  for (std::int64_t s : splits) {
    if (s < 0) throw InvalidArgument(fmt::format("{}: {} split sizes must not be negative", fn, what));
    sum += s;
    out.push_back(static_cast<std::size_t>(s * row));
  }
  if (sum != rows)
    throw InvalidArgument(fmt::format("{}: {} split sizes add up to {} rows, but the {} has {}", fn, what, sum, what,
                                      rows));
  return out;
}

}  // namespace

WorkHandle all_to_all_single(ProcessGroup& group, const Tensor& output, const Tensor& input,
                             const std::vector<std::int64_t>& output_split_sizes,
                             const std::vector<std::int64_t>& input_split_sizes, bool async_op) {
  const char* fn = "all_to_all_single";
  std::vector<Tensor> keep{output};
  const ConstBuffer in = read(input, fn, "the input", keep);
  const Buffer out = written(output, fn, "the output");
  check_same_type(output, input, fn, "the output", "the input");
  if (output_split_sizes.empty() && input_split_sizes.empty()) {
    if (in.count != out.count)
      throw InvalidArgument(fmt::format("{}: without split sizes input ({}) and output ({}) must have as many elements",
                                        fn, in.count, out.count));
    element_counts(input, {}, group.size(), "input");  // equal rows per rank
    return finish(group.all_to_all(in, out), async_op, std::move(keep));
  }
  auto sends = element_counts(input, input_split_sizes, group.size(), "input");
  auto recvs = element_counts(output, output_split_sizes, group.size(), "output");
  return finish(group.all_to_all(in, std::move(sends), out, std::move(recvs)), async_op, std::move(keep));
}

WorkHandle all_to_all(ProcessGroup& group, std::vector<Tensor>& output_list, const std::vector<Tensor>& input_list,
                      bool async_op) {
  const char* fn = "all_to_all";
  check_list_size(input_list, group.size(), fn, "input_list");
  check_list_size(output_list, group.size(), fn, "output_list");
  std::vector<std::size_t> sends, recvs;
  for (int q = 0; q < group.size(); ++q) {
    const auto& i = input_list[static_cast<std::size_t>(q)];
    const auto& o = output_list[static_cast<std::size_t>(q)];
    check_tensor(i, fn, "a tensor of input_list");
    check_tensor(o, fn, "a tensor of output_list");
    check_same_type(o, input_list.front(), fn, "a tensor of output_list", "input_list[0]");
    check_same_type(i, input_list.front(), fn, "a tensor of input_list", "input_list[0]");
    sends.push_back(static_cast<std::size_t>(i.numel()));
    recvs.push_back(static_cast<std::size_t>(o.numel()));
  }
  const DType dtype = dtype_of(input_list.front().scalar_type());
  Tensor in = flat_cat(input_list);
  const std::size_t total = std::accumulate(recvs.begin(), recvs.end(), std::size_t{0});
  Tensor out = ::torch::empty({static_cast<std::int64_t>(total)}, input_list.front().options());
  const Buffer out_buffer = located<Buffer>(out, out.data_ptr(), total, dtype, fn, "output_list");
  const ConstBuffer in_buffer{in.data_ptr(), static_cast<std::size_t>(in.numel()), dtype, out_buffer.device,
                              out_buffer.stream};
  auto work = group.all_to_all(in_buffer, std::move(sends), out_buffer, std::move(recvs));
  auto list = output_list;
  return finish(work, async_op, {in, out}, [list, out]() mutable { copy_into(list, out); }, on_device(out));
}

void send(ProcessGroup& group, const Tensor& tensor, int dst, int tag) { isend(group, tensor, dst, tag)->wait(); }
void recv(ProcessGroup& group, const Tensor& tensor, int src, int tag) { irecv(group, tensor, src, tag)->wait(); }

WorkHandle isend(ProcessGroup& group, const Tensor& tensor, int dst, int tag) {
  std::vector<Tensor> keep;
  const ConstBuffer data = read(tensor, "isend", "the tensor", keep);
  return finish(group.send(data, dst, tag), /*async_op=*/true, std::move(keep));
}

WorkHandle irecv(ProcessGroup& group, const Tensor& tensor, int src, int tag) {
  const Buffer data = written(tensor, "irecv", "the tensor");
  return finish(group.recv(data, src, tag), /*async_op=*/true, {tensor});
}

int recv_any(ProcessGroup& group, const Tensor& tensor, int tag) {
  auto work = irecv_any(group, tensor, tag);
  work->wait();
  return work->source_rank();
}

WorkHandle irecv_any(ProcessGroup& group, const Tensor& tensor, int tag) {
  const Buffer data = written(tensor, "irecv_any", "the tensor");
  return finish(group.recv_any(data, tag), /*async_op=*/true, {tensor});
}

// Pairs in ascending order of (lower rank, higher rank); within a pair the
// lower rank's sends come first on both sides (so they meet the higher
// rank's receives), then the other direction. Every rank derives the same
// order of pairs, so no two ranks wait on each other in a cycle, even when
// the group runs one operation at a time and large messages wait for their
// receiver.
std::vector<WorkHandle> batch_isend_irecv(ProcessGroup& group, const std::vector<P2POp>& ops) {
  const int me = group.rank();
  std::vector<std::size_t> order(ops.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  const auto key = [&](std::size_t i) {
    const P2POp& op = ops[i];
    const bool sends = op.op == P2POp::Kind::isend;
    // Phase 0: data from the lower rank to the higher; phase 1: back.
    const bool low_to_high = (me < op.peer) == sends;
    return std::tuple(std::min(me, op.peer), std::max(me, op.peer), low_to_high ? 0 : 1);
  };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return key(a) < key(b); });
  std::vector<WorkHandle> works(ops.size());
  for (std::size_t i : order) {
    const P2POp& op = ops[i];
    works[i] = op.op == P2POp::Kind::isend ? isend(group, op.tensor, op.peer, op.tag)
                                           : irecv(group, op.tensor, op.peer, op.tag);
  }
  return works;
}

WorkHandle barrier(ProcessGroup& group, bool async_op) { return finish(group.barrier(), async_op, {}); }

// Through the store, each call numbered by this rank's own counter there
// (every rank calls in the same order, so the numbers agree): every rank
// sets its arrival key; rank 0 waits for all of them, then publishes the
// outcome ("" or the error) that the other ranks wait for.
void monitored_barrier(ProcessGroup& group, Duration timeout, bool wait_all_ranks) {
  if (timeout <= Duration(0)) timeout = group.timeout();
  Store& store = *group.store();
  const int me = group.rank();
  const std::int64_t call = store.add(fmt::format("monitored_barrier/calls/{}", me), 1);
  const std::string prefix = fmt::format("monitored_barrier/{}/", call);
  store.set(prefix + std::to_string(me), "1");
  if (me != 0) {
    store.wait({prefix + "outcome"}, timeout * 2);
    const std::string outcome = store.get(prefix + "outcome");
    if (!outcome.empty()) throw TimeoutError(fmt::format("rank {}/{}: {}", me, group.size(), outcome));
    return;
  }
  std::vector<std::string> keys;
  for (int r = 1; r < group.size(); ++r) keys.push_back(prefix + std::to_string(r));
  std::string outcome;
  try {
    store.wait(keys, timeout);
  } catch (const TimeoutError&) {
    std::vector<int> missing;
    for (int r = 1; r < group.size(); ++r)
      if (!store.check({prefix + std::to_string(r)})) missing.push_back(r);
    if (!wait_all_ranks && missing.size() > 1) missing.resize(1);
    outcome = fmt::format("monitored_barrier: rank{} {} did not arrive within {} ms; look at what {} doing (its "
                          "output, or `lockstep run`'s stack dump)",
                          missing.size() == 1 ? "" : "s", fmt::join(missing, ", "), timeout.count(),
                          missing.size() == 1 ? "it was" : "they were");
  }
  store.set(prefix + "outcome", outcome);
  if (!outcome.empty()) throw TimeoutError(fmt::format("rank 0/{}: {}", group.size(), outcome));
}

Bytes archive_bytes(::torch::serialize::OutputArchive& archive) {
  Bytes out;
  archive.save_to([&out](const void* data, std::size_t size) -> std::size_t {
    const auto* p = static_cast<const std::byte*>(data);
    out.insert(out.end(), p, p + size);
    return size;
  });
  return out;
}

void load_archive(::torch::serialize::InputArchive& archive, const Bytes& bytes) {
  archive.load_from(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

}  // namespace lockstep::torch
