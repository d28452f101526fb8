// fused_adam: see fused_adam.h. The element update, as libtorch 1.13's
// Adam::step writes it (torch/csrc/api/src/optim/adam.cpp) and its CPU
// kernels round it:
//   m = fma(1 - beta1, g, m * beta1)          exp_avg.mul_(beta1).add_(g, 1 - beta1)
//   v = fma((1 - beta2) * g, g, v * beta2)    exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2)
//   d = sqrt(v) / sqrt(bc2) + eps             (exp_avg_sq.sqrt() / sqrt(bc2)).add_(eps)
//   p = p + (-lr / bc1 * m) / d               p.addcdiv_(exp_avg, denom, -lr / bc1)
// with every scalar rounded to float first, as the kernels take them. This
// file is built without contracting a multiply and an add into one (the
// two fused above are written so), so the compiler adds no rounding step
// of its own.
#include "fused_adam.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <typeinfo>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "optimizer_state.h"

namespace lockstep::torch::detail {
namespace {

using ::torch::Tensor;
using ::torch::optim::AdamOptions;
using ::torch::optim::AdamParamState;

// The step's scalars, each as the kernels see it.
struct Coefficients {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, root_of_correction2, eps, step_size;
};

Coefficients coefficients_of(const AdamOptions& options, std::int64_t step) {
  const double beta1 = std::get<0>(options.betas());
  const double beta2 = std::get<1>(options.betas());
  const double correction1 = 1 - std::pow(beta1, step);
  const double correction2 = 1 - std::pow(beta2, step);
  return {static_cast<float>(beta1),
          static_cast<float>(1 - beta1),
          static_cast<float>(beta2),
          static_cast<float>(1 - beta2),
          static_cast<float>(std::sqrt(correction2)),
          static_cast<float>(options.eps()),
          static_cast<float>(-(options.lr() / correction1))};
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void step_elements(float* p, const float* g, float* m, float* v, std::int64_t n,
                                                        const Coefficients& c) {
  const __m256 beta1 = _mm256_set1_ps(c.beta1), one_minus_beta1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(c.beta2), one_minus_beta2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 root = _mm256_set1_ps(c.root_of_correction2), eps = _mm256_set1_ps(c.eps);
  const __m256 step_size = _mm256_set1_ps(c.step_size);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gi = _mm256_loadu_ps(g + i);
    const __m256 mi = _mm256_fmadd_ps(one_minus_beta1, gi, _mm256_mul_ps(_mm256_loadu_ps(m + i), beta1));
    const __m256 vi =
        _mm256_fmadd_ps(_mm256_mul_ps(one_minus_beta2, gi), gi, _mm256_mul_ps(_mm256_loadu_ps(v + i), beta2));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), root), eps);
    _mm256_storeu_ps(p + i, _mm256_add_ps(_mm256_loadu_ps(p + i), _mm256_div_ps(_mm256_mul_ps(step_size, mi), denom)));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
  }
  for (; i < n; ++i) {
    const float mi = std::fma(c.one_minus_beta1, g[i], m[i] * c.beta1);
    const float vi = std::fma(c.one_minus_beta2 * g[i], g[i], v[i] * c.beta2);
    const float denom = std::sqrt(vi) / c.root_of_correction2 + c.eps;
    p[i] = p[i] + (c.step_size * mi) / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

bool cpu_can() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#else
// Never called: fused_adam_applies is false here.
void step_elements(float*, const float*, float*, float*, std::int64_t, const Coefficients&) {}
bool cpu_can() { return false; }
#endif

bool fits(const Tensor& t, std::int64_t numel) {
  return t.defined() && t.is_cpu() && t.scalar_type() == ::torch::kFloat && t.is_contiguous() && t.numel() == numel;
}

void step_parameter(const Tensor& param, const Tensor& grad, AdamParamState& state, const AdamOptions& options) {
  state.step(state.step() + 1);
  const Coefficients c = coefficients_of(options, state.step());
  float* p = param.data_ptr<float>();
  const float* g = grad.data_ptr<float>();
  float* m = state.exp_avg().data_ptr<float>();
  float* v = state.exp_avg_sq().data_ptr<float>();
  // Chunks of whole vectors where the work is split: each element's bits
  // do not depend on where its chunk starts, as the probe checks.
  at::parallel_for(0, param.numel(), 32768, [&](std::int64_t begin, std::int64_t end) {
    step_elements(p + begin, g + begin, m + begin, v + begin, end - begin, c);
  });
}

// Fills `t` with values spread over many magnitudes and signs, with exact
// zeros, from a fixed sequence (no random generator: the caller's stays
// as it was).
void fill_probe(Tensor& t, std::uint32_t seed, float scale) {
  float* out = t.data_ptr<float>();
  std::uint32_t x = seed;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    const int exponent = static_cast<int>((x >> 24) % 40) - 30;
    const float sign = (x & 1u) ? -1.0f : 1.0f;
    out[i] = (x % 17 == 0) ? 0.0f : sign * scale * std::ldexp(1.0f + static_cast<float>((x >> 8) & 0xffff) / 65536.0f, exponent);
  }
}

