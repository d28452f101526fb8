// The mpi backend: every collective is one of MPI's own nonblocking
// collectives (MPI_Iallreduce, MPI_Ibcast, ...) on a communicator private
// to the group, polled with MPI_Test until it completes or the operation's
// deadline passes. Ranks must be started by mpirun (Open MPI).
//
//   communicator  world group: a dup of MPI_COMM_WORLD (lockstep rank ==
//                 MPI world rank, checked); sub-group: MPI_Comm_create_group
//                 over its members' world ranks, exchanged through the store
//   reductions    f16/bf16 are widened to fp32, reduced by MPI in fp32 and
//                 rounded once; avg is MPI's sum divided once by n (fp32 for
//                 16-bit types, truncating for integers); types.h says which
//                 MPI type and op each dtype and op become
//   check         each collective is preceded by an AND-allreduce of the
//                 ranks' operation stamps (check_agreement), so ranks that
//                 issue different collectives, counts, dtypes or roots fail
//                 with MismatchError instead of wrong data or a hang
//   send / recv   a header message (tag, dtype, bytes) the receiver checks,
//                 then the payload, on two MPI tags of the group's
//                 communicator; a recv from any source takes the header
//                 from MPI_ANY_SOURCE and the payload from its sender
//   timeouts      MPI cannot cancel a collective: after a timeout the
//                 request is abandoned (never waited on again), the group
//                 aborts, and the buffers it used may still be written if
//                 the missing rank arrives later; the backend's own scratch
//                 memory is then never freed, for the same reason
//
// Results are bitwise identical on every rank: see docs/algorithms.md.
//
// Not thread-safe: one operation at a time (the group's progress thread or
// an inline caller); different groups' backends run concurrently, which
// MPI_THREAD_MULTIPLE allows.
#pragma once

#include <mpi.h>

#include <chrono>
#include <optional>
#include <string>

#include "comm/accumulation.h"
#include "comm/backend.h"
#include "comm/mpi/types.h"
#include "comm/scratch.h"

namespace lockstep::mpi {

class MpiBackend final : public Backend {
 public:
  explicit MpiBackend(const BackendContext& ctx);
  ~MpiBackend() override;

  std::string_view name() const override { return "mpi"; }
  void allreduce(const OpContext& op, Buffer data, ReduceOp reduce_op) override;
  void broadcast(const OpContext& op, Buffer data, int root) override;
  void allgather(const OpContext& op, ConstBuffer input, Buffer output) override;
  void reduce_scatter(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) override;
  void reduce(const OpContext& op, Buffer data, int root, ReduceOp reduce_op) override;
  void barrier(const OpContext& op) override;
  void gather(const OpContext& op, ConstBuffer input, Buffer output, int root) override;
  void scatter(const OpContext& op, ConstBuffer input, Buffer output, int root) override;
  void all_to_all(const OpContext& op, ConstBuffer input, Buffer output, const BlockCounts& counts) override;
  void allgather_v(const OpContext& op, ConstBuffer input, Buffer output, const std::vector<std::size_t>& counts) override;
  void send(const OpContext& op, ConstBuffer data, int dst, int tag) override;
  void recv(const OpContext& op, Buffer data, int src, int tag) override;
  int recv_any(const OpContext& op, Buffer data, int tag) override;
  void shutdown(Deadline deadline) override;
  std::size_t inline_max_bytes() const override { return kInlineMaxBytes; }

  // Operations up to this size run on the issuing thread when the group is
  // idle: MPI's latency for them is a few microseconds, less than the
  // hand-off to the progress thread.
  static constexpr std::size_t kInlineMaxBytes = 32 * 1024;

 private:
  // The buffer MPI reduces (comm/accumulation.h: the caller's own memory,
  // or an fp32 copy of 16-bit data in `scratch`), with the MPI type and op
  // for it.
  struct Accumulator {
    Accumulation values;
    MPI_Datatype type = MPI_DATATYPE_NULL;
    MPI_Op op = MPI_OP_NULL;
    std::byte* data() const { return values.data(); }
    DType dtype() const { return values.dtype(); }
  };
  Accumulator accumulate(const void* data, std::size_t count, DType dtype, ReduceOp reduce_op, Scratch& scratch);

  // The always-on collective check (op_stamp.h), which MPI, matching
  // collectives by order alone, lacks: before each collective one small
  // allreduce ANDs every rank's stamp and its complement, which stay
  // unchanged only when every rank's stamp is the same. Otherwise every
  // rank gathers the stamps (the failure path only) and raises
  // MismatchError naming itself and a rank that differs, at this
  // collective. Costs one small allreduce per collective
  // (docs/performance.md).
  void check_agreement(const OpContext& op);

  // Checks an MPI call's return code; throws PeerError with MPI's text.
  void check(int code, const OpContext& op, const char* call) const;
  // Waits for `request` until op's deadline (see runtime.h). `peer` is the
  // rank waited for when there is one (send/recv), else -1. On timeout the
  // request is abandoned and TimeoutError thrown. `status`, if given,
  // receives the request's status.
  void wait(MPI_Request& request, const OpContext& op, const char* call, std::size_t bytes, int peer = -1,
            MPI_Status* status = MPI_STATUS_IGNORE);
  std::chrono::nanoseconds spin_for(std::size_t bytes) const;
  // recv and recv_any: receives a message from `from` (a rank or
  // MPI_ANY_SOURCE) and returns its sender.
  int receive(const OpContext& op, Buffer data, int from, int tag);

  MPI_Comm create_communicator(const BackendContext& ctx);

  int rank_;
  int size_;
  std::string self_;
  Logger log_;
  std::size_t max_count_;  // elements (or bytes) per MPI call
  bool crowded_ = false;   // more ranks on this host than cores
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::optional<ReductionOps> ops_;  // created once MPI is initialised
  Scratch accumulation_;  // fp32 copy of 16-bit inputs, or a copy of overlapping inputs
  Scratch staging_;       // fp32 output of a 16-bit reduce_scatter; received mismatched payloads
  Scratch header_;        // the send/recv header
  Scratch layouts_;       // counts and displacements of MPI's v-collectives
  bool abandoned_ = false;  // a request timed out: MPI may still use comm_, ops_ and the scratch
};

}  // namespace lockstep::mpi
