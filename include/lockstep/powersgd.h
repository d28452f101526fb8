// PowerSGD gradient compression (Vogels, Karimireddy and Jaggi, 2019) as a
// communication hook, with the options of PyTorch's powerSGD_hook.
//
//   lockstep::PowerSGDOptions psgd;
//   psgd.matrix_approximation_rank = 2;
//   psgd.start_powersgd_iter = 10;
//   auto hook = lockstep::powersgd_hook(psgd);
//   lockstep::torch::DDPOptions options;
//   options.comm_hook = hook;                    // one hook per DDP: it keeps state per bucket
//   ...train...
//   hook->compression_stats().ratio();           // e.g. 60 (x fewer elements on the wire)
//
// Each gradient with two or more dimensions is viewed as an n x m matrix
// (n = its first dimension) M and sent as two thin matrices: with Q (m x r)
// kept from the last step (warm start) or drawn at random (the same on
// every rank), P = all-reduce(M Q) is orthogonalised, Q = all-reduce(M^T P)
// / world, and M is replaced by P Q^T: (n + m) r elements instead of n m.
// Vectors (biases), gradients that would not shrink by min_compression_rate
// and non-fp32 buckets are averaged as they are. With error feedback what
// the approximation lost on this rank is added to its next gradient.
// Before start_powersgd_iter backward passes, every bucket is averaged
// plainly (the first steps move the most).
//
// The batched variant views each bucket's gradients as one square matrix
// (zero-padded): fewer, larger multiplications, one matrix per bucket.
//
// Host or CUDA gradients: on a GPU the matrices, P, Q and the error
// feedback stay in device memory and every step is queued on the bucket's
// stream (docs/gpu.md); only the random Qs are drawn on the host.
//
// Thread-safety: a hook's run() and finish() are called by its reducer's
// thread, and its completion on host memory runs on the group's progress
// thread; compression_stats() may be called from any thread. Give each DDP
// its own hook (the state is kept by bucket index).
#pragma once

#include <cstdint>
#include <memory>

#include "lockstep/reducer.h"

namespace lockstep {

struct PowerSGDOptions {
  // r: the rank of the approximation. Higher is more exact and sends more.
  int matrix_approximation_rank = 1;
  // Backward passes averaged plainly before compression begins.
  std::uint64_t start_powersgd_iter = 1000;
  // An n x m gradient is compressed only if n m > (n + m) r times this;
  // smaller ones are averaged as they are. 0: compress every matrix.
  double min_compression_rate = 2;
  // Add what the approximation lost on this rank to its next gradient.
  bool use_error_feedback = true;
  // Start from the last step's Q instead of a random one.
  bool warm_start = true;
  // Added to each column's norm when orthogonalising P (0: none; a column
  // of zeros stays zeros).
  double orthogonalization_epsilon = 0;
  // Seeds the random Qs (identical on every rank).
  std::uint64_t random_seed = 0;

  // PyTorch's spelling of start_powersgd_iter (PowerSGDState's
  // start_powerSGD_iter): options.start_powerSGD_iter(10).
  PowerSGDOptions& start_powerSGD_iter(std::uint64_t iterations) {
    start_powersgd_iter = iterations;
    return *this;
  }
  std::uint64_t start_powerSGD_iter() const { return start_powersgd_iter; }
};

// Elements of the compressed steps' buckets, before and as sent.
struct CompressionStats {
  std::uint64_t elements_before = 0;
  std::uint64_t elements_sent = 0;
  // before / sent; 1 before compression begins.
  double ratio() const {
    return elements_sent == 0 ? 1.0 : static_cast<double>(elements_before) / static_cast<double>(elements_sent);
  }
};

class PowerSGDHook : public CommHook {
 public:
  virtual CompressionStats compression_stats() const = 0;
};

// Throw InvalidArgument for a rank below 1, a negative compression rate or
// epsilon.
std::shared_ptr<PowerSGDHook> powersgd_hook(PowerSGDOptions options = {});
std::shared_ptr<PowerSGDHook> batched_powersgd_hook(PowerSGDOptions options = {});

}  // namespace lockstep
