// Tables for the vocabulary types in lockstep/types.h. Stateless; thread-safe.
#include "lockstep/types.h"

#include <cstdint>

#include <algorithm>
#include <array>
#include <cctype>
#include <ostream>
#include <string>
#include <utility>

#include "common/half.h"

namespace lockstep {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}

bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::f16 || dtype == DType::bf16;
}

double load_as_double(const void* buffer, DType dtype, std::size_t i) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(buffer)[i];
    case DType::f64: return static_cast<const double*>(buffer)[i];
    case DType::f16: return half_to_float(static_cast<const std::uint16_t*>(buffer)[i]);
    case DType::bf16: return bf16_to_float(static_cast<const std::uint16_t*>(buffer)[i]);
    case DType::i32: return static_cast<const std::int32_t*>(buffer)[i];
    case DType::i64: return static_cast<double>(static_cast<const std::int64_t*>(buffer)[i]);
    case DType::u8: return static_cast<const std::uint8_t*>(buffer)[i];
  }
  return 0;
}

void store_from_double(void* buffer, DType dtype, std::size_t i, double value) {
  // Through int64 first: converting a negative double straight to an
  // unsigned type is undefined, and wrapping is what integer tests expect.
  const auto whole = [value] { return static_cast<std::int64_t>(value); };
  switch (dtype) {
    case DType::f32: static_cast<float*>(buffer)[i] = static_cast<float>(value); break;
    case DType::f64: static_cast<double*>(buffer)[i] = value; break;
    case DType::f16: static_cast<std::uint16_t*>(buffer)[i] = float_to_half(static_cast<float>(value)); break;
    case DType::bf16: static_cast<std::uint16_t*>(buffer)[i] = float_to_bf16(static_cast<float>(value)); break;
    case DType::i32: static_cast<std::int32_t*>(buffer)[i] = static_cast<std::int32_t>(whole()); break;
    case DType::i64: static_cast<std::int64_t*>(buffer)[i] = whole(); break;
    case DType::u8: static_cast<std::uint8_t*>(buffer)[i] = static_cast<std::uint8_t>(whole()); break;
  }
}

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::f16: return "half";
    case DType::bf16: return "bfloat16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::u8: return "uint8";
  }
  return "?";
}

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::prod: return "prod";
    case ReduceOp::premul_sum: return "premul_sum";
  }
  return "?";
}

std::string_view to_string(Collective collective) {
  switch (collective) {
    case Collective::allreduce: return "allreduce";
    case Collective::broadcast: return "broadcast";
    case Collective::allgather: return "allgather";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::reduce: return "reduce";
    case Collective::barrier: return "barrier";
    case Collective::send: return "send";
    case Collective::recv: return "recv";
    case Collective::gather: return "gather";
    case Collective::scatter: return "scatter";
    case Collective::all_to_all: return "all_to_all";
    case Collective::allgather_v: return "allgather_v";
  }
  return "?";
}

std::string to_string(Device device) {
  return device.is_cuda() ? "cuda:" + std::to_string(device.index) : "host";
}

std::ostream& operator<<(std::ostream& out, DType dtype) { return out << to_string(dtype); }
std::ostream& operator<<(std::ostream& out, ReduceOp op) { return out << to_string(op); }
std::ostream& operator<<(std::ostream& out, Collective collective) { return out << to_string(collective); }

std::string describe(const OpInfo& info, std::uint64_t seq) {
  std::string details;
  const std::string shape = std::string(to_string(info.dtype)) + " x " + std::to_string(info.count);
  switch (info.collective) {
    case Collective::allreduce:
    case Collective::reduce_scatter:
      details = shape + ", " + std::string(to_string(info.op));
      break;
    case Collective::reduce:
      details = shape + ", " + std::string(to_string(info.op)) + ", root " + std::to_string(info.peer);
      break;
    case Collective::broadcast: details = shape + ", root " + std::to_string(info.peer); break;
    case Collective::allgather: details = shape; break;
    case Collective::gather:
    case Collective::scatter: details = shape + ", root " + std::to_string(info.peer); break;
    case Collective::all_to_all:
      details = shape + (info.counts_digest != 0 ? " in all, per-rank counts" : " per rank");
      break;
    case Collective::allgather_v: details = shape + " in all, per-rank counts"; break;
    case Collective::barrier: break;
    case Collective::send:
      details = shape + " to rank " + std::to_string(info.peer) + ", tag " + std::to_string(info.tag);
      break;
    case Collective::recv:
      details = shape + (info.peer < 0 ? std::string(" from any rank") : " from rank " + std::to_string(info.peer)) +
                ", tag " + std::to_string(info.tag);
      break;
  }
  if (info.device.is_cuda()) details += (details.empty() ? "" : ", ") + std::string("on ") + to_string(info.device);
  std::string out = std::string(to_string(info.collective)) + " #" + std::to_string(seq);
  if (!details.empty()) out += " (" + details + ")";
  return out;
}

std::optional<DType> parse_dtype(std::string_view name) {
  static constexpr std::array<std::pair<std::string_view, DType>, 18> kNames{{
      {"float", DType::f32},   {"f32", DType::f32},       {"float32", DType::f32},
      {"double", DType::f64},  {"f64", DType::f64},       {"float64", DType::f64},
      {"half", DType::f16},    {"f16", DType::f16},       {"float16", DType::f16},
      {"bfloat16", DType::bf16}, {"bf16", DType::bf16},   {"int32", DType::i32},
      {"int", DType::i32},     {"i32", DType::i32},       {"int64", DType::i64},
      {"i64", DType::i64},     {"uint8", DType::u8},      {"u8", DType::u8},
  }};
  const std::string key = lower(name);
  for (const auto& [n, t] : kNames)
    if (n == key) return t;
  return std::nullopt;
}

std::optional<ReduceOp> parse_reduce_op(std::string_view name) {
  const std::string key = lower(name);
  for (ReduceOp op : kAllReduceOps)
    if (to_string(op) == key) return op;
  if (key == "mean") return ReduceOp::avg;
  if (key == "product") return ReduceOp::prod;
  if (key == "premul_sum") return ReduceOp::premul_sum;
  return std::nullopt;
}

std::optional<Collective> parse_collective(std::string_view name) {
  const std::string key = lower(name);
  for (int i = 0; i <= static_cast<int>(Collective::allgather_v); ++i) {
    const auto c = static_cast<Collective>(i);
    if (to_string(c) == key) return c;
  }
  if (key == "all_reduce") return Collective::allreduce;
  if (key == "all_gather") return Collective::allgather;
  if (key == "reducescatter") return Collective::reduce_scatter;
  if (key == "alltoall" || key == "all_to_all_single") return Collective::all_to_all;
  if (key == "allgatherv" || key == "all_gather_v") return Collective::allgather_v;
  return std::nullopt;
}

}  // namespace lockstep
