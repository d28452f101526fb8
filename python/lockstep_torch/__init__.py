"""lockstep's collectives as a torch.distributed backend.

    import lockstep_torch  # registers the backend "lockstep"
    torch.distributed.init_process_group("lockstep")

Every torch.distributed collective on CPU tensors, and DistributedDataParallel,
then runs on lockstep: shared memory between the ranks of a host, TCP across
hosts, with lockstep's mismatch checks and hang diagnostics. See docs/python.md.
"""

import torch
import torch.distributed as dist

from . import _C

__all__ = ["BACKEND"]

BACKEND = "lockstep"


def _create(options, backend_options):
    return _C._create_backend(options, backend_options)


dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
