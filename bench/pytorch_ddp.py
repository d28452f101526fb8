#!/usr/bin/python3
"""PyTorch's own DistributedDataParallel (over Gloo, or with --backend lockstep
over lockstep's torch.distributed backend), measured like
examples/ddp_throughput: the same models, batch per rank, SGD, one intra-op
thread per rank, each rank pinned to its own core. With -np 1 it trains
without DDP (the single-process baseline). --no-sync runs backward under
DDP's no_sync(), so step - no_sync step is the exposed communication.

Usage: /usr/bin/python3 bench/pytorch_ddp.py --model mlp -np 2 [--steps 20] [--no-sync]
Prints: step_ms <median of the slowest rank> samples_per_s <...>
"""
import argparse
import contextlib
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class Mlp(nn.Module):
    def __init__(self, layers=6, width=2048):
        super().__init__()
        self.fc = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))

    def forward(self, x):
        for i, layer in enumerate(self.fc):
            x = layer(x)
            if i + 1 < len(self.fc):
                x = F.relu(x)
        return x


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rank(rank, args, port):
    if args.backend == "lockstep":
        import lockstep_torch  # noqa: F401  registers the backend in this rank's process
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(1)
    world = args.nnodes * args.np
    rank = args.node_rank * args.np + rank
    distributed = world > 1
    if distributed:
        dist.init_process_group(args.backend, init_method=f"tcp://{args.master_addr}:{port}", rank=rank, world_size=world)
    torch.manual_seed(1)
    model = Mlp() if args.model == "mlp" else ConvNet()
    net = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=args.bucket_view) if distributed else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(100 + rank)
    conv = args.model == "convnet"
    x = torch.randn(args.batch, 1, 28, 28) if conv else torch.randn(args.batch, 2048)
    y = torch.randint(0, 10, (args.batch,)) if conv else torch.randn(args.batch, 2048)
    times = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        opt.zero_grad()
        # PyTorch's DDP decides at the forward whether the backward will
        # synchronise: no_sync must cover both.
        with net.no_sync() if distributed and args.no_sync else contextlib.nullcontext():
            out = net(x)
            loss = F.cross_entropy(out, y) if conv else F.mse_loss(out, y)
            loss.backward()
        opt.step()
        if step >= args.warmup:
            times.append((time.perf_counter() - start) * 1000)
    times.sort()
    median = torch.tensor([times[len(times) // 2]], dtype=torch.float64)
    if distributed:
        dist.all_reduce(median, op=dist.ReduceOp.MAX)
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"model {args.model} ({params / 1e6:.1f}M parameters), {world} rank(s), PyTorch {torch.__version__} "
              f"{'DDP ' + args.backend if distributed else 'no DDP'}, batch {args.batch} per rank, "
              f"{'no_sync' if args.no_sync else 'synchronised'}")
        print(f"step_ms {median.item():.2f} samples_per_s {args.batch * world * 1000 / median.item():.1f}", flush=True)
    if distributed:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["mlp", "convnet"], default="mlp")
    parser.add_argument("-np", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-sync", action="store_true")
    parser.add_argument("--bucket-view", action="store_true")
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
    if args.np * args.nnodes == 1:
        run_rank(0, args, 0)
    else:
        mp.spawn(run_rank, args=(args, port), nprocs=args.np, join=True)


if __name__ == "__main__":
    sys.exit(main())
