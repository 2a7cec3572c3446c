"""The guard's scenarios on NCCL with 2 GPUs: `python -m pytest tests/gpu` on a GPU machine.

Skipped without CUDA and two GPUs (the development machine is CPU-only: there the NCCL code
paths run against fakes in tests/guard/test_guard_units.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from distdoctor.testing import run_distributed  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.device_count() >= 2 and torch.distributed.is_nccl_available()),
    reason="needs CUDA, 2 GPUs and NCCL",
)
SCENARIOS = str(Path(__file__).with_name("nccl_scenarios.py"))


def run(name: str, timeout: float = 120):
    return run_distributed(f"nccl_scenarios:{name}", module_file=SCENARIOS, world_size=2, backend="nccl",
                           timeout=timeout)


def test_shape_dtype_and_order_mismatches_raise_on_both_ranks():
    result = run("mismatches")
    assert result.ok, result.failure_message()


def test_a_healthy_nccl_loop_leaves_nothing_running_and_no_findings():
    result = run("healthy")
    assert result.ok, result.failure_message()


def test_a_straggler_on_nccl_is_named_from_the_pending_work():
    result = run("straggler")
    rank0 = result.ranks[0]
    assert rank0.status == "failed" and "job.E002 [straggler_rank] Rank 1 has not arrived at all_reduce #" in rank0.message, \
        result.failure_message()
    assert {r.exitcode for r in result.ranks.values()} == {1}, result.failure_message()


def test_a_straggler_in_ddp_on_nccl_is_named_from_the_flight_recorder():
    # DDP's bucket all-reduce runs in C++ on a CUDA stream; the recorder's completed count stops.
    result = run("ddp_straggler")
    rank0 = result.ranks[0]
    assert rank0.status == "failed" and "job.E002 [straggler_rank] Rank 1 has not arrived at " in rank0.message, \
        result.failure_message()
    assert "nccl_scenarios.py" in rank0.message and "time.sleep(120)" in rank0.message, rank0.message


def test_a_slow_nccl_subgroup_beside_an_idle_gloo_default_group_is_watched_never_ended():
    # The proof of "stuck" is read from the stalled group's own backend: NCCL's traffic is on no socket,
    # so the gloo default group's idle sockets must not prove it (they did before issue #43).
    result = run_distributed("nccl_scenarios:slow_nccl_subgroup", module_file=SCENARIOS, world_size=2,
                             backend="gloo", timeout=120)
    assert result.ok, result.failure_message()
