"""Python programs started by Slurm's srun: importing lockstep_torch gives
torch.distributed's env:// rendezvous what srun does not set (RANK,
WORLD_SIZE, the local placement, MASTER_ADDR and MASTER_PORT), from Slurm's
variables as lockstep reads them; then every collective under a real srun
(a Slurm cluster of one node started by tests/slurm/slurm-cluster.sh; root
with Slurm installed only)."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "tests" / "slurm" / "slurm-cluster.sh"
WORKERS = Path(__file__).resolve().parent / "workers.py"
PLACEMENT = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# Third task of a 4-task step on two nodes, two tasks each.
SRUN_TASK = {"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
             "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NODELIST": "cn[07-08]", "SLURM_JOB_ID": "4242"}


def placement_after_import(extra):
    env = {k: v for k, v in os.environ.items() if k not in PLACEMENT and not k.startswith("SLURM")}
    env.update(extra)
    out = subprocess.run([sys.executable, "-c", "import os, lockstep_torch; "
                          f"print(' '.join(os.environ.get(n, '-') for n in {PLACEMENT!r}))"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_importing_under_srun_fills_in_what_env_rendezvous_needs():
    assert placement_after_import(SRUN_TASK) == ["2", "4", "0", "2", "cn07", "19242"]


def test_what_the_environment_already_says_is_kept():
    assert placement_after_import(dict(SRUN_TASK, MASTER_PORT="29501")) == ["2", "4", "0", "2", "cn07", "29501"]
    # Not under srun, or under a launcher that sets RANK (torchrun in an allocation): nothing is added.
    assert placement_after_import({}) == ["-"] * 6
    assert placement_after_import(dict(SRUN_TASK, RANK="0", WORLD_SIZE="1")) == ["0", "1", "-", "-", "-", "-"]


def slurm_missing():
    if os.geteuid() != 0:
        return "needs root (slurmd starts the tasks as their user)"
    missing = [t for t in ("munged", "slurmctld", "slurmd", "srun") if shutil.which(t) is None]
    return f"no {', '.join(missing)} (Debian's slurm-wlm and munge)" if missing else ""


@pytest.mark.skipif(bool(slurm_missing()), reason=slurm_missing() or "Slurm is here")
def test_every_collective_under_srun_equals_gloo():
    with tempfile.TemporaryDirectory(prefix="lockstep-slurm-") as work:
        os.chmod(work, 0o755)  # munged wants every directory above its socket searchable by all
        cluster = Path(work) / "cluster"
        started = subprocess.run([str(CLUSTER), "start", str(cluster), "4"], capture_output=True, text=True,
                                 timeout=120)
        try:
            assert started.returncode == 0, started.stderr
            env = {k: v for k, v in os.environ.items() if k not in PLACEMENT and not k.startswith("SLURM")}
            env["SLURM_CONF"] = str(cluster / "slurm.conf")
            env["LOCKSTEP_TIMEOUT"] = "60"
            srun = subprocess.run(["srun", "-n", "2", sys.executable, str(WORKERS), "collectives", "float32"],
                                  env=env, capture_output=True, text=True, timeout=300)
            assert srun.returncode == 0, srun.stdout + srun.stderr
            for rank in (0, 1):
                assert f"rank {rank}: " in srun.stdout and "checks passed" in srun.stdout, srun.stdout
        finally:
            subprocess.run([str(CLUSTER), "stop", str(cluster)], capture_output=True, timeout=120)
