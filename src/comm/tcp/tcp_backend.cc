// tcp backend construction, shutdown and factory; the collectives live in
// one file each beside this one.
#include "comm/tcp/tcp_backend.h"

namespace lockstep {

TcpBackend::TcpBackend(const BackendContext& ctx)
    : mesh_(ctx), small_bytes_(ctx.tcp_small_bytes ? ctx.tcp_small_bytes : kDefaultSmallBytes) {}

void TcpBackend::shutdown(Deadline deadline) { mesh_.goodbye(deadline); }

std::unique_ptr<Backend> make_tcp_backend(const BackendContext& ctx) { return std::make_unique<TcpBackend>(ctx); }

}  // namespace lockstep
