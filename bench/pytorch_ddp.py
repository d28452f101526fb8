#!/usr/bin/python3
"""PyTorch's own DistributedDataParallel (over Gloo, NCCL, or with --backend
lockstep over lockstep's torch.distributed backend), measured like
examples/ddp_throughput: the same models, batch per rank, SGD, one intra-op
thread per rank, each rank pinned to its own core. With -np 1 it trains
without DDP (the single-process baseline), unless --ddp asks for DDP in a
group of one. --no-sync runs backward under DDP's no_sync(), so step -
no_sync step is the exposed communication. --device cuda trains on
cuda:(rank % devices) (ranks may share a GPU over Gloo, not over NCCL) and
times each step until the device is done with it. --fsdp trains an MLP with
FSDP2 instead of DDP (torch.distributed.fsdp.fully_shard, PyTorch 2.6 or
later: each Linear but the last a unit, then the root), as
examples/ddp_throughput --fsdp does with lockstep's fully_shard.

Usage: /usr/bin/python3 bench/pytorch_ddp.py --model mlp -np 2 [--steps 20] [--no-sync]
       python bench/pytorch_ddp.py --model wide-mlp --device cuda -np 1 --ddp --backend nccl
       .venv/torch2/bin/python bench/pytorch_ddp.py --model deep-mlp --fsdp -np 2
Prints: step_ms <median of the slowest rank> samples_per_s <...>
"""
import argparse
import contextlib
import datetime
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


# Per model: its module, the input's shape after the batch, and the default batch
# per rank (examples/ddp_throughput's: WideMlpImpl in models/lockstep_models/models.h).
MODELS = {
    "mlp": (lambda: Mlp(), (2048,), 64),
    "wide-mlp": (lambda: Mlp(layers=6, width=4096), (4096,), 2048),
    "deep-mlp": (lambda: Mlp(layers=8, width=1024), (1024,), 32),
    "convnet": (lambda: ConvNet(), (1, 28, 28), 64),
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fully_sharded(model, device_type, world):
    """FSDP2's recipe for a model of blocks (each block a unit, then the whole
    model), as examples/ddp_throughput --fsdp applies lockstep's: each Linear
    but the last a unit of its own, then the root, which holds the last."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh(device_type, (world,))
    for layer in model.fc[:-1]:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def run_rank(rank, args, port):
    if args.backend == "lockstep":
        import lockstep_torch  # noqa: F401  registers the backend in this rank's process
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(1)
    world = args.nnodes * args.np
    rank = args.node_rank * args.np + rank
    distributed = world > 1 or args.ddp or args.fsdp
    cuda = args.device == "cuda"
    # As ddp_throughput: the local rank's GPU, shared when ranks outnumber GPUs.
    device = (torch.device("cuda", (rank - args.node_rank * args.np) % torch.cuda.device_count()) if cuda
              else torch.device("cpu"))
    if cuda:
        torch.cuda.set_device(device)
    if distributed:
        timeout = {"timeout": datetime.timedelta(seconds=args.timeout_s)} if args.timeout_s else {}
        dist.init_process_group(args.backend, init_method=f"tcp://{args.master_addr}:{port}", rank=rank, world_size=world,
                                **timeout)
    make_model, shape, _ = MODELS[args.model]
    torch.manual_seed(1)
    model = make_model().to(device)
    if args.fsdp:
        net = fully_sharded(model, device.type, world)  # in place: model's parameters are now its shards
    elif distributed:
        net = nn.parallel.DistributedDataParallel(model, device_ids=[device] if cuda else None,
                                                  gradient_as_bucket_view=args.bucket_view)
    else:
        net = model
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(100 + rank)
    conv = args.model == "convnet"
    x = torch.randn(args.batch, *shape).to(device)
    y = (torch.randint(0, 10, (args.batch,)) if conv else torch.randn(args.batch, *shape)).to(device)
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
        if cuda:
            torch.cuda.synchronize(device)  # a step ends when the device is done with it
        if step >= args.warmup:
            times.append((time.perf_counter() - start) * 1000)
        if step == 0 and rank == 0 and args.announce:
            print("rank 0: training (the first step is done)", flush=True)
    times.sort()
    # On the device: NCCL reduces only CUDA tensors.
    median = torch.tensor([times[len(times) // 2]], dtype=torch.float64, device=device)
    if distributed:
        dist.all_reduce(median, op=dist.ReduceOp.MAX)
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())  # a DTensor's numel is the whole tensor's
        mode = f"FSDP2 {args.backend}" if args.fsdp else f"DDP {args.backend}" if distributed else "no DDP"
        print(f"model {args.model} ({params / 1e6:.1f}M parameters) on {args.device}, {world} rank(s), "
              f"PyTorch {torch.__version__} {mode}, "
              f"batch {args.batch} per rank, "
              f"{'no_sync' if args.no_sync else 'synchronised'}")
        print(f"step_ms {median.item():.2f} samples_per_s {args.batch * world * 1000 / median.item():.1f}", flush=True)
    if distributed:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=list(MODELS), default="mlp")
    parser.add_argument("-np", type=int, default=2)
    parser.add_argument("--batch", type=int, help="samples per rank per step (default 64; wide-mlp 2048, deep-mlp 32)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: the rank's GPU, cuda:(rank %% devices)")
    parser.add_argument("--ddp", action="store_true", help="DDP even with -np 1 (a group of one)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-sync", action="store_true")
    parser.add_argument("--bucket-view", action="store_true")
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) instead of DDP; the MLPs only")
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl", "lockstep"],
                        help="torch.distributed backend; lockstep needs lockstep_torch importable "
                             "(PYTHONPATH=build-torch2/python after `make build-python`)")
    # Across hosts: one invocation per host, like `torchrun --nnodes`.
    parser.add_argument("--nnodes", type=int, default=1, help="hosts, each running -np ranks")
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--master-addr", default="127.0.0.1", help="node 0's address")
    parser.add_argument("--master-port", type=int, default=0, help="default: a free port (one host only)")
    parser.add_argument("--timeout-s", type=float, help="the group's timeout (default: PyTorch's)")
    parser.add_argument("--announce", action="store_true",
                        help="rank 0 says when its first step is done (a test starts its faults then)")
    args = parser.parse_args()
    if args.fsdp and (args.model == "convnet" or args.no_sync or args.bucket_view):
        parser.error("--fsdp shards the MLPs (not the convnet), without --no-sync or --bucket-view")
    if args.batch is None:
        args.batch = MODELS[args.model][2]
    # NVML's count, which leaves CUDA uninitialised in this process, so the
    # ranks can be forked.
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit(f"pytorch_ddp: --device cuda, but PyTorch {torch.__version__} sees no CUDA device")
    port = args.master_port or free_port()
    if args.np * args.nnodes == 1:
        run_rank(0, args, 0)
    else:
        # Forked, not spawned: a spawned rank imports PyTorch again, seconds
        # that bench/compare_gpu_ddp.py would pay in every run of every row.
        mp.start_processes(run_rank, args=(args, port), nprocs=args.np, join=True, start_method="fork")


if __name__ == "__main__":
    sys.exit(main())