// Bits, not values: -0 against +0, or one NaN against another, differ too.
bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && a.is_contiguous() && b.is_contiguous() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

}  // namespace

bool fused_adam_applies(::torch::optim::Optimizer& optimizer) {
  if (!cpu_can() || typeid(optimizer) != typeid(::torch::optim::Adam)) return false;
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const AdamOptions&>(group.options());
    if (options.weight_decay() != 0 || options.amsgrad()) return false;
    for (const Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto* state = static_cast<AdamParamState*>(state_of(optimizer, p));
      if (state == nullptr || state->step() < 1) return false;
      const std::int64_t n = p.numel();
      if (!fits(p, n) || !fits(p.grad(), n) || !fits(state->exp_avg(), n) || !fits(state->exp_avg_sq(), n))
        return false;
    }
  }
  return true;
}

void fused_adam_step(::torch::optim::Optimizer& optimizer) {
  ::torch::NoGradGuard no_grad;
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const AdamOptions&>(group.options());
    for (const Tensor& p : group.params())
      if (p.grad().defined())
        step_parameter(p, p.grad(), static_cast<AdamParamState&>(*state_of(optimizer, p)), options);
  }
}

bool fused_adam_matches() {
  if (!cpu_can()) return false;
  ::torch::NoGradGuard no_grad;
  // Lengths with and without a scalar tail, and one split into chunks.
  const std::vector<std::int64_t> lengths = {1, 7, 8, 13, 16, 31, 64, 1001, 70003};
  std::vector<Tensor> theirs, ours;
  for (std::size_t k = 0; k < lengths.size(); ++k) {
    Tensor p = ::torch::empty({lengths[k]});
    fill_probe(p, static_cast<std::uint32_t>(k + 1), 1.0f);
    theirs.push_back(p.clone());
    ours.push_back(p);
  }
  AdamOptions options(1e-3);
  ::torch::optim::Adam reference(theirs, options);
  ::torch::optim::Adam fused(ours, options);
  for (std::uint32_t step = 1; step <= 4; ++step) {
    for (std::size_t k = 0; k < lengths.size(); ++k) {
      Tensor grad = ::torch::empty({lengths[k]});
      fill_probe(grad, 1000 * step + static_cast<std::uint32_t>(k), 1e-2f);
      theirs[k].mutable_grad() = grad;
      ours[k].mutable_grad() = grad.clone();
    }
    reference.step();
    if (step == 1) {
      fused.step();  // the first makes the state, as in use
    } else {
      if (!fused_adam_applies(fused)) return false;
      fused_adam_step(fused);
    }
  }
  for (std::size_t k = 0; k < lengths.size(); ++k) {
    auto& a = static_cast<AdamParamState&>(*state_of(reference, theirs[k]));
    auto& b = static_cast<AdamParamState&>(*state_of(fused, ours[k]));
    if (!same_bits(theirs[k], ours[k]) || !same_bits(a.exp_avg(), b.exp_avg()) ||
        !same_bits(a.exp_avg_sq(), b.exp_avg_sq()) || a.step() != b.step())
      return false;
  }
  return true;
}

}  // namespace lockstep::torch::detail
