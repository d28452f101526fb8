// See low_rank.h. r is small (1 to a few dozen), so each product is one pass
// over the large matrix with the r-wide row of the thin one in cache.
#include "ddp/low_rank.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace lockstep::low_rank {

void multiply(const float* a, std::size_t n, std::size_t m, const float* q, std::size_t r, float* p) {
  std::vector<double> row(r);
  for (std::size_t i = 0; i < n; ++i) {
    std::fill(row.begin(), row.end(), 0.0);
    const float* ai = a + i * m;
    for (std::size_t j = 0; j < m; ++j) {
      const double aij = ai[j];
      const float* qj = q + j * r;
      for (std::size_t k = 0; k < r; ++k) row[k] += aij * qj[k];
    }
    for (std::size_t k = 0; k < r; ++k) p[i * r + k] = static_cast<float>(row[k]);
  }
}

void multiply_transposed(const float* a, std::size_t n, std::size_t m, const float* p, std::size_t r, float* q) {
  std::vector<double> sum(m * r, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    const float* ai = a + i * m;
    const float* pi = p + i * r;
    for (std::size_t j = 0; j < m; ++j) {
      const double aij = ai[j];
      double* sj = sum.data() + j * r;
      for (std::size_t k = 0; k < r; ++k) sj[k] += aij * pi[k];
    }
  }
  for (std::size_t x = 0; x < m * r; ++x) q[x] = static_cast<float>(sum[x]);
}

void reconstruct(const float* p, const float* q, std::size_t n, std::size_t m, std::size_t r, float* a) {
  for (std::size_t i = 0; i < n; ++i) {
    const float* pi = p + i * r;
    float* ai = a + i * m;
    for (std::size_t j = 0; j < m; ++j) {
      const float* qj = q + j * r;
      double v = 0;
      for (std::size_t k = 0; k < r; ++k) v += static_cast<double>(pi[k]) * qj[k];
      ai[j] = static_cast<float>(v);
    }
  }
}

namespace {
double column_norm(const std::vector<double>& a, std::size_t n, std::size_t r, std::size_t c) {
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += a[i * r + c] * a[i * r + c];
  return std::sqrt(sum);
}
}  // namespace

void orthogonalize(float* p, std::size_t n, std::size_t r, double epsilon) {
  // In double, and each projection twice ("twice is enough"): a column
  // nearly dependent on the earlier ones (a gradient of lower rank than r,
  // as a Linear layer's over a small batch is) keeps only rounding noise
  // after one pass, which one pass would leave far from orthogonal.
  std::vector<double> a(p, p + n * r);
  for (std::size_t c = 0; c < r; ++c) {
    const double before = column_norm(a, n, r, c);
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t k = 0; k < c; ++k) {
        double dot = 0;
        for (std::size_t i = 0; i < n; ++i) dot += a[i * r + c] * a[i * r + k];
        for (std::size_t i = 0; i < n; ++i) a[i * r + c] -= dot * a[i * r + k];
      }
    }
    const double norm = column_norm(a, n, r, c);
    // What is left of a column that lay in the earlier columns' span (a
    // gradient of rank below r) is double rounding, in no direction in
    // particular: normalised, it would not be orthogonal to the others, so
    // it becomes zero, as does a zero column (instead of 0/0, whose NaNs
    // would spread to every rank). Neither changes the span.
    if (norm <= before * 1e-12 || norm + epsilon == 0) {
      for (std::size_t i = 0; i < n; ++i) a[i * r + c] = 0;
      continue;
    }
    for (std::size_t i = 0; i < n; ++i) a[i * r + c] /= norm + epsilon;
  }
  for (std::size_t x = 0; x < n * r; ++x) p[x] = static_cast<float>(a[x]);
}

// Box-Muller over mt19937_64, whose output the standard fixes (unlike
// std::normal_distribution's), so ranks built with different standard
// libraries draw the same Q.
void fill_gaussian(float* x, std::size_t count, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  constexpr double kTwoPi = 6.283185307179586;
  auto uniform = [&] { return (static_cast<double>(engine() >> 11) + 0.5) * 0x1.0p-53; };  // (0, 1)
  for (std::size_t i = 0; i < count; i += 2) {
    const double radius = std::sqrt(-2.0 * std::log(uniform()));
    const double angle = kTwoPi * uniform();
    x[i] = static_cast<float>(radius * std::cos(angle));
    if (i + 1 < count) x[i + 1] = static_cast<float>(radius * std::sin(angle));
  }
}

}  // namespace lockstep::low_rank
