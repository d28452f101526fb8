"""lockstep's collectives as a torch.distributed backend.

    import lockstep_torch  # registers the backend "lockstep"
    torch.distributed.init_process_group("lockstep")

Every torch.distributed collective on CPU tensors, and DistributedDataParallel,
then runs on lockstep: shared memory between the ranks of a host, TCP across
hosts, with lockstep's mismatch checks and hang diagnostics. The CUDA build
(LOCKSTEP_WITH_CUDA=1 at install; `lockstep_torch.WITH_CUDA`) also takes CUDA
tensors, staged through pinned host memory on their current streams.
lockstep_torch.torchft.ProcessGroupLockstep is torchft's process group on
this backend (torchft, an optional extra). See docs/python.md.
"""

import os

import torch
import torch.distributed as dist

from . import _C

__all__ = ["BACKEND", "WITH_CUDA"]

BACKEND = "lockstep"
# Whether this build takes CUDA tensors (built with LOCKSTEP_WITH_CUDA=1).
WITH_CUDA: bool = _C.with_cuda


def _fill_in_slurms_placement():
    """Under srun, what torch.distributed's env:// rendezvous needs and srun
    does not set (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and the local
    placement), from Slurm's variables as lockstep reads them; variables the
    environment already has are kept."""
    if "RANK" in os.environ or "SLURM_PROCID" not in os.environ:
        return
    for name, value in _C._slurm_environment().items():
        os.environ.setdefault(name, value)


_fill_in_slurms_placement()


def _create(options, backend_options):
    return _C._create_backend(options, backend_options)


# "cuda" in both builds: the CPU build then gets CUDA tensors too and refuses
# them with lockstep's message, which names the fix (PyTorch's own refusal
# of a device no backend serves does not). Object collectives and barrier
# still run on the CPU (PyTorch prefers "cpu" where a backend serves both).
dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
