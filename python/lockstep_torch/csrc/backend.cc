// LockstepBackend (see backend.h): each c10d operation is the lockstep
// torch.distributed function of the same name, issued asynchronously.
// lockstep's errors at issue time (a wrong dtype, sizes that do not fit)
// become PyTorch's: ValueError for bad arguments, RuntimeError otherwise.
#include "backend.h"

#include <c10/util/Exception.h>

#include "c10d_store.h"
#include "lockstep/error.h"
#include "lockstep/store.h"
#include "sparse_allreduce.h"
#include "work.h"

namespace lockstep_torch {
namespace {

namespace dist = lockstep::torch;
using Parts = std::vector<std::shared_ptr<lockstep::Work>>;

// Runs `issue` (which issues lockstep operations), rethrowing lockstep's
// errors as PyTorch's with the operation's name.
template <typename Issue>
auto translated(const char* op, Issue&& issue) {
  try {
    return issue();
  } catch (const lockstep::InvalidArgument& e) {
    TORCH_CHECK_VALUE(false, "lockstep backend: ", op, ": ", e.what());
  } catch (const lockstep::Error& e) {
    TORCH_CHECK(false, "lockstep backend: ", op, ": ", e.what());
  }
}

// Issues `issue_one(i)` for i in [0, n): the coalesced forms, one lockstep
// operation per tensor.
template <typename IssueOne>
Parts issue_each(const char* op, std::size_t n, IssueOne&& issue_one) {
  return translated(op, [&] {
    Parts issued;
    for (std::size_t i = 0; i < n; ++i) issued.push_back(issue_one(i));
    return issued;
  });
}

lockstep::Reduction to_reduction(const c10d::ReduceOp& op, const char* name) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return lockstep::ReduceOp::sum;
    case c10d::ReduceOp::AVG: return lockstep::ReduceOp::avg;
    case c10d::ReduceOp::PRODUCT: return lockstep::ReduceOp::prod;
    case c10d::ReduceOp::MIN: return lockstep::ReduceOp::min;
    case c10d::ReduceOp::MAX: return lockstep::ReduceOp::max;
    case c10d::ReduceOp::PREMUL_SUM: {
      const auto* factor = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK_VALUE(factor != nullptr, "lockstep backend: ", name, " got PREMUL_SUM without its factor");
      return lockstep::Reduction::premul_sum(factor->tensor_factor.defined() ? factor->tensor_factor.item<double>()
                                                                             : factor->double_factor);
    }
    default:
      TORCH_CHECK_VALUE(false, "lockstep backend: ", name, " does not support the bitwise ReduceOp ",
                        static_cast<int>(op.op_), "; it takes SUM, AVG, PRODUCT, MIN, MAX and PREMUL_SUM");
  }
}

const at::Tensor& only_tensor(const std::vector<at::Tensor>& tensors, const char* op) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "lockstep backend: ", op, " takes one tensor per process, got ",
                    tensors.size());
  return tensors.front();
}

template <typename T>
void check_pairs(const std::vector<T>& outputs, const std::vector<at::Tensor>& inputs, const char* op) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "lockstep backend: ", op, ": ", outputs.size(),
                    " outputs for ", inputs.size(), " inputs");
}

}  // namespace

LockstepBackend::LockstepBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                 std::chrono::milliseconds timeout, const std::string& group_name)
    : c10d::Backend(rank, size) {
  lockstep::GroupOptions options;
  options.rank = rank;
  options.world_size = size;
  // A group of one meets nobody: it keeps its keys to itself. PyTorch may
  // name two single-rank groups of different processes alike (new_subgroups
  // with group= numbers them within each parent group), and their claims
  // on a shared store would read as two processes started as one rank.
  if (size == 1)
    options.store = std::make_shared<lockstep::HashStore>();
  else
    options.store = std::make_shared<C10dStore>(store);
  if (timeout.count() > 0) options.timeout = lockstep::Duration(timeout.count());
  options.name = group_name.empty() ? "default" : group_name;
  group_ = translated("init_process_group", [&] { return lockstep::init_process_group(std::move(options)); });
}

