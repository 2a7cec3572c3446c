"""The collective sweep: each op at each size, warm-up, timed iterations, and a check of the result."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Callable

from distdoctor.bench.comm import Comm
from distdoctor.bench.sizes import ELEMENT_BYTES, element_count, human_bytes

# Each size's timed loop is cut to about this long (at least one iteration): the largest
# sizes of a slow world would otherwise take minutes at the default iteration count.
SIZE_BUDGET_S = 0.5
# Every "stopped" reason that is the deadline (not a failure) starts so: the report is then partial.
DEADLINE_STOP = "the run's deadline came before"


@dataclass(frozen=True)
class SweepPlan:
    ops: tuple[str, ...]
    sizes: tuple[int, ...]
    iters: int
    warmup: int
    deadline: float  # on this rank's monotonic clock: past it, every rank stops together


# A backend that cannot run an op at all says so before anything is sent, in the same words on
# every rank of one torch (torch 2.1's gloo: "no support for _allgather_base in Gloo process
# group", "Backend gloo does not support _reduce_scatter_base", "ProcessGroupGloo does not support
# reduce_scatter"): the group is still in step, so the op is left out and the sweep goes on.
_UNSUPPORTED = re.compile(r"no support for|does not support", re.I)


def unsupported(exc: BaseException) -> bool:
    return isinstance(exc, (RuntimeError, NotImplementedError)) and bool(_UNSUPPORTED.search(str(exc)))


def _call(comm: Comm, op: str) -> Callable[[Any, Any], None]:
    """The torch call for ``op`` on (input, output) buffers."""
    dist, group = comm.dist, comm.group
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    calls = {
        "all_reduce": lambda i, o: dist.all_reduce(i, group=group),
        "all_gather": _gather(comm),
        "reduce_scatter": lambda i, o: scatter(o, i, group=group),
        "broadcast": lambda i, o: dist.broadcast(i, 0, group=group),
        "all_to_all": lambda i, o: dist.all_to_all_single(o, i, group=group),
    }
    return calls[op]


def _gather(comm: Comm) -> Callable[[Any, Any], None]:
    """all_gather into one tensor; where this torch's backend has no such form (torch 2.1's gloo),
    the list form into views of the same tensor: the same bytes move, so the figures compare."""
    dist, group = comm.dist, comm.group
    tensor_form = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)
    use_list = [tensor_form is None]

    def call(inp: Any, out: Any) -> None:
        if not use_list[0]:
            try:
                tensor_form(out, inp, group=group)
                return
            except Exception as exc:
                if not unsupported(exc):
                    raise
                use_list[0] = True
        dist.all_gather(list(out.chunk(comm.size)), inp, group=group)

    return call


def _buffers(comm: Comm, op: str, count: int) -> tuple[Any, Any]:
    """(input, output) of ``count`` elements for the op's larger buffer, zero-filled: sums of
    zeros stay zero however many iterations run."""
    chunk = count // comm.size
    inp_count = chunk if op == "all_gather" else count
    out_count = chunk if op == "reduce_scatter" else count
    inp = comm.full(inp_count, 0.0)
    out = inp if op in ("all_reduce", "broadcast") else comm.full(out_count, 0.0)
    return inp, out


def verify(comm: Comm, op: str, count: int, call: Callable[[Any, Any], None]) -> bool:
    """One run with rank-dependent input whose exact result is known (small integers in
    float32 are exact, so equality is the test)."""
    torch, n, rank = comm.torch, comm.size, comm.rank
    inp, out = _buffers(comm, op, count)
    chunk = count // n
    if op == "all_to_all":
        inp.copy_(torch.arange(n, device=comm.device, dtype=torch.float32).repeat_interleave(chunk) + rank * n + 1)
        expected = torch.arange(n, device=comm.device, dtype=torch.float32).repeat_interleave(chunk) * n + rank + 1
    else:
        inp.fill_(rank + 1)
        total = n * (n + 1) / 2
        expected = {
            "all_reduce": comm.full(count, total),
            "reduce_scatter": comm.full(chunk, total),
            "broadcast": comm.full(count, 1.0),
            "all_gather": torch.arange(1, n + 1, device=comm.device, dtype=torch.float32).repeat_interleave(chunk),
        }[op]
    call(inp, out)
    comm.sync()
    return bool(torch.equal(out, expected))


def measure(comm: Comm, op: str, size: int, plan: SweepPlan, clock: Callable[[], float] = time.monotonic) -> dict[str, Any] | None:
    """This rank's figures for one op at one size; None when the ranks agreed to stop (deadline)."""
    count = element_count(op, size, comm.size)
    call = _call(comm, op)
    inp, out = _buffers(comm, op, count)
    timer = comm.timer()
    timer.start()
    for _ in range(max(plan.warmup, 1)):
        call(inp, out)
    warm = timer.stop() / max(plan.warmup, 1)
    # One agreement per size: the slowest rank's warm-up time sets the iteration count, and
    # any rank past the deadline stops everyone (a rank leaving alone would hang the others).
    slowest, stop = comm.agree_max([warm, 1.0 if clock() > plan.deadline else 0.0])
    if stop:
        return None
    iters = max(1, min(plan.iters, int(SIZE_BUDGET_S / max(slowest, 1e-9))))
    timer.start()
    for _ in range(iters):
        call(inp, out)
    elapsed = timer.stop()
    correct = verify(comm, op, count, call)
    return {"op": op, "bytes": count * ELEMENT_BYTES, "size": human_bytes(count * ELEMENT_BYTES), "count": count,
            "iters": iters, "time_s": elapsed / iters, "correct": correct}


def run_sweep(comm: Comm, plan: SweepPlan, progress: Callable[[str], None] = lambda _: None
              ) -> tuple[list[dict[str, Any]], str | None, dict[str, str]]:
    """Every op at every size, in the same order on every rank. Returns this rank's rows, when
    the sweep stopped early, why (every later figure is missing), and the ops this torch's
    backend cannot run at all (left out, with its words)."""
    rows: list[dict[str, Any]] = []
    left_out: dict[str, str] = {}
    for op in plan.ops:
        for size in plan.sizes:
            progress(f"{op} {human_bytes(size)}")
            try:
                row = measure(comm, op, size, plan)
            except Exception as exc:
                message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                if unsupported(exc) and not any(r["op"] == op for r in rows):
                    left_out[op] = message  # refused at its first call, before any byte moved
                    break
                # The group is out of step now: nothing later can run.
                return rows, f"{op} at {human_bytes(size)} failed: {message}", left_out
            if row is None:
                return rows, f"{DEADLINE_STOP} {op} at {human_bytes(size)}", left_out
            rows.append(row)
    return rows, None, left_out
