// The pinned host memory one device's staged operations copy through, and
// the two ways they use it:
//  - pipelined, for the collectives that work in place on one buffer
//    (allreduce, broadcast, reduce): chunks are copied to the host on the
//    group's stream up to kSlots - 1 ahead of the one the host backend
//    runs on, and each chunk is copied back on a second stream as soon as
//    the host is done with it, so both directions of the link and the
//    host collective all run at once (one stream would run the two
//    directions one after the other: half the link's rate at best);
//  - whole, for the rest: the input copied in, the host collective, the
//    output copied back.
// Either way the host returns once the copy back is queued, and the
// group's stream waits for it there, so the operation's StreamOrder marks
// its end on that one stream.
//
// Thread-safety: used by the thread running the group's operations, one at
// a time.
#pragma once

#include <functional>

#include "comm/backend.h"
#include "device/cuda_runtime.h"

namespace lockstep::cuda {

class StagingArea {
 public:
  explicit StagingArea(std::size_t chunk_bytes) : chunk_bytes_(chunk_bytes) {}

  // Runs `run(op, chunk)` on host copies of successive chunks of `in`, each
  // chunk's OpContext counting its own elements, and copies each chunk back
  // into `out` (which may be `in`). `copy_in`/`copy_out` false: this rank's
  // input is not read (a broadcast's non-root) / its output not written (a
  // reduce's non-root).
  using ChunkRun = std::function<void(const OpContext& chunk_op, Buffer chunk)>;
  void pipelined(const OpContext& op, ConstBuffer in, Buffer out, bool copy_in, bool copy_out, const ChunkRun& run);

  // Copies `in` to the host, runs `run(host_in, host_out)`, copies the
  // host's output back into `out`. Either may be empty.
  using WholeRun = std::function<void(ConstBuffer host_in, Buffer host_out)>;
  void whole(const OpContext& op, ConstBuffer in, Buffer out, const WholeRun& run);

 private:
  // Waits until the previous operation's copies out of the area are done,
  // so the host may write it again.
  void reuse(const OpContext& op);

  // Chunk slots in the area: copies in may run kSlots - 1 chunks ahead.
  static constexpr std::size_t kSlots = 4;

  const std::size_t chunk_bytes_;
  PinnedBuffer memory_;
  Stream back_;                // copies back to the device
  Event arrived_[kSlots];      // a slot's copy to the host is done (group stream)
  Event returned_[kSlots];     // a slot's copy back is done (back_)
  Event all_returned_;         // every copy back of the operation is done (back_)
  Event released_;             // the last copy out of the area is done
};

}  // namespace lockstep::cuda
