"""lockstep_torch on CUDA tensors: ranks sharing cuda:0 over "lockstep"
(see cuda_worker.py), and what the CPU build says of a CUDA tensor. The
GPU tests need a GPU and the CUDA build (LOCKSTEP_WITH_CUDA=1; on a GPU
machine: scripts/gpu-check.sh python); elsewhere they skip, saying which
is missing."""

import re

import pytest
import torch
import torch.distributed as dist

import lockstep_torch
from launch import run_world
from test_backend import passed

MISSING = "; ".join(
    ([] if torch.cuda.is_available() else ["no CUDA GPU on this machine"])
    + ([] if lockstep_torch.WITH_CUDA else
       ["lockstep_torch was built for CPU tensors only (LOCKSTEP_WITH_CUDA=1 pip install ... builds the CUDA one)"]))
needs_gpu_and_cuda_build = pytest.mark.skipif(bool(MISSING), reason=MISSING)


def test_lockstep_is_registered_for_cpu_and_cuda_tensors():
    assert dist.Backend.backend_capability[lockstep_torch.BACKEND] == ["cpu", "cuda"]


@pytest.mark.skipif(lockstep_torch.WITH_CUDA, reason="the CUDA build takes CUDA tensors")
def test_the_cpu_build_refuses_cuda_tensors_naming_the_cuda_build():
    message = lockstep_torch._C._without_cuda_message("cuda:0")
    assert "cuda:0" in message and "LOCKSTEP_WITH_CUDA=1" in message, message


@needs_gpu_and_cuda_build
def test_every_collective_on_cuda_tensors_equals_the_same_on_cpu_tensors():
    for out in passed(run_world("cuda", 2, "collectives", deadline_s=240)):
        checks = re.search(r"(\d+) checks of CUDA against CPU passed", out)
        assert checks and int(checks.group(1)) > 50, out


@needs_gpu_and_cuda_build
@pytest.mark.parametrize("variant", ["default", "gradient_as_bucket_view", "allreduce_hook"])
def test_ddp_on_cuda_over_lockstep_trains_as_on_cpu_over_gloo(variant):
    for out in passed(run_world("cuda", 2, "ddp", variant, deadline_s=240)):
        assert "max |cuda over lockstep - cpu over gloo|" in out, out
