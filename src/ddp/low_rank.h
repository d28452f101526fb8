// The dense linear algebra of PowerSGD on row-major fp32 matrices: the
// products with a thin matrix, orthogonalisation and seeded Gaussian draws.
// Sums are accumulated in double, so results do not depend on the library
// or the machine beyond the final rounding. Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lockstep::low_rank {

// p (n x r) = a (n x m) q (m x r).
void multiply(const float* a, std::size_t n, std::size_t m, const float* q, std::size_t r, float* p);
// q (m x r) = a^T p, a is n x m and p n x r.
void multiply_transposed(const float* a, std::size_t n, std::size_t m, const float* p, std::size_t r, float* q);
// a (n x m) = p q^T, p is n x r and q m x r.
void reconstruct(const float* p, const float* q, std::size_t n, std::size_t m, std::size_t r, float* a);
// Makes the r columns of p (n x r) orthonormal, in order (modified
// Gram-Schmidt); each column is divided by its norm + epsilon. A column
// that is (numerically) zero is left zero.
void orthogonalize(float* p, std::size_t n, std::size_t r, double epsilon);
// x[0, count) from N(0, 1), a function of `seed` only.
void fill_gaussian(float* x, std::size_t count, std::uint64_t seed);

}  // namespace lockstep::low_rank
