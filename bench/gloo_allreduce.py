#!/usr/bin/python3
"""PyTorch's Gloo all-reduce, measured like `lockstep bench`.

Starts N local processes (torch.multiprocessing), each pinned to its own core
with one intra-op thread, and times an in-place torch.distributed.all_reduce
of a float32 tensor with the gloo backend (or --backend lockstep: lockstep's
torch.distributed backend, python/) for each size. Prints the same
table as `lockstep bench` (size, count, type, redop, root, time, algbw,
busbw, #wrong); time is the slowest rank's average per iteration.

Usage: /usr/bin/python3 bench/gloo_allreduce.py -np 2 -b 4 -e 64M -f 4 -n 20 -w 5
(Debian's python3-torch is importable from /usr/bin/python3.)
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sizes(args):
    size = parse_size(args.minbytes)
    last = parse_size(args.maxbytes)
    while True:
        yield size
        if size >= last or args.stepfactor <= 1:
            return
        size = int(size * args.stepfactor)


def run_rank(rank, args, port):
    if args.backend == "lockstep":
        import lockstep_torch  # noqa: F401  registers the backend in this rank's process
    cores = sorted(os.sched_getaffinity(0))
    if args.pin:
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(1)
    local_rank = rank
    rank = args.node_rank * args.np + local_rank
    n = args.nnodes * args.np
    dist.init_process_group(args.backend, init_method=f"tcp://{args.master_addr}:{port}", rank=rank, world_size=n)
    if rank == 0:
        print(f"# {args.backend} (torch {torch.__version__}): {n} ranks, {args.iters} iterations after {args.warmup} warm-up")
        print(f"# {'size':>10} {'count':>12} {'type':>8} {'redop':>6} {'root':>6} {'time':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>7}")
        print(f"# {'(B)':>10} {'(elements)':>12} {'':>8} {'':>6} {'':>6} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8} {'':>7}")
    for size in sizes(args):
        count = max(1, size // 4)
        t = torch.full((count,), float(rank + 1), dtype=torch.float32)
        dist.all_reduce(t)
        wrong = int((t != float(n * (n + 1) // 2)).sum().item())
        for _ in range(args.warmup):
            dist.all_reduce(t)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(t)
        us = torch.tensor([(time.perf_counter() - start) * 1e6 / args.iters], dtype=torch.float64)
        dist.all_reduce(us, op=dist.ReduceOp.MAX)
        w = torch.tensor([wrong], dtype=torch.int64)
        dist.all_reduce(w)
        if rank == 0:
            algbw = count * 4 / (us.item() * 1e3)
            busbw = algbw * 2 * (n - 1) / n
            print(f"  {count * 4:>10} {count:>12} {'float':>8} {'sum':>6} {-1:>6} {us.item():>10.2f} {algbw:>8.2f} {busbw:>8.2f} {w.item():>7}",
                  flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-np", type=int, default=2)
    parser.add_argument("-b", "--minbytes", default="4")
    parser.add_argument("-e", "--maxbytes", default="64M")
    parser.add_argument("-f", "--stepfactor", type=float, default=4)
    parser.add_argument("-n", "--iters", type=int, default=20)
    parser.add_argument("-w", "--warmup", type=int, default=5)
    parser.add_argument("--pin", type=int, default=1)
    parser.add_argument("--backend", default="gloo", choices=["gloo", "lockstep"],
                        help="torch.distributed backend; lockstep needs lockstep_torch importable "
                             "(PYTHONPATH=build-torch2/python after `make build-python`)")
    # Across hosts: one invocation per host, like `torchrun --nnodes`.
    parser.add_argument("--nnodes", type=int, default=1, help="hosts, each running -np ranks")
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--master-addr", default="127.0.0.1", help="node 0's address")
    parser.add_argument("--master-port", type=int, default=0, help="default: a free port (one host only)")
    args = parser.parse_args()
    port = args.master_port or free_port()
    mp.spawn(run_rank, args=(args, port), nprocs=args.np, join=True)


if __name__ == "__main__":
    sys.exit(main())
