// PowerSGD's linear algebra on CUDA memory (ddp/low_rank.h computes the same
// on the host, and says what each function computes): fp32 row-major
// matrices, sums accumulated in double in the host's order where a thread
// owns a sum, each call queued on `stream`. Compiled by nvcc
// (low_rank_kernels.cu); plain C++17 with no lockstep types, as
// bucket_kernels.h. A failed launch throws std::runtime_error. Thread-safe
// (launches only).
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace lockstep::cuda {

// p (n x r) = a (n x m) q (m x r).
void launch_low_rank_multiply(const float* a, std::size_t n, std::size_t m, const float* q, std::size_t r, float* p,
                              cudaStream_t stream);
// q (m x r) = a^T p, a is n x m and p n x r.
void launch_low_rank_multiply_transposed(const float* a, std::size_t n, std::size_t m, const float* p, std::size_t r,
                                         float* q, cudaStream_t stream);
// a (n x m) = p q^T.
void launch_low_rank_reconstruct(const float* p, const float* q, std::size_t n, std::size_t m, std::size_t r, float* a,
                                 cudaStream_t stream);
// The r columns of p (n x r) orthonormal, in double, as low_rank::orthogonalize
// (one block; its double copy of p is allocated and freed on `stream`).
void launch_low_rank_orthogonalize(float* p, std::size_t n, std::size_t r, double epsilon, cudaStream_t stream);
// Error feedback: m[i] += e[i], then e[i] = m[i].
void launch_feedback_add(float* m, float* e, std::size_t count, cudaStream_t stream);
// e[i] -= m[i].
void launch_feedback_subtract(float* e, const float* m, std::size_t count, cudaStream_t stream);

}  // namespace lockstep::cuda
