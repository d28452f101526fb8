// tcp backend construction, shutdown and factory, and its collectives: the
// shared ones of comm/algorithms/ over the mesh. Point to point is in
// send_recv.cc.
#include "comm/tcp/tcp_backend.h"

namespace lockstep {

TcpBackend::TcpBackend(const BackendContext& ctx)
    : mesh_(ctx), collectives_(mesh_, ctx.tcp_small_bytes ? ctx.tcp_small_bytes : kDefaultSmallBytes) {}

void TcpBackend::shutdown(Deadline deadline) { mesh_.goodbye(deadline); }

void TcpBackend::allreduce(const OpContext& op, Buffer data, ReduceOp reduce_op) {
  collectives_.allreduce(op, data, reduce_op);
}
void TcpBackend::broadcast(const OpContext& op, Buffer data, int root) { collectives_.broadcast(op, data, root); }
void TcpBackend::allgather(const OpContext& op, ConstBuffer input, Buffer output) {
  collectives_.allgather(op, input, output);
}
void TcpBackend::reduce_scatter(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) {
  collectives_.reduce_scatter(op, input, output, reduce_op);
}
void TcpBackend::reduce(const OpContext& op, Buffer data, int root, ReduceOp reduce_op) {
  collectives_.reduce(op, data, root, reduce_op);
}
void TcpBackend::barrier(const OpContext& op) { collectives_.barrier(op); }
void TcpBackend::gather(const OpContext& op, ConstBuffer input, Buffer output, int root) {
  collectives_.gather(op, input, output, root);
}
void TcpBackend::scatter(const OpContext& op, ConstBuffer input, Buffer output, int root) {
  collectives_.scatter(op, input, output, root);
}
void TcpBackend::all_to_all(const OpContext& op, ConstBuffer input, Buffer output, const BlockCounts& counts) {
  collectives_.all_to_all(op, input, output, counts);
}
void TcpBackend::allgather_v(const OpContext& op, ConstBuffer input, Buffer output,
                             const std::vector<std::size_t>& counts) {
  collectives_.allgather_v(op, input, output, counts);
}

std::unique_ptr<Backend> make_tcp_backend(const BackendContext& ctx) { return std::make_unique<TcpBackend>(ctx); }

}  // namespace lockstep
