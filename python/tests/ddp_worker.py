"""PyTorch's DistributedDataParallel over "lockstep" and over "gloo", in the
same ranks, from the same initial weights and data: the trained weights must
agree within 1e-6 after 20 steps. Variants: default, find_unused_parameters,
static_graph, gradient_as_bucket_view, the fp16 compression hook, and
large_buckets: a wider model in DDP's default buckets (one of 8 MiB); each
rank then forks, zeroes its gradients (views of that bucket) and runs
another backward while the child compares its gradients with those before
the fork (fork promises the child a snapshot), and the child's writes must
not reach the parent."""

import ctypes
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import lockstep_torch  # noqa: F401

STEPS = 20


class Net(torch.nn.Module):
    """An MLP with a second head, which the find_unused_parameters variant
    leaves out on even steps."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                        torch.nn.ReLU())
        self.head = torch.nn.Linear(64, 10)
        self.extra = torch.nn.Linear(64, 10)

    def forward(self, x, use_extra=False):
        h = self.body(x)
        return self.head(h) + (self.extra(h) if use_extra else 0)


class WideNet(torch.nn.Module):
    """About 1.1M parameters: DDP puts the last two layers in one 8 MiB bucket."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(32, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                          torch.nn.ReLU(), torch.nn.Linear(1024, 10))

    def forward(self, x, use_extra=False):
        return self.layers(x)


def initial_model(variant="default"):
    torch.manual_seed(0)
    return (WideNet() if variant == "large_buckets" else Net()).double()


def grad_bytes(model):
    return [ctypes.string_at(p.grad.data_ptr(), p.grad.numel() * p.grad.element_size()) for p in model.parameters()]


def check_fork_snapshot(ddp, model, rank):
    """Fork-based checkpointing: the child must see the gradients as they were
    at the fork while the parent (and its peers, through the all-reduce)
    overwrite them, and nothing the child writes may reach the parent."""
    before = grad_bytes(model)
    parent_done, child_wrote = os.pipe(), os.pipe()
    child = os.fork()
    if child == 0:
        os.read(parent_done[0], 1)
        # Plain memcmp/memset: a torch operation in a forked child may wait
        # forever for the parent's OpenMP threads.
        same = grad_bytes(model) == before
        for p in model.parameters():
            ctypes.memset(p.grad.data_ptr(), 0xff, p.grad.numel() * p.grad.element_size())
        os.write(child_wrote[1], b"x")
        os._exit(0 if same else 3)
    ddp.zero_grad(set_to_none=False)
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(99 + rank), dtype=torch.float64)
    ddp(x).sum().backward()  # every rank's buckets all-reduced again
    after = grad_bytes(model)
    if after == before:
        sys.exit(f"rank {rank}: the step after the fork did not change the gradients; the check shows nothing")
    os.write(parent_done[1], b"x")
    os.read(child_wrote[0], 1)
    _, status = os.waitpid(child, 0)
    if status != 0:
        sys.exit(f"rank {rank}: the forked child saw the parent's later writes to its gradients (status {status})")
    if grad_bytes(model) != after:
        sys.exit(f"rank {rank}: a forked child's writes reached the parent's gradients")
    print(f"rank {rank}: a forked child kept the gradients of the fork while the parent and its peers wrote on")


def train(group, variant, rank, world):
    model = initial_model(variant)
    kwargs = {"process_group": group}
    if variant == "find_unused_parameters":
        kwargs["find_unused_parameters"] = True
    if variant == "static_graph":
        kwargs["static_graph"] = True
    if variant in ("gradient_as_bucket_view", "large_buckets"):
        kwargs["gradient_as_bucket_view"] = True
    # Small buckets: several all-reduces a step; large_buckets: the default.
    ddp = DDP(model, bucket_cap_mb=25 if variant == "large_buckets" else 0.01, **kwargs)
    if variant == "fp16_hook":
        ddp.register_comm_hook(group, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(1234)
    for step in range(STEPS):
        x = torch.randn(world * 8, 32, generator=data, dtype=torch.float64)
        y = torch.randint(0, 10, (world * 8,), generator=data)
        shard = slice(rank * 8, (rank + 1) * 8)
        use_extra = variant != "find_unused_parameters" or step % 2 == 1
        loss = torch.nn.functional.cross_entropy(ddp(x[shard], use_extra), y[shard])
        opt.zero_grad()
        loss.backward()
        opt.step()
    if variant == "large_buckets" and group is None:
        check_fork_snapshot(ddp, model, rank)
    return [p.detach().clone() for p in model.parameters()]


def exit_before_freeing(gloo):
    """Ends the process while `gloo` is still referenced. PyTorch 2.7
    destroys a ProcessGroupGloo holding the GIL, and its destructor joins
    the group's worker threads; a worker still releasing a Python callback
    it ran (the fp16 hook's `then`) waits for the GIL: both wait forever
    (pytorch/pytorch#154976, merged in June 2025, releases the GIL there).
    Seen here once in about 60 runs of the fp16 hook under PyTorch 2.7.1.
    lockstep's own group was shut down by destroy_process_group already."""
    assert gloo is not None
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run(variant):
    dist.init_process_group("lockstep")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    over_lockstep = train(None, variant, rank, world)
    over_gloo = train(gloo, variant, rank, world)
    diff = max((a - b).abs().max().item() for a, b in zip(over_lockstep, over_gloo))
    moved = max((a - b).abs().max().item() for a, b in zip(over_lockstep, initial_model(variant).parameters()))
    print(f"rank {rank}: {variant}: max |lockstep - gloo| = {diff:.3g} after {STEPS} steps "
          f"(weights moved by up to {moved:.3g})")
    dist.destroy_process_group()
    if not diff <= 1e-6:
        sys.exit(f"rank {rank}: {variant}: lockstep and gloo trained apart: {diff}")
    exit_before_freeing(gloo)
