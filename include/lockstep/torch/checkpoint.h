// Checkpoints for a data-parallel job: written by rank 0 alone, read by
// rank 0 alone and broadcast, so only rank 0 needs the file (no shared disk
// between hosts) and every rank resumes from the same bytes.
//
//   lockstep::torch::save_checkpoint_on_rank0(*pg, "job.ckpt", [&](torch::serialize::OutputArchive& out) {
//     net->save(out);                       // on rank 0; the callback does not run elsewhere
//   });
//   lockstep::torch::load_checkpoint_broadcast(*pg, "job.ckpt", [&](torch::serialize::InputArchive& in) {
//     net->load(in);                        // on every rank, from rank 0's file
//   });
//
// With a ZeroRedundancyOptimizer, call opt.consolidate_state_dict(0) on every
// rank before saving (opt.save(out) in the callback) and opt.load(in) when
// loading: each rank keeps its shard.
//
// Both are collective. Thread-safety: as the group's other collectives.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>

#include "lockstep/process_group.h"

namespace lockstep::torch {

// Rank 0 saves as save_checkpoint() does (atomically); then every rank learns
// whether it worked: on failure each rank throws Error with rank 0's reason.
void save_checkpoint_on_rank0(ProcessGroup& pg, const std::string& path,
                              const std::function<void(::torch::serialize::OutputArchive&)>& write);

// Rank 0 reads `path` (with load_checkpoint()'s checks) and broadcasts its
// bytes; every rank then runs `read` on them. Returns false on every rank
// when rank 0 has no file there; throws Error on every rank, with rank 0's
// reason, when the file cannot be used.
bool load_checkpoint_broadcast(ProcessGroup& pg, const std::string& path,
                               const std::function<void(::torch::serialize::InputArchive&)>& read);

}  // namespace lockstep::torch
