"""Collective checks with a fake torch.distributed: rank 0 of a simulated 2-rank world.

The fake answers each collective as the other rank would (or wrongly, or never), so the content
verification, the timeout path and the nccl suite are covered without a GPU.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from distdoctor.checks import collective as coll
from distdoctor.fakes import fake_context
from distdoctor.core.registry import SkipCheck

torch = pytest.importorskip("torch")


class Work:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    def wait(self, timeout=None):
        if self.error:
            raise self.error
        return True


class FakeDist:
    """Rank `rank` of a `size`-rank world whose other ranks are simulated here."""

    def __init__(self, rank=0, size=2, corrupt=(), hang=(), barrier_error=None):
        self.rank, self.size = rank, size
        self.corrupt, self.hang, self.barrier_error = set(corrupt), set(hang), barrier_error
        self.calls = []

    def _done(self, name):
        self.calls.append(name)
        if name in self.hang:
            return Work(RuntimeError(f"[Gloo] Timed out waiting 2000ms for {name}"))
        return Work()

    def broadcast(self, t, src, group, async_op):
        if self.rank != src:
            t.copy_(torch.arange(t.numel(), dtype=t.dtype) * 3 + 1)
        if "broadcast" in self.corrupt:
            t[0] = -7
        return self._done("broadcast")

    def all_reduce(self, t, group, async_op):
        if t.numel() == self.size:  # the barrier-wait exchange: other ranks add nothing here
            return self._done("all_reduce")
        t.fill_(self.size * (self.size + 1) / 2)
        if "all_reduce" in self.corrupt:
            t[3] = 0
        return self._done("all_reduce")

    def all_gather(self, out, t, group, async_op):
        for i, slot in enumerate(out):
            slot.fill_(float(i))
        if "all_gather" in self.corrupt:
            out[1].fill_(9.0)
        return self._done("all_gather")

    def isend(self, t, dst, group):
        return self._done("isend")

    def irecv(self, t, src, group):
        t.fill_(100.0 + src)
        return self._done("irecv")

    def broadcast_object_list(self, box, src, group, device=None):
        self.calls.append("broadcast_object_list")

    def monitored_barrier(self, group, timeout, wait_all_ranks):
        self.calls.append("monitored_barrier")
        if self.barrier_error:
            raise self.barrier_error


def ops(dist, backend="gloo", rank=0, size=2):
    return coll.Ops(dist, torch, group=object(), rank=rank, size=size, device=torch.device("cpu"), timeout_s=2.0,
                    backend=backend)


def collect(fn, *args):
    poisoned = []
    return fn(*args, poisoned.append), poisoned


@pytest.mark.parametrize("name, op", list(coll.NCCL_SUITE) + [("broadcast_object_list", coll.op_broadcast_object)])
def test_each_op_passes_when_values_are_right(name, op):
    findings, poisoned = collect(coll.run_op, ops(FakeDist()), name, op)
    assert findings == [] and poisoned == []


@pytest.mark.parametrize("name, op", [n for n in coll.NCCL_SUITE if n[0] != "send_recv_ring"])
def test_wrong_values_are_caught(name, op):
    findings, poisoned = collect(coll.run_op, ops(FakeDist(corrupt={name})), name, op)
    (finding,) = findings
    assert finding.id == "coll.E005" and name in finding.title and poisoned == []


def test_a_timeout_poisons_the_group():
    findings, poisoned = collect(coll.run_op, ops(FakeDist(hang={"all_reduce"})), "all_reduce", coll.op_all_reduce)
    (finding,) = findings
    assert finding.id == "coll.E003" and finding.cause == "collective_timeout_hang"
    assert poisoned == ["gloo all_reduce"]


def test_the_nccl_suite_with_a_fake_nccl_group_stops_at_the_first_failure():
    dist = FakeDist(hang={"all_reduce"})
    findings, poisoned = collect(coll.run_suite, ops(dist, backend="nccl"))
    assert [f.id for f in findings] == ["coll.E003"] and "nccl all_reduce" in findings[0].title
    assert "all_gather" not in dist.calls  # the group is out of step: nothing more on it
    clean, _ = collect(coll.run_suite, ops(FakeDist(), backend="nccl"))
    assert clean == []


def test_monitored_barrier_names_late_ranks_at_rank_0():
    error = RuntimeError("Ranks 2, 3 failed to pass monitoredBarrier in 2000 ms")
    findings, poisoned = collect(coll.barrier_findings, ops(FakeDist(barrier_error=error), size=4))
    (finding,) = findings
    assert finding.id == "coll.E006" and finding.ranks == (2, 3) and poisoned


def test_barrier_straggler_from_the_waits():
    # Rank 3 arrived last: it waited least; the others waited ~3 s for it.
    (finding,) = coll.straggler_findings([3.1, 3.0, 3.05, 0.01], rank=0)
    assert finding.id == "coll.W007" and finding.ranks == (3,)
    assert coll.straggler_findings([0.01, 0.02, 0.0, 0.03], rank=0) == []
    assert coll.straggler_findings([3.1, 3.0, 3.05, 0.01], rank=1) == []  # rank 0 reports


def test_nccl_check_skips_unless_rank_0_decided_for_every_rank():
    world = SimpleNamespace(process_group=lambda *a: None, poisoned=None,
                            decision={"nccl": False, "nccl_reason": "skipped: rank 1 has no GPU"})
    with pytest.raises(SkipCheck, match="rank 1 has no GPU"):
        coll.nccl_collectives(fake_context(world=world))


def test_checks_skip_once_the_group_is_poisoned():
    world = SimpleNamespace(process_group=lambda *a: None, poisoned="gloo broadcast", process_groups={})
    with pytest.raises(SkipCheck, match="out of step"):
        coll.gloo_ops(fake_context(world=world))
