// The elementwise device work a Reducer's CUDA buckets need (scaling, and
// the 16-bit conversions of the compression hooks), each queued on a
// stream of the current device. Compiled by nvcc (bucket_kernels.cu), the
// only device code in lockstep; this header is plain C++17 with no
// lockstep types, so that nvcc needs nothing newer. Each launch throws
// std::runtime_error when the launch fails. Thread-safe (launches only).
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace lockstep::cuda {

// The 16-bit floating types the kernels convert to and from.
enum class Half16 { f16, bf16 };

// data[0, count) *= factor, computed in double and rounded once to the
// element type, as the host's scaling does.
void launch_scale_f32(float* data, std::size_t count, double factor, cudaStream_t stream);
void launch_scale_f64(double* data, std::size_t count, double factor, cudaStream_t stream);
void launch_scale_16(void* data, std::size_t count, Half16 type, double factor, cudaStream_t stream);
// out[i] = in[i] * factor (in fp32), rounded to `type` to nearest even.
void launch_narrow(const float* in, void* out, std::size_t count, float factor, Half16 type, cudaStream_t stream);
// out[i] = in[i] widened from `type` to fp32.
void launch_widen(const void* in, float* out, std::size_t count, Half16 type, cudaStream_t stream);

}  // namespace lockstep::cuda
