// PowerSGD hooks; see lockstep/powersgd.h. One bucket, step by step:
//   1. plan: which gradients travel as matrices (n x m, rank r) and which
//      ranges as they are (vectors, small matrices, the reducer's flags);
//      the per-tensor hook takes each gradient as a matrix, the batched one
//      the whole bucket as one zero-padded square matrix;
//   2. error feedback: add last step's loss to the matrices, and keep their
//      values to compute this step's loss at the end;
//   3. issue all-reduce(avg) of the uncompressed ranges, then P = M Q and
//      all-reduce(sum) of all Ps; wait for P (the only wait on the
//      backward thread: Q needs the summed P);
//   4. orthogonalise P, Q = M^T P, issue all-reduce(avg) of all Qs and
//      return its Work; when it is done (progress thread) M = P Q^T, and the
//      loss is stored for error feedback.
// Every rank issues the same collectives in the same order, all from run().
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "ddp/low_rank.h"
#include "lockstep/error.h"
#include "lockstep/powersgd.h"

namespace lockstep {
namespace {

struct MatrixSlot {
  std::size_t offset = 0;  // in the matrix memory (the bucket, or the padded copy)
  std::size_t rows = 0, cols = 0, rank = 0;
};

struct Range {
  std::size_t offset = 0, count = 0;  // in the bucket
};

// What travels how, for one bucket layout.
struct Plan {
  std::vector<MatrixSlot> matrices;
  std::vector<Range> plain;
  std::size_t padded = 0;  // batched: elements of the square matrix (0: matrices live in the bucket)
  std::size_t p_elements = 0, q_elements = 0, plain_elements = 0;
  bool operator==(const Plan& o) const {
    if (matrices.size() != o.matrices.size() || plain.size() != o.plain.size() || padded != o.padded) return false;
    for (std::size_t i = 0; i < matrices.size(); ++i)
      if (matrices[i].offset != o.matrices[i].offset || matrices[i].rows != o.matrices[i].rows ||
          matrices[i].cols != o.matrices[i].cols || matrices[i].rank != o.matrices[i].rank)
        return false;
    for (std::size_t i = 0; i < plain.size(); ++i)
      if (plain[i].offset != o.plain[i].offset || plain[i].count != o.plain[i].count) return false;
    return true;
  }
};

// Per bucket, across steps. Used by one bucket's run() and its completion
// at a time (the reducer waits for a bucket before reusing it).
struct BucketState {
  Plan plan;
  std::vector<float> padded;   // batched: the square matrix
  std::vector<float> error;    // error feedback, over the matrix memory
  std::vector<float> p, q, plain;
  bool q_ready = false;        // q holds the last step's (warm start)
  std::uint64_t draws = 0;     // random Qs drawn so far
};

bool compressible(std::size_t n, std::size_t m, std::size_t r, double min_rate) {
  return static_cast<double>((n + m) * r) * min_rate < static_cast<double>(n * m);
}

void add_range(std::vector<Range>& ranges, std::size_t offset, std::size_t count) {
  if (count == 0) return;
  if (!ranges.empty() && ranges.back().offset + ranges.back().count == offset)
    ranges.back().count += count;
  else
    ranges.push_back({offset, count});
}

class PowerSGD final : public PowerSGDHook {
 public:
  PowerSGD(PowerSGDOptions options, bool batched) : options_(options), batched_(batched) {
    if (options_.matrix_approximation_rank < 1)
      throw InvalidArgument(fmt::format(
          "{}: matrix_approximation_rank must be at least 1 (got {}): it is the rank of the low-rank "
          "approximation each gradient matrix is sent as; 1 to 4 is usual",
          hook_function(), options_.matrix_approximation_rank));
    if (!(options_.min_compression_rate >= 0))
      throw InvalidArgument(fmt::format("{}: min_compression_rate must be 0 or more (got {}); 0 compresses every "
                                        "matrix, the default 2 only those that shrink at least twofold",
                                        hook_function(), options_.min_compression_rate));
    if (!(options_.orthogonalization_epsilon >= 0))
      throw InvalidArgument(fmt::format("{}: orthogonalization_epsilon must be 0 or more (got {})", hook_function(),
                                        options_.orthogonalization_epsilon));
  }

  std::string name() const override {
    // Every option is in the name: DDP compares hook names across ranks.
    return fmt::format("{}(rank={}, start_iter={}, min_compression_rate={}, error_feedback={}, warm_start={}, "
                       "epsilon={}, seed={})",
                       batched_ ? "batched_powersgd" : "powersgd", options_.matrix_approximation_rank,
                       options_.start_powersgd_iter, options_.min_compression_rate, options_.use_error_feedback,
                       options_.warm_start, options_.orthogonalization_epsilon, options_.random_seed);
  }

