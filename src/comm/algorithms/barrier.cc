// Barrier by dissemination. In round k every rank sends one byte to
// rank + 2^k and waits for one from rank - 2^k; after ceil(log2 n) rounds
// every rank has (transitively) heard from every other. Works for any n.
#include "comm/algorithms/collectives.h"

namespace lockstep {

void TransportCollectives::barrier(const OpContext& op) {
  const int n = transport_.size();
  const int r = transport_.rank();
  for (int distance = 1; distance < n; distance <<= 1) {
    const unsigned char token = 1;
    unsigned char got = 0;
    BufferSource source(&token, 1);
    BufferSink sink(&got, 1);
    const Channel channels[] = {{(r + distance) % n, &source, nullptr}, {(r - distance + n) % n, nullptr, &sink}};
    transport_.transfer(op, channels);
  }
}

}  // namespace lockstep
