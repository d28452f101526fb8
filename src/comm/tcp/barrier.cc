// tcp barrier: dissemination. In round k every rank sends one byte to
// rank + 2^k and waits for one from rank - 2^k; after ceil(log2 n) rounds
// every rank has (transitively) heard from every other. Works for any n.
#include "comm/tcp/tcp_backend.h"
#include "comm/tcp/transfer.h"

namespace lockstep {

void TcpBackend::barrier(const OpContext& op) {
  const int n = mesh_.size();
  const int r = mesh_.rank();
  for (int distance = 1; distance < n; distance <<= 1) {
    const unsigned char token = 1;
    unsigned char got = 0;
    BufferSource source(&token, 1);
    BufferSink sink(&got, 1);
    const Channel channels[] = {{(r + distance) % n, &source, nullptr}, {(r - distance + n) % n, nullptr, &sink}};
    run_transfer(mesh_, op, channels);
  }
}

}  // namespace lockstep