LockstepBackend::~LockstepBackend() = default;

lockstep::ProcessGroup& LockstepBackend::group() const {
  TORCH_CHECK(group_ != nullptr, "lockstep backend: this process group was destroyed (destroy_process_group); ",
              "create a new one with init_process_group or new_group");
  return *group_;
}

void LockstepBackend::shutdown() { group_.reset(); }

void LockstepBackend::abort() {
  if (group_ != nullptr) group_->abort("torch.distributed aborted the process group on rank " +
                                       std::to_string(getRank()));
  group_.reset();
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::finish(c10d::OpType type, Parts parts,
                                                       std::vector<at::Tensor> outputs,
                                                       std::vector<at::Tensor> keep_alive) {
  ++operations_;
  return LockstepWork::start(getRank(), type, std::move(parts), std::move(outputs), std::move(keep_alive));
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  const at::Tensor& t = only_tensor(tensors, "broadcast");
  auto work = translated("broadcast", [&] { return dist::broadcast(group(), t, opts.rootRank, true); });
  return finish(c10d::OpType::BROADCAST, {work}, tensors);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  const at::Tensor& t = only_tensor(tensors, "all_reduce");
  if (t.is_sparse()) return sparse_allreduce(t, opts);
  const lockstep::Reduction op = to_reduction(opts.reduceOp, "all_reduce");
  auto work = translated("all_reduce", [&] { return dist::all_reduce(group(), t, op, true); });
  return finish(c10d::OpType::ALLREDUCE, {work}, tensors);
}

// Sparse tensors: the sum only (as gloo), done before this returns; the
// tensor then holds the coalesced sum.
c10::intrusive_ptr<c10d::Work> LockstepBackend::sparse_allreduce(const at::Tensor& t,
                                                                 const c10d::AllreduceOptions& opts) {
  TORCH_CHECK_VALUE(opts.reduceOp == c10d::ReduceOp::SUM,
                    "lockstep backend: all_reduce of a sparse tensor takes ReduceOp.SUM only (as gloo); "
                    "call .to_dense() first for other reductions");
  TORCH_CHECK_VALUE(t.layout() == at::kSparse && t.device().is_cpu(),
                    "lockstep backend: all_reduce of a sparse tensor takes a sparse COO tensor on the CPU, got ",
                    t.layout(), " on ", t.device());
  const at::Tensor sum = translated("all_reduce", [&] { return sparse_all_reduce_sum(group(), t); });
  t.copy_(sum);
  return finish(c10d::OpType::ALLREDUCE, {}, {t});
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                    const c10d::AllreduceCoalescedOptions& opts) {
  const lockstep::Reduction op = to_reduction(opts.reduceOp, "all_reduce_coalesced");
  Parts parts = issue_each("all_reduce_coalesced", tensors.size(), [&](std::size_t i) {
    return dist::all_reduce(group(), tensors[i], op, true);
  });
  return finish(c10d::OpType::ALLREDUCE_COALESCED, std::move(parts), tensors);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  const at::Tensor& t = only_tensor(tensors, "reduce");
  const lockstep::Reduction op = to_reduction(opts.reduceOp, "reduce");
  auto work = translated("reduce", [&] { return dist::reduce(group(), t, opts.rootRank, op, true); });
  return finish(c10d::OpType::REDUCE, {work}, tensors);
}

// outputs[0]: one tensor per rank, for the one input.
c10::intrusive_ptr<c10d::Work> LockstepBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllgatherOptions&) {
  only_tensor(inputs, "all_gather");
  check_pairs(outputs, inputs, "all_gather");
  return gather_each_input("all_gather", outputs, inputs);
}

