"""torchft's reconfigurable process group on the lockstep backend.

    from lockstep_torch.torchft import ProcessGroupLockstep
    manager = torchft.Manager(pg=ProcessGroupLockstep(), ...)

torchft's Manager calls `configure()` on every new quorum; this group then
forms a fresh lockstep backend over the quorum's replica groups (the store
address torchft gives, prefixed per quorum), aborting the previous one. The
collectives torchft issues (its DDP's gradient all-reduce, the optimizer
wrapper's commit, the heal's broadcasts where its transport uses the group)
then run on lockstep: shared memory between replica groups on one host, TCP
across hosts. A replica group that dies mid-collective fails the survivors'
operation with lockstep's error naming it, which torchft reports and
recovers from on the next quorum.

torchft is an optional extra of this package (pip install
"lockstep_torch[torchft]"), never a dependency: this module alone imports it.
See docs/python.md, "torchft".
"""

from datetime import timedelta

import torch
from torch._C._distributed_c10d import _DistributedBackendOptions
from torch.distributed import ProcessGroup as BaseProcessGroup

try:
    from torchft.process_group import ProcessGroupWrapper
except ImportError as e:  # torchft absent: say what to install
    raise ImportError("lockstep_torch.torchft needs torchft, an optional extra of lockstep_torch: "
                      "pip install torchft (or pip install 'lockstep_torch[torchft]')") from e

from . import _C

__all__ = ["ProcessGroupLockstep"]


class ProcessGroupLockstep(ProcessGroupWrapper):
    """A torchft process group whose collectives run on lockstep.

    Args:
        timeout: how long a collective (and the forming of each quorum's
            group) may wait for the other replica groups before it fails
            with lockstep's diagnosis of who did not arrive.
    """

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)

    def _create_pg(self, store, rank: int, world_size: int) -> BaseProcessGroup:
        options = _DistributedBackendOptions()
        options.store = store
        options.group_rank = rank
        options.group_size = world_size
        options.timeout = self._timeout
        # One name per quorum: each quorum's group is a new lockstep group,
        # whose shared segments and keys must not meet the previous one's.
        options.group_id = f"torchft_quorum_{self._quorum_id}"
        options.global_ranks_in_group = list(self._global_ranks or range(world_size))
        backend = _C._create_backend(options, None)
        pg = BaseProcessGroup(store, rank, world_size)
        pg._set_default_backend(BaseProcessGroup.BackendType.CUSTOM)
        pg._register_backend(torch.device("cpu"), BaseProcessGroup.BackendType.CUSTOM, backend)
        if _C.with_cuda and torch.cuda.is_available():
            pg._register_backend(torch.device("cuda"), BaseProcessGroup.BackendType.CUSTOM, backend)
        return pg

    def getBackendName(self) -> str:
        return "torchft-lockstep"
