"""lockstep's collectives as a torch.distributed backend.

    import lockstep_torch  # registers the backend "lockstep"
    torch.distributed.init_process_group("lockstep")

Every torch.distributed collective on CPU tensors, and DistributedDataParallel,
then runs on lockstep: shared memory between the ranks of a host, TCP across
hosts, with lockstep's mismatch checks and hang diagnostics. The CUDA build
(LOCKSTEP_WITH_CUDA=1 at install; `lockstep_torch.WITH_CUDA`) also takes CUDA
tensors, staged through pinned host memory on their current streams. See
docs/python.md.
"""

import torch
import torch.distributed as dist

from . import _C

__all__ = ["BACKEND", "WITH_CUDA"]

BACKEND = "lockstep"
# Whether this build takes CUDA tensors (built with LOCKSTEP_WITH_CUDA=1).
WITH_CUDA: bool = _C.with_cuda


def _create(options, backend_options):
    return _C._create_backend(options, backend_options)


# "cuda" in both builds: the CPU build then gets CUDA tensors too and refuses
# them with lockstep's message, which names the fix (PyTorch's own refusal
# of a device no backend serves does not). Object collectives and barrier
# still run on the CPU (PyTorch prefers "cpu" where a backend serves both).
dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
