#!/usr/bin/env python3
"""One rank of the smallest program over the "lockstep" torch.distributed
backend: init_process_group from the launcher's variables (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT), one all_reduce of a tensor on DEVICE
(cpu or cuda), destroy_process_group. scripts/gpu-check.sh pyprobe runs it
at world 1 and 2, on both devices, with rank 0 under a debugger, to find
where a rank of the CUDA build crashes; it also checks the sum.

Usage: RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 scripts/python-probe.py cuda
"""
import sys

import torch
import torch.distributed as dist

import lockstep_torch


def main(device_name):
    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(0)
    print(f"probe: lockstep_torch with_cuda={lockstep_torch.WITH_CUDA}, torch {torch.__version__}", flush=True)
    dist.init_process_group("lockstep")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"probe: rank {rank} of {world}: group formed", flush=True)
    t = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(t)
    want = float(world * (world + 1) // 2)
    got = t.cpu().tolist()
    dist.destroy_process_group()
    if got != [want] * 4:
        sys.exit(f"probe: rank {rank}: all_reduce on {device} gave {got}, not {want}")
    print(f"probe: rank {rank} of {world}: all_reduce on {device} gave {want}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cpu")
