"""The bench on a backend that lacks collectives (torch 2.1's gloo): all_gather by its list form,
reduce_scatter left out and said, the rest measured; a refusal later in the sweep still stops it."""

from __future__ import annotations

import time

import pytest

from distdoctor.bench.assemble import assemble
from distdoctor.bench.comm import Comm
from distdoctor.bench.sweep import SweepPlan, run_sweep

torch = pytest.importorskip("torch")


class Gloo21:
    """A one-rank world answering as torch 2.1.2's gloo does (its messages, measured)."""

    class ReduceOp:
        MAX = "max"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def all_reduce(self, tensor, op=None, group=None):
        self.calls.append("all_reduce")

    def broadcast(self, tensor, src, group=None):
        self.calls.append("broadcast")

    def all_gather_into_tensor(self, out, inp, group=None):
        raise RuntimeError("no support for _allgather_base in Gloo process group")

    def all_gather(self, outs, inp, group=None):
        self.calls.append("all_gather(list)")
        outs[0].copy_(inp)

    def reduce_scatter_tensor(self, out, inp, group=None):
        raise RuntimeError("Backend gloo does not support _reduce_scatter_base")

    def all_to_all_single(self, out, inp, group=None):
        self.calls.append("all_to_all")
        out.copy_(inp)


def comm(dist) -> Comm:
    return Comm(dist, torch, None, torch.device("cpu"), 0, 1, "gloo")


def plan() -> SweepPlan:
    return SweepPlan(("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"), (1024, 4096), 2, 1,
                     time.monotonic() + 60)


def test_what_the_backend_lacks_is_left_out_or_done_another_way():
    dist = Gloo21()
    rows, stopped, left_out = run_sweep(comm(dist), plan())
    assert stopped is None
    assert {(r["op"], r["correct"]) for r in rows} == {(op, True) for op in ("all_reduce", "all_gather", "broadcast", "all_to_all")}
    assert len(rows) == 8 and "all_gather(list)" in dist.calls
    assert left_out == {"reduce_scatter": "Backend gloo does not support _reduce_scatter_base"}
    bench, findings = assemble(size=1, hosts={0: "vm"}, sweeps={0: rows}, links=[], routes={}, stopped={},
                               backend="gloo", unsupported=left_out)
    assert bench["unsupported"] == left_out
    assert [(f.id, f.title) for f in findings] == [
        ("bench.I006", "Not measured: reduce_scatter (this torch's gloo cannot run it)")]


def test_a_failure_after_an_op_already_ran_stops_the_sweep():
    class FailsLater(Gloo21):
        def broadcast(self, tensor, src, group=None):
            if tensor.numel() > 1024 // 4:
                raise RuntimeError("ProcessGroupGloo does not support broadcast of this size")  # mid-op: out of step
            super().broadcast(tensor, src, group)

    rows, stopped, left_out = run_sweep(comm(FailsLater()), plan())
    assert stopped.startswith("broadcast at 4K failed") and "broadcast" in {r["op"] for r in rows}
    assert "all_to_all" not in {r["op"] for r in rows}
