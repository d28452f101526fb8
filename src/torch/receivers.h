// The ranks a root sends something to alone, by point-to-point transfers
// (a replacement fed by one peer while the others hold the bytes already):
// the check that they can be sent to, and the transfers of one buffer.
// Used by send_coalesced and by broadcast_optimizer_state's sends.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "lockstep/process_group.h"
#include "lockstep/torch/ddp.h"

namespace lockstep::torch {

class Receivers {
 public:
  // Throws InvalidArgument naming `caller` when a receiver is outside the
  // group or is the root.
  Receivers(const ProcessGroup& group, int root, std::vector<int> ranks, std::string_view caller);

  bool sending(const ProcessGroup& group) const { return group.rank() == root_; }
  bool receiving(const ProcessGroup& group) const;
  bool empty() const { return ranks_.empty(); }
  const std::vector<int>& ranks() const { return ranks_; }

  // The root's sends of `b` to every receiver, or this receiver's receive
  // from the root, appended to `transfers`; nothing on the other ranks. A
  // large host buffer is written by the root into a receiver on its
  // machine (written_across.h) before this returns, else sent.
  void issue(ProcessGroup& group, Buffer b, int tag, std::vector<std::shared_ptr<Work>>& transfers) const;

 private:
  int root_;
  std::vector<int> ranks_;
};

// send_coalesced (lockstep/torch/ddp.h) to receivers already checked.
void send_coalesced(ProcessGroup& pg, const std::vector<::torch::Tensor>& tensors, const Receivers& to,
                    std::size_t in_place_bytes = kInPlaceBroadcastBytes);

}  // namespace lockstep::torch