  CompressionStats compression_stats() const override {
    std::lock_guard lock(mutex_);
    return stats_;
  }

  // Its low-rank products run on the host.
  bool supports(Device device) const override { return !device.is_cuda(); }

  std::shared_ptr<Work> run(ProcessGroup& pg, const GradBucket& bucket) override {
    const bool compress = iterations_ >= options_.start_powersgd_iter && bucket.buffer.dtype == DType::f32;
    if (bucket.last) ++iterations_;  // a backward pass ends with its last bucket
    if (!compress) return pg.allreduce(bucket.buffer, ReduceOp::avg);
    BucketState* state = nullptr;
    {
      std::lock_guard lock(mutex_);
      state = &buckets_[bucket.index];
    }
    prepare(*state, bucket);
    if (state->plan.matrices.empty()) return pg.allreduce(bucket.buffer, ReduceOp::avg);
    return compress_and_reduce(pg, *state, bucket);
  }

 private:
  std::string hook_function() const { return batched_ ? "batched_powersgd_hook" : "powersgd_hook"; }

  Plan plan_for(const GradBucket& bucket) const {
    Plan plan;
    const std::size_t total = bucket.buffer.count;
    const std::size_t grads = bucket.layout ? bucket.layout->count : (batched_ ? total : 0);
    const auto rank = static_cast<std::size_t>(options_.matrix_approximation_rank);
    if (batched_) {
      const auto side = static_cast<std::size_t>(std::ceil(std::sqrt(static_cast<double>(grads))));
      const std::size_t r = std::min(side, rank);
      // Worth it if the two thin matrices are smaller than the gradients
      // (by min_compression_rate), padding aside.
      if (grads > 0 && static_cast<double>(2 * side * r) * options_.min_compression_rate < static_cast<double>(grads)) {
        plan.matrices.push_back({0, side, side, r});
        plan.padded = side * side;
      } else {
        add_range(plan.plain, 0, grads);
      }
    } else if (bucket.layout && bucket.params) {
      const Bucket& layout = *bucket.layout;
      for (std::size_t k = 0; k < layout.params.size(); ++k) {
        const ParamSpec& spec = (*bucket.params)[layout.params[k]];
        const std::size_t offset = layout.offsets[k];
        const std::size_t n = spec.shape.size() >= 2 ? static_cast<std::size_t>(spec.shape[0]) : 0;
        const std::size_t m = n > 0 ? spec.count / n : 0;
        const std::size_t r = std::min({n, m, rank});
        if (n > 0 && m > 0 && compressible(n, m, r, options_.min_compression_rate))
          plan.matrices.push_back({offset, n, m, r});
        else
          add_range(plan.plain, offset, spec.count);
      }
    }
    add_range(plan.plain, grads, total - grads);  // the reducer's flags, exactly
    for (const auto& mat : plan.matrices) {
      plan.p_elements += mat.rows * mat.rank;
      plan.q_elements += mat.cols * mat.rank;
    }
    for (const auto& range : plan.plain) plan.plain_elements += range.count;
    return plan;
  }

  // Plans the bucket; a new layout (buckets rebuilt) starts afresh.
  void prepare(BucketState& state, const GradBucket& bucket) const {
    Plan plan = plan_for(bucket);
    if (plan == state.plan && !state.p.empty()) return;
    const std::uint64_t draws = state.draws;
    state = BucketState{};
    state.draws = draws;
    state.plan = std::move(plan);
    const Plan& p = state.plan;
    state.padded.assign(p.padded, 0.0f);
    std::size_t matrix_memory = p.padded;
    for (const auto& mat : p.matrices) matrix_memory = std::max(matrix_memory, mat.offset + mat.rows * mat.cols);
    if (options_.use_error_feedback) state.error.assign(matrix_memory, 0.0f);
    state.p.assign(p.p_elements, 0.0f);
    state.q.assign(p.q_elements, 0.0f);
    state.plain.assign(p.plain_elements, 0.0f);
  }

