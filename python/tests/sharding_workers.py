"""The per-rank side of test_sharding.py: what PyTorch builds on a process
group (FSDP2, DTensor redistribution, torch.distributed.checkpoint) run over
the default group on the backend named on the command line, "lockstep" or
"gloo". Each case checks what it can against exact answers, exits non-zero
with the reason on failure, and has rank 0 write its results to a file, so
that the test can compare the two backends' results value by value."""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, get_state_dict, set_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import lockstep_torch  # noqa: F401  registers "lockstep"

TRAIN_STEPS = 10
ROWS_PER_RANK = 8
FSDP_WORLD = 2  # the world the FSDP comparison trains in; the reference uses its global batch
# Layer sizes that split unevenly somewhere: 3 output rows at 2 ranks, 20
# and 16 rows at 3 (FSDP2 pads the last shards).
FEATURES, WIDE, NARROW, OUTPUTS = 12, 20, 16, 3
DTYPES = {"float32": torch.float32, "float64": torch.float64}


# ---- the model and data, shared with the single-process reference in the test

def make_model(dtype, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, WIDE), torch.nn.Tanh(),
                               torch.nn.Linear(WIDE, NARROW), torch.nn.Tanh(),
                               torch.nn.Linear(NARROW, OUTPUTS)).to(dtype)


def global_batch(step, dtype, world=FSDP_WORLD):
    """Step `step`'s batch of every rank together: rank r's rows are
    r * ROWS_PER_RANK onwards. Seeded by the step alone, so any process
    draws the same batch."""
    data = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(world * ROWS_PER_RANK, FEATURES, generator=data, dtype=dtype)
    y = torch.randn(world * ROWS_PER_RANK, OUTPUTS, generator=data, dtype=dtype)
    return x, y


def rows_of(rank):
    return slice(rank * ROWS_PER_RANK, (rank + 1) * ROWS_PER_RANK)


def make_sgd(params):
    # SGD rather than Adam for the backend comparison: Adam divides by the
    # gradient's running magnitude, so a last-bit difference in a near-zero
    # gradient could become a visible step; momentum keeps steps proportional.
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def train_one_process(dtype):
    """The non-distributed reference: the whole global batch in one process,
    the mean loss over it (what FSDP's averaged gradients amount to when
    every rank holds as many rows)."""
    model = make_model(dtype)
    opt = make_sgd(model.parameters())
    for step in range(TRAIN_STEPS):
        x, y = global_batch(step, dtype)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ---- helpers

