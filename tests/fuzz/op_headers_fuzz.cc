// Fuzz target: the bytes a peer puts in front of its data, which a rank
// reads straight off a socket or out of shared memory: the point-to-point
// header (p2p_header.h) and the collective stamps (op_stamp.h: the wire
// stamp of tcp, the round and inline stamps of shm). Whatever a peer (or a
// corrupted stream) sends, checking it either accepts it or throws a
// MismatchError whose message names what was received; it never reads out
// of bounds or formats an enum value it does not know as undefined
// behaviour.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "comm/op_stamp.h"
#include "comm/p2p_header.h"
#include "lockstep/error.h"

namespace {

template <typename T>
T take(const std::uint8_t*& data, std::size_t& size) {
  T value{};
  const std::size_t n = size < sizeof value ? size : sizeof value;
  std::memcpy(&value, data, n);
  data += n;
  size -= n;
  return value;
}

// This rank's own operation, from the first bytes (kept in range: it comes
// from the program, which the front end has validated).
lockstep::OpContext own_operation(const std::uint8_t*& data, std::size_t& size) {
  using namespace lockstep;
  OpContext op;
  op.seq = take<std::uint16_t>(data, size);
  op.info.collective = static_cast<Collective>(take<std::uint8_t>(data, size) % (static_cast<int>(Collective::recv) + 1));
  op.info.dtype = static_cast<DType>(take<std::uint8_t>(data, size) % std::size(kAllDTypes));
  op.info.op = static_cast<ReduceOp>(take<std::uint8_t>(data, size) % std::size(kAllReduceOps));
  op.info.count = take<std::uint16_t>(data, size);
  op.info.peer = take<std::uint8_t>(data, size) % 8 - 1;
  return op;
}

template <typename Check>
void expect_accept_or_mismatch(Check check) {
  try {
    check();
  } catch (const lockstep::MismatchError& e) {
    if (std::strlen(e.what()) == 0) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace lockstep;
  const OpContext op = own_operation(data, size);
  const std::string self = "rank 0/2";

  const auto header = take<P2pHeader>(data, size);
  Buffer expected{nullptr, op.info.count, op.info.dtype};
  if (!p2p_matches(header, expected, op.info.tag))
    expect_accept_or_mismatch([&] { throw_p2p_mismatch(header, self, op, 1, expected, op.info.tag); });

  const auto wire = take<WireStamp>(data, size);
  expect_accept_or_mismatch([&] { check_wire_stamp(op, wire, 1, self); });
  const auto what = take<std::uint64_t>(data, size);
  const auto count = take<std::uint64_t>(data, size);
  expect_accept_or_mismatch([&] { check_round_stamp(op, what, count, 1, self); });
  const auto inline_stamp_bits = take<std::uint32_t>(data, size);
  expect_accept_or_mismatch([&] { check_inline_stamp(op, inline_stamp_bits, 1, self); });
  return 0;
}
