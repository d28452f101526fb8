// See low_rank_kernels.h. The matrices PowerSGD multiplies are one large
// (the gradient, n x m) and one thin (r columns, r small): each product is
// one pass over the large matrix, r/kChunk times. Correctness first: these
// mirror low_rank.cc's loops (the same double sums, in the same order where
// one thread owns a sum), not a tuned GEMM.
#include "ddp/cuda/low_rank_kernels.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace lockstep::cuda {
namespace {

constexpr unsigned kThreads = 256;  // a power of two: block_sum halves it
constexpr std::size_t kMaxBlocks = 4096;
constexpr std::size_t kChunk = 8;  // columns of the thin matrix summed per pass

unsigned blocks_for(std::size_t count) {
  return static_cast<unsigned>(std::max<std::size_t>(1, std::min<std::size_t>((count + kThreads - 1) / kThreads, kMaxBlocks)));
}

void check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("launching ") + kernel + ": CUDA error " + cudaGetErrorName(status) + " (" +
                             cudaGetErrorString(status) + ")");
}

void check_call(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": CUDA error " + cudaGetErrorName(status) + " (" +
                             cudaGetErrorString(status) + ")");
}

__device__ std::size_t first_index() { return blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; }
__device__ std::size_t stride() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

// The sum of every thread's v, returned to every thread of the block.
// Every thread of the block must call it (it synchronises them).
__device__ double block_sum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();
  return total;
}

// One block per row of a (grid-stride over rows); its threads split the
// row and the block sums their parts.
__global__ void multiply_kernel(const float* a, std::size_t n, std::size_t m, const float* q, std::size_t r,
                                float* p) {
  __shared__ double shared[kThreads];
  for (std::size_t i = blockIdx.x; i < n; i += gridDim.x) {
    const float* ai = a + i * m;
    for (std::size_t k0 = 0; k0 < r; k0 += kChunk) {
      const std::size_t width = r - k0 < kChunk ? r - k0 : kChunk;
      double acc[kChunk] = {};
      for (std::size_t j = threadIdx.x; j < m; j += blockDim.x) {
        const double aij = ai[j];
        const float* qj = q + j * r + k0;
        for (std::size_t k = 0; k < width; ++k) acc[k] += aij * qj[k];
      }
      for (std::size_t k = 0; k < width; ++k) {
        const double total = block_sum(acc[k], shared);
        if (threadIdx.x == 0) p[i * r + k0 + k] = static_cast<float>(total);
      }
    }
  }
}

// One thread per column j of a: its sums run over the rows in order, as
// the host's do.
__global__ void multiply_transposed_kernel(const float* a, std::size_t n, std::size_t m, const float* p, std::size_t r,
                                           float* q) {
  for (std::size_t j = first_index(); j < m; j += stride()) {
    for (std::size_t k0 = 0; k0 < r; k0 += kChunk) {
      const std::size_t width = r - k0 < kChunk ? r - k0 : kChunk;
      double acc[kChunk] = {};
      for (std::size_t i = 0; i < n; ++i) {
        const double aij = a[i * m + j];
        const float* pi = p + i * r + k0;
        for (std::size_t k = 0; k < width; ++k) acc[k] += aij * pi[k];
      }
      for (std::size_t k = 0; k < width; ++k) q[j * r + k0 + k] = static_cast<float>(acc[k]);
    }
  }
}

__global__ void reconstruct_kernel(const float* p, const float* q, std::size_t n, std::size_t m, std::size_t r,
                                   float* a) {
  for (std::size_t x = first_index(); x < n * m; x += stride()) {
    const std::size_t i = x / m, j = x % m;
    double v = 0;
    for (std::size_t k = 0; k < r; ++k) v += static_cast<double>(p[i * r + k]) * q[j * r + k];
    a[x] = static_cast<float>(v);
  }
}

