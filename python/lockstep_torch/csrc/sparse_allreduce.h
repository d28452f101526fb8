// The sum all-reduce of a sparse COO tensor (torch.distributed.all_reduce
// of a torch.sparse_coo tensor, and DDP's sparse gradients, as gloo takes
// them): every rank's coalesced indices and values are all-gathered (with
// per-rank sizes), and every rank builds the sum from the same parts in
// rank order, so all ranks hold the same tensor. Blocks the calling thread
// until done (three all-gathers, each waiting on the one before).
// Thread-safety: the group's (one caller at a time).
#pragma once

#include <ATen/ATen.h>

#include "lockstep/process_group.h"

namespace lockstep_torch {

// The sum over the ranks of `input` (sparse COO, on the CPU), coalesced.
at::Tensor sparse_all_reduce_sum(lockstep::ProcessGroup& group, const at::Tensor& input);

}  // namespace lockstep_torch
