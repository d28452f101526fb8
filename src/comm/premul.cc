// See premul.h.
#include "comm/premul.h"

#include <cstdint>

#include "common/half.h"

namespace lockstep {
namespace {

template <typename T, typename Scale>
void scale_all(void* dst, const void* src, std::size_t count, Scale factor) {
  const T* in = static_cast<const T*>(src);
  T* out = static_cast<T*>(dst);
  for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<T>(in[i] * factor);
}

template <float (*Widen)(std::uint16_t), std::uint16_t (*Narrow)(float)>
void scale_16(void* dst, const void* src, std::size_t count, float factor) {
  const auto* in = static_cast<const std::uint16_t*>(src);
  auto* out = static_cast<std::uint16_t*>(dst);
  for (std::size_t i = 0; i < count; ++i) out[i] = Narrow(Widen(in[i]) * factor);
}

}  // namespace

void premultiply(void* dst, const void* src, std::size_t count, DType dtype, double factor) {
  switch (dtype) {
    case DType::f32: return scale_all<float>(dst, src, count, static_cast<float>(factor));
    case DType::f64: return scale_all<double>(dst, src, count, factor);
    case DType::f16: return scale_16<half_to_float, float_to_half>(dst, src, count, static_cast<float>(factor));
    case DType::bf16: return scale_16<bf16_to_float, float_to_bf16>(dst, src, count, static_cast<float>(factor));
    default: break;  // the front end refuses integer types
  }
}

}  // namespace lockstep