// outputs[r][i]: rank r's tensor i (torch.distributed.all_gather_coalesced's
// layout, rank first), regrouped per input for one all_gather each.
c10::intrusive_ptr<c10d::Work> LockstepBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                    std::vector<at::Tensor>& inputs,
                                                                    const c10d::AllgatherOptions&) {
  TORCH_CHECK_VALUE(static_cast<int>(outputs.size()) == getSize(), "lockstep backend: all_gather_coalesced: ",
                    outputs.size(), " output lists for a world of ", getSize(), "; pass one list per rank");
  std::vector<std::vector<at::Tensor>> per_input(inputs.size());
  for (std::size_t r = 0; r < outputs.size(); ++r) {
    TORCH_CHECK_VALUE(outputs[r].size() == inputs.size(), "lockstep backend: all_gather_coalesced: output list ", r,
                      " has ", outputs[r].size(), " tensors for ", inputs.size(), " inputs");
    for (std::size_t i = 0; i < inputs.size(); ++i) per_input[i].push_back(outputs[r][i]);
  }
  return gather_each_input("all_gather_coalesced", per_input, inputs);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::gather_each_input(const char* op,
                                                                  std::vector<std::vector<at::Tensor>>& per_input,
                                                                  std::vector<at::Tensor>& inputs) {
  Parts parts = issue_each(op, inputs.size(), [&](std::size_t i) {
    return dist::all_gather(group(), per_input[i], inputs[i], true);
  });
  std::vector<at::Tensor> flat;
  for (const auto& list : per_input) flat.insert(flat.end(), list.begin(), list.end());
  return finish(c10d::OpType::ALLGATHER, std::move(parts), flat, inputs);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> outputs{output}, inputs{input};
  return allgather_into_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const c10d::AllgatherOptions&) {
  check_pairs(outputs, inputs, "all_gather_into_tensor");
  Parts parts = issue_each("all_gather_into_tensor", inputs.size(), [&](std::size_t i) {
    return dist::all_gather_into_tensor(group(), outputs[i], inputs[i], true);
  });
  return finish(c10d::OpType::_ALLGATHER_BASE, std::move(parts), outputs, inputs);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::GatherOptions& opts) {
  const at::Tensor& input = only_tensor(inputs, "gather");
  std::vector<at::Tensor> none;
  std::vector<at::Tensor>& list = outputs.empty() ? none : outputs.front();
  auto work = translated("gather", [&] { return dist::gather(group(), input, list, opts.rootRank, true); });
  return finish(c10d::OpType::GATHER, {work}, list, inputs);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ScatterOptions& opts) {
  const at::Tensor& output = only_tensor(outputs, "scatter");
  const std::vector<at::Tensor> none;
  const std::vector<at::Tensor>& list = inputs.empty() ? none : inputs.front();
  auto work = translated("scatter", [&] { return dist::scatter(group(), output, list, opts.rootRank, true); });
  return finish(c10d::OpType::SCATTER, {work}, outputs, list);
}

// The list form: the list packed into one tensor, then reduce_scatter_tensor.
c10::intrusive_ptr<c10d::Work> LockstepBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                               std::vector<std::vector<at::Tensor>>& inputs,
                                                               const c10d::ReduceScatterOptions& opts) {
  const at::Tensor& output = only_tensor(outputs, "reduce_scatter");
  TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                    "lockstep backend: reduce_scatter needs a list of ", getSize(), " input tensors");
  std::vector<at::Tensor> flat_parts;
  for (const at::Tensor& t : inputs[0]) {
    TORCH_CHECK_VALUE(t.numel() == output.numel(), "lockstep backend: reduce_scatter: input tensors of ", t.numel(),
                      " elements for an output of ", output.numel());
    flat_parts.push_back(t.reshape({-1}));
  }
  std::vector<at::Tensor> packed{at::cat(flat_parts)};
  return reduce_scatter_tensor_coalesced(outputs, packed, opts);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                     const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> outputs{output}, inputs{input};
  return reduce_scatter_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  check_pairs(outputs, inputs, "reduce_scatter_tensor");
  const lockstep::Reduction op = to_reduction(opts.reduceOp, "reduce_scatter_tensor");
  Parts parts = issue_each("reduce_scatter_tensor", inputs.size(), [&](std::size_t i) {
    return dist::reduce_scatter_tensor(group(), outputs[i], inputs[i], op, true);
  });
  return finish(c10d::OpType::_REDUCE_SCATTER_BASE, std::move(parts), outputs, inputs);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_split_sizes,
                                                              std::vector<int64_t>& input_split_sizes,
                                                              const c10d::AllToAllOptions&) {
  auto work = translated("all_to_all_single", [&] {
    return dist::all_to_all_single(group(), output, input, output_split_sizes, input_split_sizes, true);
  });
  return finish(c10d::OpType::ALLTOALL_BASE, {work}, {output}, {input});
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions&) {
  auto work = translated("all_to_all", [&] { return dist::all_to_all(group(), outputs, inputs, true); });
  return finish(c10d::OpType::ALLTOALL, {work}, outputs, inputs);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::point_to_point(dist::P2POp op) {
  const c10d::OpType type = op.op == dist::P2POp::Kind::isend ? c10d::OpType::SEND : c10d::OpType::RECV;
  if (coalescing_) {
    held_.push_back(op);
    return finish(type, {}, {});  // done at once: batch_isend_irecv waits on endCoalescing's Work
  }
  auto work = translated(type == c10d::OpType::SEND ? "send" : "recv", [&] {
    return op.op == dist::P2POp::Kind::isend ? dist::isend(group(), op.tensor, op.peer, op.tag)
                                             : dist::irecv(group(), op.tensor, op.peer, op.tag);
  });
  return finish(type, {work}, {op.tensor});
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  return point_to_point({dist::P2POp::Kind::isend, only_tensor(tensors, "send"), dst_rank, tag});
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  return point_to_point({dist::P2POp::Kind::irecv, only_tensor(tensors, "recv"), src_rank, tag});
}

// recv without src: the Work's sourceRank() is the sender's rank (which
// dist.recv returns and irecv's work._source_rank() reads).
c10::intrusive_ptr<c10d::Work> LockstepBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const at::Tensor& t = only_tensor(tensors, "recv");
  TORCH_CHECK_VALUE(!coalescing_, "lockstep backend: batch_isend_irecv takes receives with a source; a receive "
                                  "from any source cannot be ordered with the batch's other pairs");
  auto work = translated("recv", [&] { return dist::irecv_any(group(), t, tag); });
  return finish(c10d::OpType::RECVANYSOURCE, {work}, {t});
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::barrier(const c10d::BarrierOptions&) {
  auto work = translated("barrier", [&] { return dist::barrier(group(), true); });
  return finish(c10d::OpType::BARRIER, {work}, {});
}

void LockstepBackend::startCoalescing() {
  TORCH_CHECK(!coalescing_, "lockstep backend: startCoalescing while already coalescing");
  coalescing_ = true;
  held_.clear();
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::endCoalescing() {
  TORCH_CHECK(coalescing_, "lockstep backend: endCoalescing without startCoalescing");
  coalescing_ = false;
  std::vector<dist::P2POp> ops;
  ops.swap(held_);
  std::vector<at::Tensor> tensors;
  for (const auto& op : ops) tensors.push_back(op.tensor);
  Parts parts = translated("batch_isend_irecv", [&] { return dist::batch_isend_irecv(group(), ops); });
  // The group runs them in issue order, which batch_isend_irecv chose: the
  // last one issued is not necessarily the last of `parts`.
  std::stable_sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a->seq() < b->seq(); });
  return finish(c10d::OpType::COALESCED, std::move(parts), tensors);
}

}  // namespace lockstep_torch