// Modified Gram-Schmidt in one block over `work` (p in double), each
// projection twice, as low_rank::orthogonalize (see there for why, and for
// the columns that become zero). Each thread owns the same rows
// throughout, the copies in and out included, so only the sums need the
// block. (The copies once strode over elements instead: a thread read rows
// that another warp had not copied in yet, and wrote out rows another was
// still normalising, which made PowerSGD on a GPU differ from the CPU by
// 2% at 2 ranks. compute-sanitizer's racecheck sees only shared memory;
// initcheck sees the reads of scratch not yet written.)
__global__ void orthogonalize_kernel(float* p, double* work, std::size_t n, std::size_t r, double epsilon) {
  __shared__ double shared[kThreads];
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x)
    for (std::size_t c = 0; c < r; ++c) work[i * r + c] = p[i * r + c];
  const auto column_norm = [&](std::size_t c) {
    double local = 0;
    for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) local += work[i * r + c] * work[i * r + c];
    return sqrt(block_sum(local, shared));
  };
  for (std::size_t c = 0; c < r; ++c) {
    const double before = column_norm(c);
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t k = 0; k < c; ++k) {
        double local = 0;
        for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) local += work[i * r + c] * work[i * r + k];
        const double dot = block_sum(local, shared);
        for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) work[i * r + c] -= dot * work[i * r + k];
      }
    }
    const double norm = column_norm(c);
    const bool vanished = norm <= before * 1e-12 || norm + epsilon == 0;
    for (std::size_t i = threadIdx.x; i < n; i += blockDim.x)
      work[i * r + c] = vanished ? 0.0 : work[i * r + c] / (norm + epsilon);
  }
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x)
    for (std::size_t c = 0; c < r; ++c) p[i * r + c] = static_cast<float>(work[i * r + c]);
}

__global__ void feedback_add_kernel(float* m, float* e, std::size_t count) {
  for (std::size_t i = first_index(); i < count; i += stride()) {
    m[i] += e[i];
    e[i] = m[i];
  }
}

__global__ void feedback_subtract_kernel(float* e, const float* m, std::size_t count) {
  for (std::size_t i = first_index(); i < count; i += stride()) e[i] -= m[i];
}

}  // namespace

void launch_low_rank_multiply(const float* a, std::size_t n, std::size_t m, const float* q, std::size_t r, float* p,
                              cudaStream_t stream) {
  if (n == 0 || r == 0) return;
  multiply_kernel<<<static_cast<unsigned>(std::min(n, kMaxBlocks)), kThreads, 0, stream>>>(a, n, m, q, r, p);
  check_launch("PowerSGD's product M Q");
}

void launch_low_rank_multiply_transposed(const float* a, std::size_t n, std::size_t m, const float* p, std::size_t r,
                                         float* q, cudaStream_t stream) {
  if (m == 0 || r == 0) return;
  multiply_transposed_kernel<<<blocks_for(m), kThreads, 0, stream>>>(a, n, m, p, r, q);
  check_launch("PowerSGD's product M^T P");
}

void launch_low_rank_reconstruct(const float* p, const float* q, std::size_t n, std::size_t m, std::size_t r, float* a,
                                 cudaStream_t stream) {
  if (n * m == 0) return;
  reconstruct_kernel<<<blocks_for(n * m), kThreads, 0, stream>>>(p, q, n, m, r, a);
  check_launch("PowerSGD's reconstruction P Q^T");
}

void launch_low_rank_orthogonalize(float* p, std::size_t n, std::size_t r, double epsilon, cudaStream_t stream) {
  if (n * r == 0) return;
  void* work = nullptr;
  check_call(cudaMallocAsync(&work, n * r * sizeof(double), stream), "allocating PowerSGD's orthogonalisation scratch");
  orthogonalize_kernel<<<1, kThreads, 0, stream>>>(p, static_cast<double*>(work), n, r, epsilon);
  const cudaError_t launched = cudaGetLastError();
  check_call(cudaFreeAsync(work, stream), "freeing PowerSGD's orthogonalisation scratch");
  check_call(launched, "launching PowerSGD's orthogonalisation");
}

void launch_feedback_add(float* m, float* e, std::size_t count, cudaStream_t stream) {
  if (count == 0) return;
  feedback_add_kernel<<<blocks_for(count), kThreads, 0, stream>>>(m, e, count);
  check_launch("PowerSGD's error feedback");
}

void launch_feedback_subtract(float* e, const float* m, std::size_t count, cudaStream_t stream) {
  if (count == 0) return;
  feedback_subtract_kernel<<<blocks_for(count), kThreads, 0, stream>>>(e, m, count);
  check_launch("PowerSGD's error feedback");
}

}  // namespace lockstep::cuda
