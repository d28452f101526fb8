"""PyTorch's own distributed test battery (torch.testing._internal.
distributed.distributed_test: TestDistBackend + DistributedTest._DistTestBase,
the suite PyTorch's CI runs for gloo, nccl, ucc and mpi) against the
torch.distributed backend "lockstep", one test at a time in fresh spawned
ranks, as PyTorch runs it.

Which tests run is chosen by the battery's own decorators, which read the
backend's name when the module is imported. LOCKSTEP_BATTERY_SELECTION says
which name they read:

  gloo    (default) exactly the tests PyTorch runs for gloo on CPU: the
          battery is imported as if for gloo, then every rank initializes
          "lockstep". This is the bar: lockstep runs everything gloo runs.
  plugin  the selection a third-party backend gets by name: "lockstep"
          added to DistTestCases.backend_feature ("ddp", "subgroup",
          "plugin"), as out-of-tree backends' test files do.

The world size is WORLD_SIZE (2 or 3 in `make test-battery`). Tests that
lockstep does not pass are listed, each with its reason, in skips.txt beside
this file; they are skipped with that reason, and every other test that the
battery does not skip by itself must pass. See docs/python.md, "PyTorch's
test battery".
"""

import os
import sys
import unittest
from pathlib import Path

SELECTION = os.environ.get("LOCKSTEP_BATTERY_SELECTION", "gloo")
if SELECTION not in ("gloo", "plugin"):
    sys.exit(f"LOCKSTEP_BATTERY_SELECTION={SELECTION!r}: use gloo or plugin")
if "WORLD_SIZE" not in os.environ:
    sys.exit("pytorch_battery: set WORLD_SIZE (the battery's world, e.g. 2 or 3)")

# The battery reads BACKEND when it is imported; its decorators choose the
# tests from it then. The ranks' init_process_group reads the module's
# BACKEND at run time, which is set to "lockstep" below.
os.environ["BACKEND"] = "gloo" if SELECTION == "gloo" else "lockstep"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import lockstep_torch  # noqa: E402,F401  (registers "lockstep")
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if SELECTION == "plugin":
    for feature in ("ddp", "subgroup", "plugin"):
        DistTestCases.backend_feature[feature].add(lockstep_torch.BACKEND)

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed import distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

# From here on every rank initializes lockstep, and the tests' own checks of
# BACKEND (`if BACKEND == "gloo": ...` inside a test) see lockstep's name.
distributed_test.BACKEND = lockstep_torch.BACKEND
os.environ["BACKEND"] = lockstep_torch.BACKEND

SKIPS_FILE = Path(__file__).resolve().parent / "skips.txt"


def read_skips(path: Path, world_size: str, selection: str) -> dict[str, str]:
    """skips.txt: `test_name  [world=N] [selection=S]  # reason`, one a line.
    A test listed without world= or selection= is skipped in every run."""
    skips = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        entry, sep, reason = text.partition("#")
        fields = entry.split()
        if not sep or not reason.strip() or not fields:
            sys.exit(f"{path}:{number}: write `test_name  # reason` (every skip says why)")
        name, conditions = fields[0], dict(f.split("=", 1) for f in fields[1:])
        unknown = set(conditions) - {"world", "selection"}
        if unknown:
            sys.exit(f"{path}:{number}: unknown condition {sorted(unknown)}; use world=N or selection=gloo|plugin")
        if conditions.get("world", world_size) != world_size or conditions.get("selection", selection) != selection:
            continue
        skips[name] = reason.strip()
    return skips


SKIPS = read_skips(SKIPS_FILE, os.environ["WORLD_SIZE"], SELECTION)


class TestLockstepBackend(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        # Forked, not spawned: a spawned rank spends 3-4 s of CPU importing
        # torch and the battery again, which over some 200 tests is most
        # of the run on two cores. The parent has imported modules only
        # (no group, no thread, no CUDA), so a fork is a clean rank.
        self._start_processes(torch.multiprocessing.get_context("fork").Process)
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


def _apply_skips() -> None:
    missing = [name for name in SKIPS if not hasattr(TestLockstepBackend, name)]
    if missing:
        sys.exit(f"{SKIPS_FILE}: no such test in this PyTorch's battery: {', '.join(missing)}")
    # LOCKSTEP_BATTERY_RUN_LISTED=1 runs the listed tests too, to see which
    # entries a newer PyTorch or lockstep has made stale.
    if os.environ.get("LOCKSTEP_BATTERY_RUN_LISTED") == "1":
        return
    for name, reason in SKIPS.items():
        setattr(TestLockstepBackend, name, unittest.skip(f"lockstep: {reason}")(getattr(TestLockstepBackend, name)))


_apply_skips()

if __name__ == "__main__":
    run_tests()
