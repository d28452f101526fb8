// Vocabulary types shared by every layer: element types, reduction operators,
// collective names, and the untyped buffer views the collectives work on.
// All types here are plain values; thread-safe to copy and read.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace lockstep {

// Element types of a buffer. 16-bit floats are reduced in fp32 and rounded
// once, so a sum of many small values does not drift.
enum class DType : std::uint8_t { f32, f64, f16, bf16, i32, i64, u8 };
inline constexpr DType kAllDTypes[] = {DType::f32,  DType::f64, DType::f16, DType::bf16,
                                       DType::i32, DType::i64, DType::u8};

// Reduction operators. `avg` is `sum` divided by the group size (truncating for
// integer types). `premul_sum` is PyTorch's PREMUL_SUM: every rank's input is
// multiplied by a factor, then summed; it needs its factor, so it is passed
// as a Reduction (Reduction::premul_sum), and only floating types take it.
enum class ReduceOp : std::uint8_t { sum, avg, min, max, prod, premul_sum };
// The operators that need nothing but their name (premul_sum needs a factor).
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min,
                                             ReduceOp::max, ReduceOp::prod};

// A reduction as the collectives take it: an operator, plus the factor of
// premul_sum. Converts from a ReduceOp, so `ReduceOp::sum` is a Reduction.
struct Reduction {
  ReduceOp op = ReduceOp::sum;
  double factor = 1.0;  // premul_sum only

  Reduction() = default;
  Reduction(ReduceOp o) : op(o) {}  // NOLINT: implicit on purpose
  static Reduction premul_sum(double factor) {
    Reduction r(ReduceOp::premul_sum);
    r.factor = factor;
    return r;
  }
};

enum class Collective : std::uint8_t {
  allreduce,
  broadcast,
  allgather,
  reduce_scatter,
  reduce,
  barrier,
  send,
  recv,
  gather,
  scatter,
  all_to_all,   // with equal blocks, or per-rank counts
  allgather_v,  // allgather with per-rank counts
};

using Duration = std::chrono::milliseconds;

std::size_t dtype_size(DType dtype);
bool is_floating(DType dtype);

// Element `i` of a buffer of `dtype`, read as a double (16-bit floats
// widened exactly, integers as stored).
double load_as_double(const void* buffer, DType dtype, std::size_t i);
// Stores `value` into element `i` of a buffer of `dtype`: floats rounded to
// nearest even, integers truncated toward zero and then wrapped to the
// element's width as C does (-1 becomes 255 in uint8).
void store_from_double(void* buffer, DType dtype, std::size_t i, double value);
std::string_view to_string(DType dtype);
std::string_view to_string(ReduceOp op);
std::string_view to_string(Collective collective);

// Accepts the names nccl-tests and PyTorch use: "float", "f32", "float32",
// "half", "f16", "bfloat16", "bf16", "double", "int32", "int", "int64",
// "uint8", ...
std::optional<DType> parse_dtype(std::string_view name);
std::ostream& operator<<(std::ostream& out, DType dtype);
std::ostream& operator<<(std::ostream& out, ReduceOp op);
std::ostream& operator<<(std::ostream& out, Collective collective);
std::optional<ReduceOp> parse_reduce_op(std::string_view name);
std::optional<Collective> parse_collective(std::string_view name);

// Where a buffer's memory is: the host, or CUDA device `index`.
enum class DeviceKind : std::uint8_t { host, cuda };
struct Device {
  DeviceKind kind = DeviceKind::host;
  int index = 0;  // cuda only

  static Device host() { return {}; }
  static Device cuda(int index) { return {DeviceKind::cuda, index}; }
  bool is_cuda() const { return kind == DeviceKind::cuda; }
  friend bool operator==(const Device&, const Device&) = default;
};
// "host", "cuda:0".
std::string to_string(Device device);

// A typed view of memory a collective reads and writes. The memory belongs to
// the caller and must stay valid until the collective's Work is done.
//
// CUDA memory (device = Device::cuda(n)) also names the stream whose work
// writes and reads it (a cudaStream_t; null is the default stream). The
// collective runs after the work queued there before the call, and
// Work::wait() makes that stream wait for the collective (docs/algorithms.md,
// "CUDA memory and streams"). Host memory ignores `stream`.
struct Buffer {
  void* data = nullptr;
  std::size_t count = 0;
  DType dtype = DType::f32;
  Device device{};
  void* stream = nullptr;

  std::size_t bytes() const { return count * dtype_size(dtype); }
};

struct ConstBuffer {
  const void* data = nullptr;
  std::size_t count = 0;
  DType dtype = DType::f32;
  Device device{};
  void* stream = nullptr;

  ConstBuffer() = default;
  ConstBuffer(const void* d, std::size_t n, DType t, Device dev = {}, void* s = nullptr)
      : data(d), count(n), dtype(t), device(dev), stream(s) {}
  ConstBuffer(Buffer b)  // NOLINT: implicit on purpose
      : data(b.data), count(b.count), dtype(b.dtype), device(b.device), stream(b.stream) {}
  std::size_t bytes() const { return count * dtype_size(dtype); }
};

// What an operation is: enough to describe it in messages and diagnostics.
struct OpInfo {
  Collective collective = Collective::allreduce;
  DType dtype = DType::f32;
  std::size_t count = 0;          // elements (allgather, gather: per rank input; reduce_scatter, scatter: per rank
                                  // output; all_to_all: the block, or the total for per-rank counts; allgather_v: the total)
  ReduceOp op = ReduceOp::sum;    // for reductions
  int peer = -1;                  // root, destination or source; -1 if none (recv: from any rank)
  int tag = 0;                    // send/recv
  // Per-rank-count collectives (allgather_v, all_to_all with counts): a
  // digest of the counts every rank must agree on; 0 for the others. The
  // collective check compares it, so ranks with different counts fail.
  std::uint64_t counts_digest = 0;
  // Where the buffers are. Ranks must agree on the kind (host or CUDA), not
  // on the index: two ranks may use different GPUs.
  Device device{};

  std::size_t bytes() const { return count * dtype_size(dtype); }
};

// "allreduce #12 (float x 1000, sum)"; "... on cuda:0" for CUDA memory.
std::string describe(const OpInfo& info, std::uint64_t seq);

template <typename T>
struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::f32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::f64; };
template <> struct DTypeOf<std::int32_t> { static constexpr DType value = DType::i32; };
template <> struct DTypeOf<std::int64_t> { static constexpr DType value = DType::i64; };
template <> struct DTypeOf<std::uint8_t> { static constexpr DType value = DType::u8; };

// Views over typed spans, for the common case of native element types.
template <typename T>
Buffer view(std::span<T> s) {
  return Buffer{s.data(), s.size(), DTypeOf<std::remove_const_t<T>>::value};
}
template <typename T>
ConstBuffer const_view(std::span<const T> s) {
  return ConstBuffer{s.data(), s.size(), DTypeOf<T>::value};
}

}  // namespace lockstep