def shard_every_layer(model, mesh, by_columns=False):
    """fully_shard on each Linear and on the root, as FSDP2 is meant to be
    applied: one all-gather and one reduce-scatter per layer. `by_columns`
    shards along dim 1 the weight matrices whose columns divide evenly
    among the ranks (FSDP2 pads only dim 0); the others keep dim 0."""
    kwargs = {"mesh": mesh}
    if by_columns:
        def columns_where_even(param):
            return Shard(1) if param.dim() > 1 and param.shape[1] % mesh.size() == 0 else None
        kwargs["shard_placement_fn"] = columns_where_even
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def full_model_state(model):
    """Every parameter whole, on every rank (FSDP2 all-gathers them)."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().clone() for k, v in state.items()}


def flatten(tree, prefix=""):
    """A nested state dict as {"a/b/c": leaf}, to compare two of them key by key."""
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        return {prefix: tree}
    out = {}
    for key, value in items:
        out.update(flatten(value, f"{prefix}/{key}" if prefix else str(key)))
    return out


def as_full(value):
    return value.full_tensor() if isinstance(value, DTensor) else value


def fail(message):
    sys.exit(f"rank {dist.get_rank()}: {message}")


def save_from_rank0(results, path):
    if dist.get_rank() == 0:
        torch.save(results, path)


def leave(backend):
    """Destroys the group and ends the rank. Over gloo, without the
    interpreter's teardown: DeviceMesh and DTensor keep the group alive past
    destroy_process_group, and a Gloo worker thread of PyTorch 2.11 may drop
    its last reference to a finished collective's tensors only while the
    interpreter finalises; taking the GIL then ends the thread inside a
    noexcept frame ("terminate called without an active exception", SIGABRT,
    about one world in six at 3 ranks on 2 cores; compare
    pytorch/pytorch#190489). The gloo control's exit is not under test here.
    Lockstep's ranks exit normally, so a crash in their teardown fails."""
    dist.destroy_process_group()
    if backend == "gloo":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


# ---- FSDP2 training

def train_fsdp(dtype, mesh):
    rank = dist.get_rank()
    model = shard_every_layer(make_model(dtype), mesh)
    first_weight = model[0].weight
    if not isinstance(first_weight, DTensor) or first_weight.to_local().numel() >= first_weight.numel():
        fail(f"fully_shard left {type(first_weight).__name__} of local size "
             f"{tuple(first_weight.to_local().shape)}: not sharded")
    opt = make_sgd(model.parameters())
    for step in range(TRAIN_STEPS):
        x, y = global_batch(step, dtype)
        loss = torch.nn.functional.mse_loss(model(x[rows_of(rank)]), y[rows_of(rank)])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return full_model_state(model)


def case_fsdp(backend, out_path):
    """Trains the MLP under FSDP2 in float32 (whose gradients FSDP reduces
    with ReduceOp.AVG) and in float64 (SUM between a pre- and a post-divide),
    and writes the whole trained weights."""
    dist.init_process_group(backend)
    if dist.get_world_size() != FSDP_WORLD:
        fail(f"the FSDP case runs at world {FSDP_WORLD}")
    mesh = init_device_mesh("cpu", (FSDP_WORLD,))
    results = {name: train_fsdp(dtype, mesh) for name, dtype in DTYPES.items()}
    save_from_rank0(results, out_path)
    print(f"rank {dist.get_rank()}: fsdp over {backend}: trained {TRAIN_STEPS} steps in "
          f"{', '.join(DTYPES)}")
    leave(backend)


# ---- DTensor redistribution

class ExactChecks:
    """Compares each DTensor result with the exact tensor it must hold and
    keeps the whole results for rank 0 to write."""

    def __init__(self):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.count = 0
        self.results = {}

    def local_shard(self, full, dim):
        """Rank's piece of `full` split along `dim` as Shard(dim) splits it:
        torch.chunk's pieces, empty for ranks past the last piece."""
        pieces = torch.chunk(full, self.world, dim)
        if self.rank < len(pieces):
            return pieces[self.rank]
        return full.narrow(dim, 0, 0)

    def local(self, what, dtensor, want):
        self.expect_equal(f"{what}: local", dtensor.to_local(), want)

    def full(self, what, dtensor, want):
        self.results[what] = self.expect_equal(f"{what}: full_tensor", dtensor.full_tensor(), want)

    def expect_equal(self, what, got, want):
        """Counts one check; fails naming both sides unless `got` is `want`
        exactly, shape and values."""
        self.count += 1
        if got.shape != want.shape or not torch.equal(got, want):
            fail(f"{what} {tuple(got.shape)} {got.flatten()[:6].tolist()} "
                 f"want {tuple(want.shape)} {want.flatten()[:6].tolist()}")
        return got


def check_distribute(c, mesh, name, full):
    for placement, shard_dim in ((Shard(0), 0), (Shard(1), 1), (Replicate(), None)):
        d = distribute_tensor(full, mesh, [placement])
        c.local(f"{name} distribute {placement}", d, full if shard_dim is None else c.local_shard(full, shard_dim))
        c.full(f"{name} distribute {placement}", d, full)


def check_redistribute(c, mesh, name, full):
    """Every move between Shard(0), Shard(1) and Replicate: all-gathers and
    local slicing (on a CPU mesh, PyTorch 2.11's DTensor moves Shard(0) to
    Shard(1) by an all-gather and a chunk, not by an all-to-all)."""
    placements = {"Shard(0)": (Shard(0), 0), "Shard(1)": (Shard(1), 1), "Replicate()": (Replicate(), None)}
    for src_name, (src, _) in placements.items():
        for dst_name, (dst, dst_dim) in placements.items():
            if src_name == dst_name:
                continue
            moved = distribute_tensor(full, mesh, [src]).redistribute(mesh, [dst])
            what = f"{name} {src_name} -> {dst_name}"
            c.local(what, moved, full if dst_dim is None else c.local_shard(full, dst_dim))
            c.full(what, moved, full)


def check_partial(c, mesh, name, full):
    """Partial: rank r holds (r + 1) * full (small integers in float64, so
    the sum, average and maximum over ranks are exact)."""
    contributions = torch.stack([full * (r + 1) for r in range(c.world)])
    mine = contributions[c.rank]
    wants = {"sum": contributions.sum(0), "avg": contributions.sum(0) / c.world,
             "max": contributions.max(0).values}
    for op, want in wants.items():
        for dst, dst_dim in ((Replicate(), None), (Shard(0), 0)):
            partial = DTensor.from_local(mine.clone(), mesh, [Partial(op)])
            moved = partial.redistribute(mesh, [dst])
            what = f"{name} Partial({op}) -> {dst}"
            c.local(what, moved, want if dst_dim is None else c.local_shard(want, dst_dim))
            c.full(what, moved, want)


def check_sharded_math(c, mesh, name, full):
    """Operators on sharded DTensors, whose results need collectives: a
    row-sharded matrix times a replicated one, and a sum over the sharded
    dimension (a Partial result, reduced by full_tensor)."""
    right = torch.arange(full.shape[1] * 4, dtype=full.dtype).view(full.shape[1], 4) % 7 - 3
    rows = distribute_tensor(full, mesh, [Shard(0)])
    c.full(f"{name} Shard(0) @ Replicate", rows @ distribute_tensor(right, mesh, [Replicate()]), full @ right)
    c.full(f"{name} Shard(0).sum(0)", rows.sum(0), full.sum(0))
    cols = distribute_tensor(full, mesh, [Shard(1)])
    c.full(f"{name} Shard(1) @ Replicate", cols @ distribute_tensor(right, mesh, [Replicate()]), full @ right)


def case_dtensor(backend, out_path):
    dist.init_process_group(backend)
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    c = ExactChecks()
    # Integer values in float64 (every sum and product exact), in a shape
    # that splits evenly over the ranks and in one that does not.
    shapes = {"even": (2 * world, 3 * world), "uneven": (2 * world + 1, world + 2)}
    for name, shape in shapes.items():
        full = (torch.arange(shape[0] * shape[1], dtype=torch.float64).view(shape) % 11) - 5
        check_distribute(c, mesh, name, full)
        check_redistribute(c, mesh, name, full)
        check_partial(c, mesh, name, full)
        check_sharded_math(c, mesh, name, full)
    save_from_rank0(c.results, out_path)
    print(f"rank {c.rank}: dtensor over {backend} at world {world}: {c.count} checks passed")
    leave(backend)


# ---- torch.distributed.checkpoint

CHECKPOINT_STEPS = 3


def adam(model):
    return torch.optim.Adam(model.parameters(), lr=0.01)


def table_values(dtype=torch.float32):
    """A tensor saved beside the model as a bare DTensor, sharded by columns."""
    return torch.arange(7 * 5, dtype=dtype).view(7, 5) / 4 - 3


def full_checkpoint_values(model, opt, table):
    """What the checkpoint holds, whole: weights, Adam's moments and step,
    and the table."""
    options = StateDictOptions(full_state_dict=True)
    return flatten({"model": full_model_state(model),
                    "optim": get_optimizer_state_dict(model, opt, options=options),
                    "extra": {"table": as_full(table)}})


def case_dcp_save(backend, checkpoint_dir, out_path):
    """Trains the FSDP2 MLP a few Adam steps (so the optimizer has state) and
    saves model, optimizer and a column-sharded table with dcp.save; rank 0
    writes the whole values the checkpoint must restore."""
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    model = shard_every_layer(make_model(torch.float32), mesh)
    opt = adam(model)
    for step in range(CHECKPOINT_STEPS):
        x, y = global_batch(step, torch.float32, world)
        loss = torch.nn.functional.mse_loss(model(x[rows_of(rank)]), y[rows_of(rank)])
        opt.zero_grad()
        loss.backward()
        opt.step()
    table = distribute_tensor(table_values(), mesh, [Shard(1)])
    model_state, optim_state = get_state_dict(model, opt)
    dcp.save({"model": model_state, "optim": optim_state, "extra": {"table": table}},
             checkpoint_id=checkpoint_dir)
    save_from_rank0(full_checkpoint_values(model, opt, table), out_path)
    print(f"rank {rank}: dcp.save over {backend} at world {world}: saved")
    leave(backend)


def case_dcp_load(backend, checkpoint_dir, saved_path, out_path):
    """Loads that checkpoint into a model and optimizer sharded differently
    (another world size; at 3 ranks, the first weight matrix split by
    columns, the others by rows into pieces of other sizes; the table by
    rows) that start from other values, and checks every restored value
    against the saved ones."""
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    model = shard_every_layer(make_model(torch.float32, seed=99), mesh, by_columns=world > 1)
    opt = adam(model)
    table = distribute_tensor(torch.zeros(7, 5), mesh, [Shard(0)])
    saved = torch.load(saved_path)
    model_state, optim_state = get_state_dict(model, opt)  # initialises Adam's state, to load into
    if torch.equal(full_model_state(model)["0.weight"], saved["model/0.weight"]):
        fail("the model to load into already holds the saved weights: the test would prove nothing")
    state = {"model": model_state, "optim": optim_state, "extra": {"table": table}}
    dcp.load(state, checkpoint_id=checkpoint_dir)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    loaded = full_checkpoint_values(model, opt, state["extra"]["table"])
    compare_restored(loaded, saved)
    save_from_rank0(loaded, out_path)
    print(f"rank {rank}: dcp.load over {backend} at world {world}: {len(saved)} values restored exactly")
    leave(backend)


def compare_restored(loaded, saved):
    if loaded.keys() != saved.keys():
        fail(f"restored keys differ: missing {sorted(saved.keys() - loaded.keys())}, "
             f"extra {sorted(loaded.keys() - saved.keys())}")
    for key, want in saved.items():
        got = loaded[key]
        same = torch.equal(got, want) if isinstance(want, torch.Tensor) else got == want
        if not same:
            fail(f"{key}: restored {got} but saved {want}")


# ---- the group's end

def case_outlive_store_host(backend):
    """Rank 0 hosts the job's store (MASTER_ADDR); it exits right after
    destroy_process_group while the other ranks stay 3 s longer with a
    DeviceMesh still referring to the group, as every DTensor or FSDP2
    program has. Nothing of the destroyed group should touch the store in
    those 3 s."""
    dist.init_process_group(backend)
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    dist.all_reduce(torch.ones(4))
    dist.destroy_process_group()
    if rank != 0:
        time.sleep(3)  # several of lockstep's watchdog polls (every 0.5 s)
    print(f"rank {rank}: leaving, the mesh of {mesh.size()} ranks still held", flush=True)


CASES = {"fsdp": case_fsdp, "dtensor": case_dtensor, "dcp_save": case_dcp_save, "dcp_load": case_dcp_load,
         "outlive_store_host": case_outlive_store_host}


def run(case, *args):
    CASES[case](*args)
