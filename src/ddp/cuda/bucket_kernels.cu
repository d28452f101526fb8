// See bucket_kernels.h. Grid-stride loops: a bounded grid covers any count.
#include "ddp/cuda/bucket_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace lockstep::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr std::size_t kMaxBlocks = 4096;

unsigned blocks_for(std::size_t count) {
  return static_cast<unsigned>(std::min<std::size_t>((count + kThreads - 1) / kThreads, kMaxBlocks));
}

// A launch error names the kernel; the caller's message adds what it was doing.
void check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("launching ") + kernel + ": CUDA error " + cudaGetErrorName(status) + " (" +
                             cudaGetErrorString(status) + ")");
}

__device__ std::size_t first_index() { return blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; }
__device__ std::size_t stride() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

__global__ void scale_f32(float* p, std::size_t n, double factor) {
  for (std::size_t i = first_index(); i < n; i += stride()) p[i] = static_cast<float>(p[i] * factor);
}
__global__ void scale_f64(double* p, std::size_t n, double factor) {
  for (std::size_t i = first_index(); i < n; i += stride()) p[i] *= factor;
}
__global__ void scale_f16(__half* p, std::size_t n, double factor) {
  for (std::size_t i = first_index(); i < n; i += stride())
    p[i] = __double2half(static_cast<double>(__half2float(p[i])) * factor);
}
__global__ void scale_bf16(__nv_bfloat16* p, std::size_t n, double factor) {
  for (std::size_t i = first_index(); i < n; i += stride())
    p[i] = __double2bfloat16(static_cast<double>(__bfloat162float(p[i])) * factor);
}

__global__ void narrow_f16(const float* in, __half* out, std::size_t n, float factor) {
  for (std::size_t i = first_index(); i < n; i += stride()) out[i] = __float2half_rn(in[i] * factor);
}
__global__ void narrow_bf16(const float* in, __nv_bfloat16* out, std::size_t n, float factor) {
  for (std::size_t i = first_index(); i < n; i += stride()) out[i] = __float2bfloat16_rn(in[i] * factor);
}
__global__ void widen_f16(const __half* in, float* out, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += stride()) out[i] = __half2float(in[i]);
}
__global__ void widen_bf16(const __nv_bfloat16* in, float* out, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += stride()) out[i] = __bfloat162float(in[i]);
}

}  // namespace

void launch_scale_f32(float* data, std::size_t count, double factor, cudaStream_t stream) {
  if (count == 0) return;
  scale_f32<<<blocks_for(count), kThreads, 0, stream>>>(data, count, factor);
  check_launch("the scaling kernel");
}

void launch_scale_f64(double* data, std::size_t count, double factor, cudaStream_t stream) {
  if (count == 0) return;
  scale_f64<<<blocks_for(count), kThreads, 0, stream>>>(data, count, factor);
  check_launch("the scaling kernel");
}

void launch_scale_16(void* data, std::size_t count, Half16 type, double factor, cudaStream_t stream) {
  if (count == 0) return;
  if (type == Half16::f16)
    scale_f16<<<blocks_for(count), kThreads, 0, stream>>>(static_cast<__half*>(data), count, factor);
  else
    scale_bf16<<<blocks_for(count), kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(data), count, factor);
  check_launch("the scaling kernel");
}

void launch_narrow(const float* in, void* out, std::size_t count, float factor, Half16 type, cudaStream_t stream) {
  if (count == 0) return;
  if (type == Half16::f16)
    narrow_f16<<<blocks_for(count), kThreads, 0, stream>>>(in, static_cast<__half*>(out), count, factor);
  else
    narrow_bf16<<<blocks_for(count), kThreads, 0, stream>>>(in, static_cast<__nv_bfloat16*>(out), count, factor);
  check_launch("the narrowing kernel");
}

void launch_widen(const void* in, float* out, std::size_t count, Half16 type, cudaStream_t stream) {
  if (count == 0) return;
  if (type == Half16::f16)
    widen_f16<<<blocks_for(count), kThreads, 0, stream>>>(static_cast<const __half*>(in), out, count);
  else
    widen_bf16<<<blocks_for(count), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(in), out, count);
  check_launch("the widening kernel");
}

}  // namespace lockstep::cuda