  std::shared_ptr<Work> compress_and_reduce(ProcessGroup& pg, BucketState& state, const GradBucket& bucket) {
    const Plan& plan = state.plan;
    auto* grads = static_cast<float*>(bucket.buffer.data);
    float* matrix = grads;
    if (plan.padded > 0) {
      const std::size_t n = bucket.layout ? bucket.layout->count : bucket.buffer.count;
      std::copy(grads, grads + n, state.padded.begin());
      std::fill(state.padded.begin() + static_cast<std::ptrdiff_t>(n), state.padded.end(), 0.0f);
      matrix = state.padded.data();
    }
    // Error feedback: M += last loss; remember M to measure this step's loss.
    for (const auto& mat : plan.matrices) {
      if (!options_.use_error_feedback) break;
      float* m = matrix + mat.offset;
      float* e = state.error.data() + mat.offset;
      for (std::size_t i = 0; i < mat.rows * mat.cols; ++i) {
        m[i] += e[i];
        e[i] = m[i];
      }
    }
    std::size_t at = 0;
    for (const auto& range : plan.plain) {
      std::copy(grads + range.offset, grads + range.offset + range.count, state.plain.begin() + static_cast<std::ptrdiff_t>(at));
      at += range.count;
    }
    auto plain_work = pg.allreduce(Buffer{state.plain.data(), state.plain.size(), DType::f32}, ReduceOp::avg);
    BucketState* s = &state;
    plain_work->on_complete([s, grads](const Work& w) {
      if (w.error()) return;
      std::size_t from = 0;
      for (const auto& range : s->plan.plain) {
        std::copy(s->plain.begin() + static_cast<std::ptrdiff_t>(from),
                  s->plain.begin() + static_cast<std::ptrdiff_t>(from + range.count), grads + range.offset);
        from += range.count;
      }
    });

    if (!options_.warm_start || !state.q_ready) {
      std::size_t q_at = 0;
      for (const auto& mat : plan.matrices) {
        // A seed per draw, the same sequence on every rank.
        const std::uint64_t seed = options_.random_seed * 0x9E3779B97F4A7C15ull + bucket.index * 1000003ull + state.draws++;
        low_rank::fill_gaussian(state.q.data() + q_at, mat.cols * mat.rank, seed);
        low_rank::orthogonalize(state.q.data() + q_at, mat.cols, mat.rank, 0.0);
        q_at += mat.cols * mat.rank;
      }
    }
    std::size_t p_at = 0, q_at = 0;
    for (const auto& mat : plan.matrices) {
      low_rank::multiply(matrix + mat.offset, mat.rows, mat.cols, state.q.data() + q_at, mat.rank, state.p.data() + p_at);
      p_at += mat.rows * mat.rank;
      q_at += mat.cols * mat.rank;
    }
    // Summed, not averaged: P is orthogonalised next, so its scale is moot.
    pg.allreduce(Buffer{state.p.data(), state.p.size(), DType::f32}, ReduceOp::sum)->wait();
    p_at = q_at = 0;
    for (const auto& mat : plan.matrices) {
      low_rank::orthogonalize(state.p.data() + p_at, mat.rows, mat.rank, options_.orthogonalization_epsilon);
      low_rank::multiply_transposed(matrix + mat.offset, mat.rows, mat.cols, state.p.data() + p_at, mat.rank,
                                    state.q.data() + q_at);
      p_at += mat.rows * mat.rank;
      q_at += mat.cols * mat.rank;
    }
    auto q_work = pg.allreduce(Buffer{state.q.data(), state.q.size(), DType::f32}, ReduceOp::avg);
    const std::size_t gradients = plan.padded > 0 ? (bucket.layout ? bucket.layout->count : bucket.buffer.count) : 0;
    const bool feedback = options_.use_error_feedback, warm = options_.warm_start;
    q_work->on_complete([s, grads, matrix, gradients, feedback, warm](const Work& w) {
      if (w.error()) return;
      std::size_t p_at = 0, q_at = 0;
      for (const auto& mat : s->plan.matrices) {
        float* m = matrix + mat.offset;
        low_rank::reconstruct(s->p.data() + p_at, s->q.data() + q_at, mat.rows, mat.cols, mat.rank, m);
        if (feedback) {
          float* e = s->error.data() + mat.offset;
          for (std::size_t i = 0; i < mat.rows * mat.cols; ++i) e[i] -= m[i];
        }
        p_at += mat.rows * mat.rank;
        q_at += mat.cols * mat.rank;
      }
      if (gradients > 0) std::copy(matrix, matrix + gradients, grads);  // batched: out of the padded square
      s->q_ready = warm;
    });
    {
      std::lock_guard lock(mutex_);
      stats_.elements_before += bucket.buffer.count;
      stats_.elements_sent += plan.plain_elements + plan.p_elements + plan.q_elements;
    }
    return q_work;
  }

  const PowerSGDOptions options_;
  const bool batched_;
  std::uint64_t iterations_ = 0;  // backward passes seen (run() is on one thread)
  mutable std::mutex mutex_;      // guards the map's structure and the statistics
  std::map<std::size_t, BucketState> buckets_;
  CompressionStats stats_;
};

}  // namespace

std::shared_ptr<PowerSGDHook> powersgd_hook(PowerSGDOptions options) {
  return std::make_shared<PowerSGD>(options, /*batched=*/false);
}

std::shared_ptr<PowerSGDHook> batched_powersgd_hook(PowerSGDOptions options) {
  return std::make_shared<PowerSGD>(options, /*batched=*/true);
}

}  // namespace lockstep
