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
//      return its Work; when it is done M = P Q^T, and the loss is stored
//      for error feedback.
// Every rank issues the same collectives in the same order, all from run().
//
// The matrices, P, Q and the error live where the bucket does, and every
// step above goes through the bucket's memory (ddp/bucket_memory.h): on the
// host at once, on a GPU queued on the bucket's stream. There the wait for
// P makes the stream wait (the host goes on), and step 4's end runs in
// finish(), on the stream the reducer's wait ordered after Q's all-reduce;
// on the host it runs inside Q's Work (progress thread). Only the random
// Qs are drawn on the host (the same numbers as on the CPU) and copied in.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "ddp/bucket_memory.h"
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
  std::unique_ptr<detail::BucketMemory> memory;  // where the bucket is
  // In `memory`, fp32: the padded square matrix (batched), the error
  // feedback over the matrix memory, P, Q and the uncompressed ranges.
  std::shared_ptr<std::byte[]> padded, error, p, q, plain;
  bool q_ready = false;        // q holds the last step's (warm start)
  bool to_finish = false;      // on a GPU: run() compressed, finish() decompresses
  std::size_t padded_gradients = 0;  // batched: the bucket's gradients in the padded square
  std::uint64_t draws = 0;     // random Qs drawn so far
};

float* floats(const std::shared_ptr<std::byte[]>& memory) { return reinterpret_cast<float*>(memory.get()); }

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

  // On a GPU: M = P Q^T and the rest of step 4, on the waiter's stream.
  void finish(const GradBucket& bucket) override {
    if (!bucket.buffer.device.is_cuda()) return;
    BucketState* state = nullptr;
    {
      std::lock_guard lock(mutex_);
      const auto it = buckets_.find(bucket.index);
      if (it == buckets_.end()) return;
      state = &it->second;
    }
    if (!std::exchange(state->to_finish, false)) return;  // averaged plainly
    auto* grads = static_cast<float*>(bucket.buffer.data);
    copy_plain_back(*state, grads, bucket.buffer.stream);
    decompress(*state, grads, bucket.buffer.stream);
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

  // Plans the bucket; a new layout (buckets rebuilt) or device starts afresh.
  void prepare(BucketState& state, const GradBucket& bucket) const {
    Plan plan = plan_for(bucket);
    const Device device = bucket.buffer.device;
    if (plan == state.plan && state.p && state.memory->device() == device) return;
    const std::uint64_t draws = state.draws;
    state = BucketState{};
    state.draws = draws;
    state.plan = std::move(plan);
    state.memory = detail::bucket_memory_for(device);
    const Plan& p = state.plan;
    void* stream = bucket.buffer.stream;
    const auto floats_of = [&](std::size_t count) { return state.memory->allocate_scratch(count * sizeof(float), stream); };
    state.padded = floats_of(p.padded);
    std::size_t matrix_memory = p.padded;
    for (const auto& mat : p.matrices) matrix_memory = std::max(matrix_memory, mat.offset + mat.rows * mat.cols);
    if (options_.use_error_feedback) state.error = floats_of(matrix_memory);
    state.p = floats_of(p.p_elements);
    state.q = floats_of(p.q_elements);
    state.plain = floats_of(p.plain_elements);
  }

  // How many gradients the padded square holds: all the bucket's
  // (batched), else 0 (the matrices are the bucket's own memory).
  static std::size_t padded_gradients(const Plan& plan, const GradBucket& bucket) {
    return plan.padded > 0 ? (bucket.layout ? bucket.layout->count : bucket.buffer.count) : 0;
  }

  // The averaged uncompressed ranges into the bucket.
  static void copy_plain_back(BucketState& s, float* grads, void* stream) {
    std::size_t from = 0;
    for (const auto& range : s.plan.plain) {
      s.memory->copy(grads + range.offset, floats(s.plain) + from, range.count * sizeof(float), stream);
      from += range.count;
    }
  }

  // M = P Q^T into the matrices' memory (and out of the padded square into
  // the bucket); the error keeps what the approximation lost.
  void decompress(BucketState& s, float* grads, void* stream) const {
    float* matrix = s.plan.padded > 0 ? floats(s.padded) : grads;
    std::size_t p_at = 0, q_at = 0;
    for (const auto& mat : s.plan.matrices) {
      float* m = matrix + mat.offset;
      s.memory->low_rank_reconstruct(floats(s.p) + p_at, floats(s.q) + q_at, mat.rows, mat.cols, mat.rank, m, stream);
      if (options_.use_error_feedback)
        s.memory->feedback_subtract(floats(s.error) + mat.offset, m, mat.rows * mat.cols, stream);
      p_at += mat.rows * mat.rank;
      q_at += mat.cols * mat.rank;
    }
    if (s.padded_gradients > 0) s.memory->copy(grads, matrix, s.padded_gradients * sizeof(float), stream);
    s.q_ready = options_.warm_start;
  }

  std::shared_ptr<Work> compress_and_reduce(ProcessGroup& pg, BucketState& state, const GradBucket& bucket) {
    const Plan& plan = state.plan;
    detail::BucketMemory& memory = *state.memory;
    const Device device = bucket.buffer.device;
    void* stream = bucket.buffer.stream;
    const auto on_here = [&](const std::shared_ptr<std::byte[]>& m, std::size_t count) {
      return Buffer{m.get(), count, DType::f32, device, stream};
    };
    auto* grads = static_cast<float*>(bucket.buffer.data);
    float* matrix = grads;
    state.padded_gradients = padded_gradients(plan, bucket);
    if (plan.padded > 0) {
      const std::size_t n = state.padded_gradients;
      matrix = floats(state.padded);
      memory.copy(matrix, grads, n * sizeof(float), stream);
      memory.zero(matrix + n, (plan.padded - n) * sizeof(float), stream);
    }
    // Error feedback: M += last loss; remember M to measure this step's loss.
    for (const auto& mat : plan.matrices) {
      if (!options_.use_error_feedback) break;
      memory.feedback_add(matrix + mat.offset, floats(state.error) + mat.offset, mat.rows * mat.cols, stream);
    }
    std::size_t at = 0;
    for (const auto& range : plan.plain) {
      memory.copy(floats(state.plain) + at, grads + range.offset, range.count * sizeof(float), stream);
      at += range.count;
    }
    auto plain_work = pg.allreduce(on_here(state.plain, plan.plain_elements), ReduceOp::avg);
    BucketState* s = &state;
    if (!device.is_cuda()) plain_work->on_complete([s, grads](const Work& w) {
      if (!w.error()) copy_plain_back(*s, grads, nullptr);
    });

    if (!options_.warm_start || !state.q_ready) {
      // Drawn on the host, the same numbers wherever the bucket is.
      std::vector<float> drawn(plan.q_elements);
      std::size_t q_at = 0;
      for (const auto& mat : plan.matrices) {
        // A seed per draw, the same sequence on every rank.
        const std::uint64_t seed = options_.random_seed * 0x9E3779B97F4A7C15ull + bucket.index * 1000003ull + state.draws++;
        low_rank::fill_gaussian(drawn.data() + q_at, mat.cols * mat.rank, seed);
        low_rank::orthogonalize(drawn.data() + q_at, mat.cols, mat.rank, 0.0);
        q_at += mat.cols * mat.rank;
      }
      memory.write(state.q.get(), DType::f32, std::vector<double>(drawn.begin(), drawn.end()), stream);
    }
    std::size_t p_at = 0, q_at = 0;
    for (const auto& mat : plan.matrices) {
      memory.low_rank_multiply(matrix + mat.offset, mat.rows, mat.cols, floats(state.q) + q_at, mat.rank,
                               floats(state.p) + p_at, stream);
      p_at += mat.rows * mat.rank;
      q_at += mat.cols * mat.rank;
    }
    // Summed, not averaged: P is orthogonalised next, so its scale is moot.
    auto p_work = pg.allreduce(on_here(state.p, plan.p_elements), ReduceOp::sum);
    // On a GPU these waits order the stream (the plain ranges are copied
    // back in finish(), after it); on the host, P's wait blocks.
    if (device.is_cuda()) plain_work->wait();
    p_work->wait();
    p_at = q_at = 0;
    for (const auto& mat : plan.matrices) {
      memory.low_rank_orthogonalize(floats(state.p) + p_at, mat.rows, mat.rank, options_.orthogonalization_epsilon,
                                    stream);
      memory.low_rank_multiply_transposed(matrix + mat.offset, mat.rows, mat.cols, floats(state.p) + p_at, mat.rank,
                                          floats(state.q) + q_at, stream);
      p_at += mat.rows * mat.rank;
      q_at += mat.cols * mat.rank;
    }
    auto q_work = pg.allreduce(on_here(state.q, plan.q_elements), ReduceOp::avg);
    if (device.is_cuda()) {
      state.to_finish = true;
    } else {
      q_work->on_complete([this, s, grads](const Work& w) {
        if (!w.error()) decompress(*s, grads, nullptr);
      });
    }
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
