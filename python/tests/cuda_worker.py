"""The per-rank side of the CUDA tests (test_cuda.py): ranks sharing cuda:0
over the backend "lockstep" (lockstep's staging through pinned host memory).

  collectives  every collective on CUDA tensors against the same collective
               on CPU tensors in the same group, and the stream semantics:
               issued on a side stream, wait() orders the current stream,
               get_future().then() sees the result
  ddp VARIANT  PyTorch's DDP on cuda:0 over "lockstep" against DDP on the
               CPU over "gloo" (float64, same weights and data): weights
               equal within 1e-6 after 20 steps

Exits non-zero with the reason on failure."""

import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import lockstep_torch

import ddp_worker

CUDA = torch.device("cuda", 0)
STEPS = 20


class Checker:
    def __init__(self):
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.checks = 0

    def input(self, rank, n, dtype=torch.float32):
        """Rank `rank`'s input: small integers, exact in float32."""
        return ((torch.arange(n, dtype=torch.float64) % 5) + rank + 1).to(dtype)

    def same(self, what, on_cuda, on_cpu):
        self.checks += 1
        got = on_cuda.cpu() if isinstance(on_cuda, torch.Tensor) else torch.cat([t.cpu().reshape(-1) for t in on_cuda])
        want = on_cpu if isinstance(on_cpu, torch.Tensor) else torch.cat([t.reshape(-1) for t in on_cpu])
        if not torch.equal(got, want):
            raise AssertionError(f"rank {self.rank}: {what}: on cuda {got.tolist()[:8]}, on cpu {want.tolist()[:8]}")


def both(c, what, n, op):
    """Runs `op(device, n)` on CUDA and on CPU tensors; the results must be
    identical."""
    c.same(f"{what} ({n} elements)", op(CUDA, n), op(torch.device("cpu"), n))


def check_collectives(c, n):
    world, rank = c.world, c.rank

    def all_reduce(op):
        def run(device, n):
            t = c.input(rank, n).to(device)
            dist.all_reduce(t, op=op)
            return t
        return run

    for name, op in [("SUM", dist.ReduceOp.SUM), ("AVG", dist.ReduceOp.AVG), ("MAX", dist.ReduceOp.MAX),
                     ("MIN", dist.ReduceOp.MIN), ("PRODUCT", dist.ReduceOp.PRODUCT)]:
        both(c, f"all_reduce {name}", n, all_reduce(op))

    def broadcast(device, n):
        t = c.input(rank, n).to(device)
        dist.broadcast(t, src=world - 1)
        return t

    def reduce(device, n):
        t = c.input(rank, n).to(device)
        dist.reduce(t, dst=0)
        return t if rank == 0 else torch.zeros(0)  # only the destination's result is defined

    def all_gather(device, n):
        out = [torch.empty(n, device=device) for _ in range(world)]
        dist.all_gather(out, c.input(rank, n).to(device))
        return out

    def all_gather_into_tensor(device, n):
        out = torch.empty(n * world, device=device)
        dist.all_gather_into_tensor(out, c.input(rank, n).to(device))
        return out

    def reduce_scatter(device, n):
        out = torch.empty(n, device=device)
        dist.reduce_scatter(out, [c.input(rank + q, n).to(device) for q in range(world)])
        return out

    def reduce_scatter_tensor(device, n):
        out = torch.empty(n, device=device)
        dist.reduce_scatter_tensor(out, c.input(rank, n * world).to(device))
        return out

    def all_to_all_single(device, n):
        # Rank q sends q + 1 + p rows of 3 to rank p: uneven splits.
        send = [q + 1 + p for p in range(world) for q in [rank]]
        recv = [p + 1 + rank for p in range(world)]
        out = torch.empty(sum(recv), 3, device=device)
        dist.all_to_all_single(out, c.input(rank, sum(send) * 3).reshape(-1, 3).to(device), recv, send)
        return out

    def all_to_all(device, n):
        out = [torch.empty(n, device=device) for _ in range(world)]
        dist.all_to_all(out, [c.input(rank * world + p, n).to(device) for p in range(world)])
        return out

    def gather(device, n):
        out = [torch.empty(n, device=device) for _ in range(world)] if rank == 0 else None
        dist.gather(c.input(rank, n).to(device), out, dst=0)
        return out if rank == 0 else torch.zeros(0)

    def scatter(device, n):
        out = torch.empty(n, device=device)
        parts = [c.input(p, n).to(device) for p in range(world)] if rank == 0 else None
        dist.scatter(out, parts, src=0)
        return out

    def send_recv(device, n):
        t = c.input(rank, n).to(device)
        if rank == 0:
            dist.send(t, dst=1)
        elif rank == 1:
            dist.recv(t, src=0)
        return t

    for what, op in [("broadcast", broadcast), ("reduce", reduce), ("all_gather", all_gather),
                     ("all_gather_into_tensor", all_gather_into_tensor), ("reduce_scatter", reduce_scatter),
                     ("reduce_scatter_tensor", reduce_scatter_tensor), ("all_to_all_single", all_to_all_single),
                     ("all_to_all", all_to_all), ("gather", gather), ("scatter", scatter), ("send/recv", send_recv)]:
        both(c, what, n, op)


