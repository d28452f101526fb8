"""A torch.distributed program as its users write it (gloo, env://, one
all-reduce), for the launcher tests: `lockstep run` must run it unchanged,
as torchrun does. With --fail-rank R, rank R raises instead, through
torch.distributed.elastic's @record, so its error file reaches the
launcher's report."""
import argparse
import datetime
import os

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rank", type=int, default=-1)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == args.fail_rank:
        raise RuntimeError(f"rank {rank} failing on purpose")
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    expected = world * (world + 1) / 2
    if total.item() != expected:
        raise SystemExit(f"rank {rank}: the all-reduce gave {total.item()}, expected {expected}")
    print(f"torch {torch.__version__} rank {rank} of {world}: sum {total.item():g} "
          f"(MASTER_ADDR={os.environ['MASTER_ADDR']} MASTER_PORT={os.environ['MASTER_PORT']} "
          f"USE_AGENT_STORE={os.environ['TORCHELASTIC_USE_AGENT_STORE']})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
