// ProcessGroup front end: argument checks, operation descriptions, queueing
// onto the progress engine, sub-groups and the clean end of a group.
#include <algorithm>
#include <cstring>
#include <new>
#include <thread>

#include <fmt/format.h>

#include "comm/group_impl.h"
#include "common/enforce.h"
#include "common/format.h"
#include "comm/premul.h"
#include "comm/rendezvous.h"
#include "diag/fingerprint.h"

namespace lockstep {
namespace {

constexpr Duration kMaxGoodbyeWait = std::chrono::seconds(60);

OpInfo info_of(Collective c, const ConstBuffer& b, ReduceOp op = ReduceOp::sum, int peer = -1, int tag = 0) {
  OpInfo info;
  info.collective = c;
  info.dtype = b.dtype;
  info.count = b.count;
  info.op = op;
  info.peer = peer;
  info.tag = tag;
  return info;
}

// Refuses premul_sum where it cannot run: on integer types (PREMUL_SUM is
// defined for floating types) and on CUDA memory.
void check_reduction(const Reduction& op, const ConstBuffer& data, const char* what) {
  if (op.op != ReduceOp::premul_sum) return;
  LOCKSTEP_CHECK_ARG(is_floating(data.dtype),
                     "{}: premul_sum takes floating types, not {}; multiply integers yourself and use sum", what,
                     data.dtype);
  // The factor is applied by the host before the backend reduces.
  LOCKSTEP_CHECK_ARG(!data.device.is_cuda(),
                     "{}: premul_sum on CUDA memory ({}) is not supported; multiply the tensor by the factor on its "
                     "stream and use sum", what, to_string(data.device));
}

}  // namespace

// With LOCKSTEP_DEBUG=DETAIL: every rank shares the fingerprint of the
// collective it is about to run and compares; a rank that issued something
// else fails everyone at once with both fingerprints and the ranks.
void check_fingerprint(Backend& backend, const OpContext& op, const OpInfo& info, std::uint64_t number, int rank,
                       int size) {
  const diag::Fingerprint mine = diag::fingerprint(info, number);
  std::vector<diag::Fingerprint> all(static_cast<std::size_t>(size));
  // The exchange is an allgather of fingerprints on every rank, whatever
  // each rank is about to run: described as such, the backends' in-band
  // check lets it through, and the comparison below names the difference.
  OpContext exchange = op;
  exchange.info = OpInfo{Collective::allgather, DType::u8, sizeof mine};
  backend.allgather(exchange, ConstBuffer{&mine, sizeof mine, DType::u8}, Buffer{all.data(), sizeof mine * all.size(), DType::u8});
  const std::string difference = diag::compare_fingerprints(all);
  if (!difference.empty())
    throw MismatchError(fmt::format("rank {}/{}: LOCKSTEP_DEBUG=DETAIL found that the ranks disagree on collective "
                                    "number {}: {}. Every rank must issue the same collectives in the same order, "
                                    "with the same counts, dtypes and roots",
                                    rank, size, number, difference));
}


ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ProcessGroup::~ProcessGroup() {
  auto& s = *impl_;
  s.diagnostics->stop_watchdog();  // it may abort the engine: stop it first
  s.engine->drain_and_stop();
  const bool clean = !s.engine->aborted();
  // After an abort, peers are gone or failing too: leave without waiting.
  s.backend->shutdown(clean ? Deadline::after(std::min(s.spec.timeout, kMaxGoodbyeWait)) : Deadline::after(Duration(0)));
  s.backend.reset();
  if (!s.spec.finished_key.empty()) {
    try {
      s.spec.root_store->add(s.spec.finished_key, 1);
    } catch (const std::exception& e) {
      s.log.debug("could not report the end of the group to the store: {}", e.what());
    }
  }
}

int ProcessGroup::rank() const { return impl_->spec.rank; }
int ProcessGroup::size() const { return impl_->spec.size; }
const std::string& ProcessGroup::backend() const { return impl_->backend_name; }
Duration ProcessGroup::timeout() const { return impl_->spec.timeout; }
const Config& ProcessGroup::config() const { return impl_->spec.config; }
const std::shared_ptr<Store>& ProcessGroup::store() const { return impl_->store; }
const std::vector<std::string>& ProcessGroup::host_ids() const { return impl_->host_ids; }
bool ProcessGroup::aborted() const { return impl_->engine->aborted(); }

void ProcessGroup::abort(const std::string& reason) {
  auto& s = *impl_;
  if (s.engine->aborted()) return;
  const auto error = std::make_exception_ptr(
      Error(fmt::format("rank {}/{}: the program aborted the group: {}", s.spec.rank, s.spec.size, reason)));
  s.diagnostics->record_failure(error);  // the other ranks abort with it
  s.engine->abort(error);
}

bool ProcessGroup::supports(Collective collective, DType dtype, ReduceOp op) const {
  return impl_->backend->supports(collective, dtype, op);
}

std::shared_ptr<Work> ProcessGroup::allreduce(Buffer data, Reduction op) {
  check_buffer(data, "allreduce");
  check_reduction(op, data, "allreduce");
  const Route r = route(*impl_, "allreduce", {{"data", data}});
  const ReduceOp kernel_op = op.op == ReduceOp::premul_sum ? ReduceOp::sum : op.op;
  LOCKSTEP_CHECK_ARG(supports(Collective::allreduce, data.dtype, kernel_op), "{} backend cannot allreduce {} with {}",
                     backend(), data.dtype, op.op);
  return submit_routed(*impl_, info_of(Collective::allreduce, data, op.op), r,
                       [data, op, kernel_op](Backend& b, const OpContext& ctx) {
                         if (op.op == ReduceOp::premul_sum)
                           premultiply(data.data, data.data, data.count, data.dtype, op.factor);
                         b.allreduce(ctx, data, kernel_op);
                       });
}

std::shared_ptr<Work> ProcessGroup::allreduce(ConstBuffer input, Buffer output, Reduction op) {
  if (input.data == output.data && input.count == output.count && input.dtype == output.dtype &&
      input.device == output.device)
    return allreduce(output, op);
  check_buffer(input, "allreduce input");
  check_buffer(output, "allreduce output");
  LOCKSTEP_CHECK_ARG(input.dtype == output.dtype && input.count == output.count,
                     "allreduce: input ({} x {}) and output ({} x {}) must have the same dtype and length",
                     input.dtype, input.count, output.dtype, output.count);
  check_reduction(op, output, "allreduce");
  const Route r = route(*impl_, "allreduce", {{"input", input}, {"output", output}});
  const auto* in = static_cast<const std::byte*>(input.data);
  const auto* out = static_cast<const std::byte*>(output.data);
  LOCKSTEP_CHECK_ARG(in + input.bytes() <= out || out + output.bytes() <= in,
                     "allreduce: input and output overlap without being the same memory");
  const ReduceOp kernel_op = op.op == ReduceOp::premul_sum ? ReduceOp::sum : op.op;
  LOCKSTEP_CHECK_ARG(supports(Collective::allreduce, output.dtype, kernel_op), "{} backend cannot allreduce {} with {}",
                     backend(), output.dtype, op.op);
  return submit_routed(*impl_, info_of(Collective::allreduce, output, op.op), r,
                       [input, output, op, kernel_op](Backend& b, const OpContext& ctx) {
                         if (op.op != ReduceOp::premul_sum) return b.allreduce_into(ctx, input, output, op.op);
                         // The input stays unchanged: multiply into the output, sum that.
                         premultiply(output.data, input.data, output.count, output.dtype, op.factor);
                         b.allreduce(ctx, output, kernel_op);
                       });
}

std::shared_ptr<Work> ProcessGroup::broadcast(Buffer data, int root) {
  check_buffer(data, "broadcast");
  LOCKSTEP_CHECK_ARG(root >= 0 && root < size(), "broadcast: root {} is not a rank of this group of {}", root, size());
  const Route r = route(*impl_, "broadcast", {{"data", data}});
  return submit_routed(*impl_, info_of(Collective::broadcast, data, ReduceOp::sum, root), r,
                       [data, root](Backend& b, const OpContext& ctx) { b.broadcast(ctx, data, root); });
}

std::shared_ptr<Work> ProcessGroup::allgather(ConstBuffer input, Buffer output) {
  check_buffer(input, "allgather input");
  check_buffer(output, "allgather output");
  LOCKSTEP_CHECK_ARG(input.dtype == output.dtype, "allgather: input is {} but output is {}", input.dtype, output.dtype);
  LOCKSTEP_CHECK_ARG(is_product(output.count, size(), input.count),
                     "allgather: output must hold size() x input = {} x {} elements, not {}", size(), input.count,
                     output.count);
  const Route r = route(*impl_, "allgather", {{"input", input}, {"output", output}});
  return submit_routed(*impl_, info_of(Collective::allgather, input), r,
                       [input, output](Backend& b, const OpContext& ctx) { b.allgather(ctx, input, output); });
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter(ConstBuffer input, Buffer output, Reduction op) {
  check_buffer(input, "reduce_scatter input");
  check_buffer(output, "reduce_scatter output");
  LOCKSTEP_CHECK_ARG(input.dtype == output.dtype, "reduce_scatter: input is {} but output is {}", input.dtype,
                     output.dtype);
  LOCKSTEP_CHECK_ARG(is_product(input.count, size(), output.count),
                     "reduce_scatter: input must hold size() x output = {} x {} elements, not {}", size(),
                     output.count, input.count);
  check_reduction(op, input, "reduce_scatter");
  const Route r = route(*impl_, "reduce_scatter", {{"input", input}, {"output", output}});
  const ReduceOp kernel_op = op.op == ReduceOp::premul_sum ? ReduceOp::sum : op.op;
  LOCKSTEP_CHECK_ARG(supports(Collective::reduce_scatter, input.dtype, kernel_op),
                     "{} backend cannot reduce_scatter {} with {}", backend(), input.dtype, op.op);
  return submit_routed(*impl_, info_of(Collective::reduce_scatter, output, op.op), r,
                       [input, output, op, kernel_op](Backend& b, const OpContext& ctx) {
                         if (op.op != ReduceOp::premul_sum) return b.reduce_scatter(ctx, input, output, op.op);
                         // The input is the caller's and const: multiply a copy.
                         std::vector<std::byte> scaled(input.bytes());
                         premultiply(scaled.data(), input.data, input.count, input.dtype, op.factor);
                         b.reduce_scatter(ctx, ConstBuffer{scaled.data(), input.count, input.dtype}, output,
                                          kernel_op);
                       });
}

std::shared_ptr<Work> ProcessGroup::reduce(Buffer data, int root, Reduction op) {
  check_buffer(data, "reduce");
  LOCKSTEP_CHECK_ARG(root >= 0 && root < size(), "reduce: root {} is not a rank of this group of {}", root, size());
  check_reduction(op, data, "reduce");
  const Route r = route(*impl_, "reduce", {{"data", data}});
  const ReduceOp kernel_op = op.op == ReduceOp::premul_sum ? ReduceOp::sum : op.op;
  LOCKSTEP_CHECK_ARG(supports(Collective::reduce, data.dtype, kernel_op), "{} backend cannot reduce {} with {}",
                     backend(), data.dtype, op.op);
  const bool is_root = root == rank();
  return submit_routed(*impl_, info_of(Collective::reduce, data, op.op, root), r,
                       [data, root, op, kernel_op, is_root](Backend& b, const OpContext& ctx) {
                         if (op.op != ReduceOp::premul_sum) return b.reduce(ctx, data, root, op.op);
                         if (is_root) {
                           premultiply(data.data, data.data, data.count, data.dtype, op.factor);
                           return b.reduce(ctx, data, root, kernel_op);
                         }
                         // Other ranks' data stays unchanged: multiply a copy.
                         std::vector<std::byte> scaled(data.bytes());
                         premultiply(scaled.data(), data.data, data.count, data.dtype, op.factor);
                         b.reduce(ctx, Buffer{scaled.data(), data.count, data.dtype}, root, kernel_op);
                       });
}

std::shared_ptr<Work> ProcessGroup::barrier() {
  Backend* b = impl_->backend.get();
  OpInfo info;
  info.collective = Collective::barrier;
  info.dtype = DType::u8;
  return submit_collective(*impl_, info, [b](const OpContext& ctx) { b->barrier(ctx); });
}

std::shared_ptr<Work> ProcessGroup::send(ConstBuffer data, int dst, int tag) {
  check_buffer(data, "send");
  LOCKSTEP_CHECK_ARG(dst >= 0 && dst < size() && dst != rank(), "send: destination {} is not another rank of this "
                     "group of {} (this is rank {})", dst, size(), rank());
  const Route r = route(*impl_, "send", {{"data", data}});
  return submit_routed(*impl_, info_of(Collective::send, data, ReduceOp::sum, dst, tag), r,
                       [data, dst, tag](Backend& b, const OpContext& ctx) { b.send(ctx, data, dst, tag); },
                       /*numbered=*/false);
}

std::shared_ptr<Work> ProcessGroup::recv(Buffer data, int src, int tag) {
  check_buffer(data, "recv");
  LOCKSTEP_CHECK_ARG(src >= 0 && src < size() && src != rank(), "recv: source {} is not another rank of this "
                     "group of {} (this is rank {})", src, size(), rank());
  const Route r = route(*impl_, "recv", {{"data", data}});
  return submit_routed(*impl_, info_of(Collective::recv, data, ReduceOp::sum, src, tag), r,
                       [data, src, tag](Backend& b, const OpContext& ctx) { b.recv(ctx, data, src, tag); },
                       /*numbered=*/false);
}

std::shared_ptr<Work> ProcessGroup::recv_any(Buffer data, int tag) {
  check_buffer(data, "recv_any");
  const Route r = route(*impl_, "recv_any", {{"data", data}});
  const std::string refusal = r.backend->why_no_recv_any();
  LOCKSTEP_CHECK_ARG(refusal.empty(), "recv_any: {}", refusal);
  LOCKSTEP_CHECK_ARG(size() > 1, "recv_any: this group of one has no other rank to receive from");
  // The backend learns the sender while the operation runs, possibly on
  // this thread before submit returns: it writes it here, and the Work,
  // handed out only after, reads it from here.
  auto source = std::make_shared<std::atomic<int>>(-1);
  auto work = submit_routed(*impl_, info_of(Collective::recv, data, ReduceOp::sum, /*peer=*/-1, tag), r,
                            [data, tag, source](Backend& b, const OpContext& ctx) {
                              source->store(b.recv_any(ctx, data, tag), std::memory_order_release);
                            },
                            /*numbered=*/false);
  work->attach_source(std::move(source));
  return work;
}

void ProcessGroup::annotate(std::uint64_t seq, std::string label) {
  impl_->diagnostics->recorder().label(seq, std::move(label));
}

bool ProcessGroup::tracing() const {
  return impl_->diagnostics->tracer() && impl_->diagnostics->tracer()->enabled();
}

void ProcessGroup::trace(std::string name, std::string track, std::int64_t start_us, std::int64_t end_us) {
  if (tracing()) impl_->diagnostics->tracer()->event(std::move(name), std::move(track), start_us, end_us);
}

std::string ProcessGroup::dump_flight_recorder(const std::string& reason) { return impl_->diagnostics->dump(reason); }

std::shared_ptr<std::byte[]> ProcessGroup::allocate_shared(std::size_t bytes) {
  return impl_->backend->allocate_shared(bytes, Deadline::after(impl_->spec.connect_timeout));
}

void Backend::allreduce_into(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) {
  if (input.data != output.data) std::memcpy(output.data, input.data, output.bytes());
  allreduce(op, output, reduce_op);
}

std::shared_ptr<std::byte[]> Backend::allocate_shared(std::size_t bytes, Deadline) {
  const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + 63) / 64 * 64;
  auto* p = static_cast<std::byte*>(::operator new[](rounded, std::align_val_t(64)));
  std::memset(p, 0, rounded);
  return std::shared_ptr<std::byte[]>(p, [](std::byte* q) { ::operator delete[](q, std::align_val_t(64)); });
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(const std::vector<int>& ranks) {
  const auto me = std::find(ranks.begin(), ranks.end(), rank());
  LOCKSTEP_CHECK_ARG(me != ranks.end(), "new_group: rank {} is not in the list; only listed ranks call new_group",
                     rank());
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  LOCKSTEP_CHECK_ARG(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
                     "new_group: the rank list repeats a rank");
  LOCKSTEP_CHECK_ARG(sorted.front() >= 0 && sorted.back() < size(),
                     "new_group: ranks must lie in 0..{} (this group has {} ranks)", size() - 1, size());
  // The group is named by its set of ranks, so members that list them in
  // different orders meet, and agree_on_member_order names the difference.
  int ordinal = 0;
  {
    std::lock_guard lock(impl_->subgroups_mutex);
    ordinal = impl_->subgroups_created[sorted]++;
  }
  std::string list;
  for (int r : sorted) list += fmt::format("{}{}", list.empty() ? "" : "-", r);
  GroupSpec spec = impl_->spec;
  spec.rank = static_cast<int>(me - ranks.begin());
  spec.size = static_cast<int>(ranks.size());
  spec.backend = impl_->backend_name;
  spec.key = fmt::format("{}/sub/{}/{}", impl_->spec.key, list, ordinal);
  spec.world_ranks.clear();
  for (int r : ranks) spec.world_ranks.push_back(impl_->spec.world_ranks[static_cast<std::size_t>(r)]);
  spec.shrinks = std::make_shared<std::atomic<int>>(0);
  spec.grows = std::make_shared<std::atomic<int>>(0);
  spec.incarnations.clear();
  for (int r : ranks) spec.incarnations.push_back(impl_->spec.incarnation_of(r));
  spec.join_board.clear();  // replacements join the job's group, not its sub-groups
  spec.joined = false;
  agree_on_member_order(*spec.root_store, spec.key, ranks, rank(), spec.timeout);
  spec.world = false;
  spec.finished_key.clear();
  spec.tracer = impl_->diagnostics->shared_tracer();
  return make_group(std::move(spec));
}

}  // namespace lockstep