def check_streams(c, n):
    """c10d's CUDA semantics: a collective issued on a side stream right
    after a kernel that writes its input; wait() makes the current stream
    wait, and a future's then() sees the result."""
    want = c.input(0, n) * 0
    for r in range(c.world):
        want += c.input(r, n) * 2
    side = torch.cuda.Stream(CUDA)
    with torch.cuda.stream(side):
        t = c.input(c.rank, n).to(CUDA)
        torch.cuda._sleep(10_000_000)  # the doubling below lands late unless the collective waits for it
        t.mul_(2)
        work = dist.all_reduce(t, async_op=True)
    work.wait()  # on the default stream, which must now wait for the all-reduce
    c.same("async all_reduce from a side stream, wait()", t.clone(), want)

    t = c.input(c.rank, n).to(CUDA).mul_(2)
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] + 1)
    c.same("get_future().then()", fut.wait(), want + 1)


def case_collectives():
    torch.cuda.set_device(CUDA)
    dist.init_process_group("lockstep")
    c = Checker()
    for n in (1, 13, 1000, 300_000):  # one element, odd, small, several staging chunks
        check_collectives(c, n)
        check_streams(c, n)
    torch.cuda.synchronize()
    print(f"rank {c.rank}: {c.checks} checks of CUDA against CPU passed")
    dist.destroy_process_group()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                        torch.nn.ReLU())
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.body(x))


def train(device, group, variant, rank, world):
    torch.manual_seed(0)
    model = Net().double().to(device)
    kwargs = {"process_group": group, "gradient_as_bucket_view": variant == "gradient_as_bucket_view"}
    ddp = DDP(model, bucket_cap_mb=0.01, **kwargs)  # small buckets: several all-reduces a step
    if variant == "allreduce_hook":  # the hook path: a Python future on the Work's future
        ddp.register_comm_hook(group, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(1234)
    for _ in range(STEPS):
        x = torch.randn(world * 8, 32, generator=data, dtype=torch.float64)
        y = torch.randint(0, 10, (world * 8,), generator=data)
        shard = slice(rank * 8, (rank + 1) * 8)
        loss = torch.nn.functional.cross_entropy(ddp(x[shard].to(device)), y[shard].to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().cpu() for p in model.parameters()]


def case_ddp(variant):
    torch.cuda.set_device(CUDA)
    torch.backends.cuda.matmul.allow_tf32 = False
    dist.init_process_group("lockstep")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    on_cuda = train(CUDA, None, variant, rank, world)
    on_cpu = train(torch.device("cpu"), gloo, variant, rank, world)
    diff = max((a - b).abs().max().item() for a, b in zip(on_cuda, on_cpu))
    print(f"rank {rank}: {variant}: max |cuda over lockstep - cpu over gloo| = {diff:.3g} after {STEPS} steps")
    dist.destroy_process_group()
    if not diff <= 1e-6:
        sys.exit(f"rank {rank}: {variant}: DDP on cuda:0 over lockstep and on the CPU over gloo trained apart: {diff}")
    ddp_worker.exit_before_freeing(gloo)


def run(case, *args):
    if not lockstep_torch.WITH_CUDA:
        sys.exit("this lockstep_torch was built without CUDA (LOCKSTEP_WITH_CUDA=1 at install)")
    {"collectives": case_collectives, "ddp": case_ddp}[case](*args)
