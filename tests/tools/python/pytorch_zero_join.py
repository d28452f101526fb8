"""PyTorch's side of tests/torch/pytorch_zero_join_parity.cc: two gloo
processes train a small MLP with DDP on uneven batches (rank 0: 5, rank 1: 3)
under Join, with a StepLR scheduler, and rank 0 writes the final parameters.

    python3 pytorch_zero_join.py OUT_DIR {sgd,adam}

writes, as raw little-endian float32 (parameters in model order: weight and
bias of each Linear):
  init.bin          the initial parameters
  data_rank<r>.bin  rank r's batches, each x (4x8) then y (4x4)
  zero_<opt>.bin    after Join([ddp, zero]), ZeroRedundancyOptimizer(<opt>)
  ddp_<opt>.bin     after Join([ddp]) with the unsharded <opt>
Exits 3 when torch.distributed cannot be imported.
"""
import array
import faulthandler
import os
import sys
import tempfile

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.distributed.algorithms.join import Join
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel
except ImportError as e:
    print(f"no torch.distributed: {e}", file=sys.stderr)
    sys.exit(3)

# A rank still running after this many seconds has hung (a run takes a
# few on a loaded machine): its stacks are printed and it exits (status 1).
HANG_S = float(os.environ.get("LOCKSTEP_REFERENCE_HANG_S", "60"))
BATCHES = (5, 3)  # per rank
ROWS = 4
# The last learning-rate change comes in rank 1's last step: a joined rank's
# scheduler no longer steps, so its shard keeps the rate it joined with.
STEP_SIZE, GAMMA = 3, 0.5
OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
    "adam": (torch.optim.Adam, {"lr": 0.01}),
}


def make_model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def make_batches(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(ROWS, 8, generator=g), torch.randn(ROWS, 4, generator=g)) for _ in range(BATCHES[rank])]


def write(path, tensors):
    values = array.array("f")
    for t in tensors:
        values.extend(t.detach().contiguous().view(-1).tolist())
    if sys.byteorder != "little":
        values.byteswap()
    with open(path, "wb") as f:
        f.write(values.tobytes())


def train(rank, world, store_path, out_path, optimizer, sharded):
    torch.set_num_threads(1)
    # A rank that hangs prints every thread's stack and exits, so the test
    # says where instead of waiting for its deadline (HANG_S below).
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    net = make_model()
    ddp = DistributedDataParallel(net)  # divide_by_initial_world_size=True under Join (the default)
    cls, kwargs = OPTIMIZERS[optimizer]
    if sharded:
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=cls, **kwargs)
    else:
        opt = cls(ddp.parameters(), **kwargs)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=STEP_SIZE, gamma=GAMMA)
    with Join([ddp, opt] if sharded else [ddp]):
        for x, y in make_batches(rank):
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
            sched.step()
    # DDP's join post-hook gave every rank the last joiner's parameters.
    if rank == 0:
        write(out_path, net.parameters())
    dist.destroy_process_group()
    # No teardown of what gloo, DDP and the optimizer hold: a rank destroying
    # them as train() returned hung now and then under load (faulthandler:
    # the stack in mp.spawn's _wrap, after train, a gloo thread still
    # running), and its peer had gone; the results are written by now.
    os._exit(0)


def main():
    out, optimizer = sys.argv[1], sys.argv[2]
    write(os.path.join(out, "init.bin"), make_model().parameters())
    for rank in range(len(BATCHES)):
        write(os.path.join(out, f"data_rank{rank}.bin"), [t for batch in make_batches(rank) for t in batch])
    for sharded, name in ((True, "zero"), (False, "ddp")):
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(train, nprocs=len(BATCHES),
                     args=(len(BATCHES), os.path.join(tmp, "store"), os.path.join(out, f"{name}_{optimizer}.bin"),
                           optimizer, sharded))


if __name__ == "__main__":
    main()
