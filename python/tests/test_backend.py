"""lockstep_torch: the torch.distributed backend "lockstep", tested across real
processes against Gloo and against exact answers (see workers.py)."""

import os
import re

import pytest

from launch import run_lockstep_run, run_torchrun, run_world


def passed(ranks):
    for i, r in enumerate(ranks):
        assert r.returncode == 0, f"rank {i} exited {r.returncode}:\n{r.output}"
    return [r.output for r in ranks]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "bfloat16", "float16"])
def test_every_collective_matches_gloo_and_the_exact_answer(world, dtype):
    outputs = passed(run_world("collectives", world, dtype, deadline_s=240))
    for out in outputs:
        checks = re.search(r"(\d+) checks passed, (\d+) of them against gloo", out)
        assert checks, out
        assert int(checks.group(1)) > 100 and int(checks.group(2)) > 10, out


@pytest.mark.parametrize("variant", ["default", "find_unused_parameters", "static_graph",
                                     "gradient_as_bucket_view", "fp16_hook", "large_buckets"])
def test_ddp_over_lockstep_trains_as_over_gloo(variant):
    for out in passed(run_world("ddp", 2, variant)):
        assert "max |lockstep - gloo|" in out, out


def test_started_by_torchrun():
    result = run_torchrun("ddp", 2, "default")
    assert result.returncode == 0, result.output
    assert result.output.count("max |lockstep - gloo|") == 2, result.output


def test_started_by_lockstep_run():
    cli = os.environ.get("LOCKSTEP_CLI", "")
    if not os.access(cli, os.X_OK):
        pytest.skip("LOCKSTEP_CLI does not name the lockstep binary (make test-python sets it)")
    result = run_lockstep_run(cli, "ddp", 2, "default")
    assert result.returncode == 0, result.output
    assert result.output.count("max |lockstep - gloo|") == 2, result.output


def test_operations_it_cannot_do_are_refused_by_name():
    outputs = passed(run_world("wrong_input", 2))
    assert outputs[0].count("refused") == 4, outputs[0]


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_recv_without_src_returns_each_sender_with_its_message(backend, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_BACKEND", backend)
    outputs = passed(run_world("recv_any_source", 3, deadline_s=120))
    assert "received 4 messages from any source" in outputs[0], outputs[0]


def test_a_mismatched_recv_without_src_names_the_sender():
    ranks = run_world("recv_any_source_mismatch", 3, deadline_s=60)
    assert ranks[0].returncode == 3, ranks[0].output
    assert "torch.distributed.recv: " in ranks[0].output, ranks[0].output
    assert "from any rank" in ranks[0].output, ranks[0].output
    assert "but rank 2 sent tag 0, 40 bytes of float" in ranks[0].output, ranks[0].output


def test_mismatched_sizes_raise_on_every_rank():
    ranks = run_world("mismatch", 2, deadline_s=60)
    for i, r in enumerate(ranks):
        assert r.returncode == 3, f"rank {i} exited {r.returncode}:\n{r.output}"
        # Each rank names the function it called, its own operation and
        # the other's.
        assert "torch.distributed.all_gather_into_tensor: " in r.output, r.output
        assert "does not match what rank" in r.output, r.output
        assert "float x 1000" in r.output and "float x 2000" in r.output, r.output


def test_a_killed_rank_is_named_within_seconds():
    ranks = run_world("killed_rank", 2, deadline_s=60)
    assert ranks[1].returncode == -9, ranks[1].output
    assert ranks[0].returncode == 3, ranks[0].output
    seconds = float(re.search(r"raised after ([\d.]+) s", ranks[0].output).group(1))
    assert seconds < 10, ranks[0].output
    assert "rank 1" in ranks[0].output, ranks[0].output
