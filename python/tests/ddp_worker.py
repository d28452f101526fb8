"""PyTorch's DistributedDataParallel over "lockstep" and over "gloo", in the
same ranks, from the same initial weights and data: the trained weights must
agree within 1e-6 after 20 steps. Variants: default, find_unused_parameters,
static_graph, gradient_as_bucket_view, and the fp16 compression hook."""

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


def initial_model():
    torch.manual_seed(0)
    return Net().double()


def train(group, variant, rank, world):
    model = initial_model()
    kwargs = {"process_group": group}
    if variant == "find_unused_parameters":
        kwargs["find_unused_parameters"] = True
    if variant == "static_graph":
        kwargs["static_graph"] = True
    if variant == "gradient_as_bucket_view":
        kwargs["gradient_as_bucket_view"] = True
    ddp = DDP(model, bucket_cap_mb=0.01, **kwargs)  # small buckets: several all-reduces a step
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
    return [p.detach().clone() for p in model.parameters()]


def run(variant):
    dist.init_process_group("lockstep")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    over_lockstep = train(None, variant, rank, world)
    over_gloo = train(gloo, variant, rank, world)
    diff = max((a - b).abs().max().item() for a, b in zip(over_lockstep, over_gloo))
    moved = max((a - b).abs().max().item() for a, b in zip(over_lockstep, initial_model().parameters()))
    print(f"rank {rank}: {variant}: max |lockstep - gloo| = {diff:.3g} after {STEPS} steps "
          f"(weights moved by up to {moved:.3g})")
    dist.destroy_process_group()
    if not diff <= 1e-6:
        sys.exit(f"rank {rank}: {variant}: lockstep and gloo trained apart: {diff}")
