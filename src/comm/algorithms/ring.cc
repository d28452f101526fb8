// Ring reduce-scatter and allgather passes; see ring.h.
#include "comm/algorithms/ring.h"

#include <algorithm>
#include <cstring>

#include "comm/reduce_kernels.h"

namespace lockstep {
namespace {

// Received bytes are folded in as they land, a socket read at a time; this
// much staging bounds one read.
constexpr std::size_t kStagingBytes = 256 * 1024;

int mod(int a, int n) { return ((a % n) + n) % n; }

// Shared bookkeeping of a ring pass: n-1 steps, each moving one chunk.
class RingSteps {
 public:
  RingSteps(const Chunks& chunks, int n, std::size_t elem, int rank, int chunk_shift)
      : chunks_(chunks), n_(n), elem_(elem), rank_(rank), shift_(chunk_shift), progress_(static_cast<std::size_t>(n), 0) {}

  // The chunk moved at step s.
  int chunk(int s) const { return mod(rank_ - s - shift_, n_); }
  std::size_t bytes(int s) const { return chunks_.size(chunk(s)) * elem_; }
  std::size_t offset(int s) const { return chunks_.begin(chunk(s)) * elem_; }
  int steps() const { return n_ - 1; }
  // Bytes of step s that are complete (received, or received and reduced).
  std::size_t progress(int s) const { return progress_[static_cast<std::size_t>(s)]; }
  void advance(int s, std::size_t n) { progress_[static_cast<std::size_t>(s)] += n; }

 private:
  const Chunks& chunks_;
  int n_;
  std::size_t elem_;
  int rank_;
  int shift_;
  std::vector<std::size_t> progress_;
};

// Sends chunk (r-s-shift) at step s; step 0 is ready at once, later steps as
// the receiving side completes the previous step's chunk.
class RingSource final : public ByteSource {
 public:
  RingSource(RingSteps steps, const RingSteps& fed_by, const std::byte* buf)
      : steps_(std::move(steps)), fed_by_(fed_by), buf_(buf) {
    skip_complete();
  }
  std::span<const std::byte> ready() override {
    if (finished()) return {};
    const std::size_t available = step_ == 0 ? steps_.bytes(0) : fed_by_.progress(step_ - 1);
    return {buf_ + steps_.offset(step_) + sent_, available - sent_};
  }
  void consumed(std::size_t n) override {
    sent_ += n;
    skip_complete();
  }
  bool finished() const override { return step_ >= steps_.steps(); }

 private:
  void skip_complete() {
    while (step_ < steps_.steps() && sent_ == steps_.bytes(step_)) {
      ++step_;
      sent_ = 0;
    }
  }
  RingSteps steps_;
  const RingSteps& fed_by_;
  const std::byte* buf_;
  int step_ = 0;
  std::size_t sent_ = 0;
};

// Receives chunk (r-s-2) at step s into staging and folds each whole element
// into `acc` as it lands: acc = op(received, acc), the left neighbour's
// partial result first.
class ReduceSink final : public ByteSink {
 public:
  ReduceSink(RingSteps steps, std::byte* acc, DType dtype, ReduceOp op, std::byte* staging)
      : steps_(std::move(steps)), acc_(acc), dtype_(dtype), op_(op), elem_(dtype_size(dtype)), staging_(staging) {
    skip_complete();
  }
  std::span<std::byte> space() override {
    const std::size_t remaining = steps_.bytes(step_) - received_;
    return {staging_ + pending_, std::min(kStagingBytes - pending_, remaining)};
  }
  void filled(std::size_t n) override {
    pending_ += n;
    received_ += n;
    const std::size_t whole = pending_ / elem_ * elem_;
    reduce_into(acc_ + steps_.offset(step_) + steps_.progress(step_), staging_, whole / elem_, dtype_, op_,
                /*src_first=*/true);
    steps_.advance(step_, whole);
    pending_ -= whole;
    if (pending_ > 0) std::memmove(staging_, staging_ + whole, pending_);
    skip_complete();
  }
  bool finished() const override { return step_ >= steps_.steps(); }
  const RingSteps& steps() const { return steps_; }

 private:
  void skip_complete() {
    while (step_ < steps_.steps() && received_ == steps_.bytes(step_)) {
      ++step_;
      received_ = 0;
    }
  }
  RingSteps steps_;
  std::byte* acc_;
  DType dtype_;
  ReduceOp op_;
  std::size_t elem_;
  std::byte* staging_;
  int step_ = 0;
  std::size_t received_ = 0;  // bytes of the current step received
  std::size_t pending_ = 0;   // bytes in staging not yet folded (part of one element)
};

// Receives chunk (r-t-1) at step t straight into its place in `buf`.
class GatherSink final : public ByteSink {
 public:
  GatherSink(RingSteps steps, std::byte* buf) : steps_(std::move(steps)), buf_(buf) { skip_complete(); }
  std::span<std::byte> space() override {
    const std::size_t done = steps_.progress(step_);
    return {buf_ + steps_.offset(step_) + done, steps_.bytes(step_) - done};
  }
  void filled(std::size_t n) override {
    steps_.advance(step_, n);
    skip_complete();
  }
  bool finished() const override { return step_ >= steps_.steps(); }
  const RingSteps& steps() const { return steps_; }

 private:
  void skip_complete() {
    while (step_ < steps_.steps() && steps_.progress(step_) == steps_.bytes(step_)) ++step_;
  }
  RingSteps steps_;
  std::byte* buf_;
  int step_ = 0;
};

}  // namespace

void ring_reduce_scatter(Transport& transport, const OpContext& op, void* acc, DType dtype, ReduceOp reduce_op,
                         const Chunks& chunks, Scratch& staging) {
  const int n = transport.size();
  const int r = transport.rank();
  if (n == 1) return;
  const std::size_t elem = dtype_size(dtype);
  auto* bytes = static_cast<std::byte*>(acc);
  ReduceSink sink(RingSteps(chunks, n, elem, r, 2), bytes, dtype, reduce_op, staging.get(kStagingBytes));
  RingSource source(RingSteps(chunks, n, elem, r, 1), sink.steps(), bytes);
  const Channel channels[] = {{mod(r + 1, n), &source, nullptr}, {mod(r - 1, n), nullptr, &sink}};
  transport.transfer(op, channels);
}

void ring_allgather(Transport& transport, const OpContext& op, void* buf, std::size_t elem_size, const Chunks& chunks) {
  const int n = transport.size();
  const int r = transport.rank();
  if (n == 1) return;
  auto* bytes = static_cast<std::byte*>(buf);
  GatherSink sink(RingSteps(chunks, n, elem_size, r, 1), bytes);
  RingSource source(RingSteps(chunks, n, elem_size, r, 0), sink.steps(), bytes);
  const Channel channels[] = {{mod(r + 1, n), &source, nullptr}, {mod(r - 1, n), nullptr, &sink}};
  transport.transfer(op, channels);
}

}  // namespace lockstep
