"""The guarded call: record it, verify its fingerprint across the group, run it, track its Work."""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from typing import Any, Callable

from distdoctor.embedded.guard.ops import describe
from distdoctor.embedded.guard.record import CallRecord, tensor_facts, where_of
from distdoctor.embedded.guard.records_io import record_from_bytes, record_to_bytes

# How deep this thread is in guarded calls: torch's object collectives call broadcast/all_gather
# themselves, the guard's own exchange too; inner calls pass through unrecorded.
DEPTH = threading.local()
# The slow-rank accounting's regions (embedded.guard.pace.regions.Regions) while it is on: a
# synchronous call's wait for its peers is measured around torch's function.
REGIONS: list[Any] = [None]


class _Inside:
    def __enter__(self) -> None:
        DEPTH.depth = getattr(DEPTH, "depth", 0) + 1

    def __exit__(self, *exc: Any) -> None:
        DEPTH.depth -= 1


def wrap(name: str, original: Callable[..., Any], guard: Any) -> Callable[..., Any]:
    try:
        names = [p for p in inspect.signature(original).parameters]
    except (TypeError, ValueError):
        names = []
    takes_async = "async_op" in names
    call = guard.call

    # The per-call hot path, run with the CPU's caches cold from the step around it: every step
    # here costs microseconds, so the depth check is inlined and the caller's frame is taken here
    # (one frame to materialise instead of a walk through the guard's own).
    @functools.wraps(original)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if getattr(DEPTH, "depth", 0):
            return original(*args, **kwargs)
        bound = dict(zip(names, args))
        if kwargs:
            bound.update(kwargs)
        return call(name, original, args, kwargs, bound, takes_async, sys._getframe(1))

    guarded.__distdoctor_original__ = original  # type: ignore[attr-defined]
    return guarded


def run_call(original: Callable[..., Any], args: tuple, kwargs: dict, bound: dict, record: CallRecord,
             takes_async: bool) -> tuple[Any, Any]:
    """Run torch's function: (what it returned, the Work whose completion ends the call, if any)."""
    # Inlined rather than `with _Inside()`: this is the per-call hot path.
    DEPTH.depth = getattr(DEPTH, "depth", 0) + 1
    regions = REGIONS[0]
    if regions is not None and regions.ident != threading.get_ident():
        regions = None  # the accounting follows the main thread only
    token = regions.enter() if regions is not None else None
    try:
        if takes_async and bound.get("async_op"):
            result = original(*args, **kwargs)
            return result, result
        if takes_async and "cuda" in record.devices and "async_op" not in bound:
            # NCCL: a sync call returns once enqueued on the stream; it is complete only when its
            # Work says so, so the guard asks for the Work and waits on it as torch would.
            work = original(*args, **kwargs, async_op=True)
            if work is not None:
                work.wait()
            return None, work
        return original(*args, **kwargs), None
    finally:
        DEPTH.depth -= 1
        if regions is not None:
            regions.leave_call(token, record, bool(takes_async and bound.get("async_op")))


class Verifier:
    """Compares one call's fingerprint across its group with the guard's own all_gather.

    Every rank decides to verify from the group's sequence number alone, so all ranks of a
    healthy job verify the same calls without talking first.
    """

    def __init__(self, torch: Any, dist: Any, all_gather: Callable[..., Any]) -> None:
        self.torch, self.dist, self.all_gather = torch, dist, all_gather
        self.devices: dict[str, Any] = {}

    def device(self, group: Any, name: str) -> Any:
        device = self.devices.get(name)
        if device is None:
            backend = str(self.dist.get_backend(group)).lower()
            parts = [p.split(":")[-1].strip() for p in backend.split(",")]
            if "nccl" in parts and not any(p in ("gloo", "mpi", "ucc") for p in parts):
                device = self.torch.device("cuda", self.torch.cuda.current_device())
            else:
                device = self.torch.device("cpu")
            self.devices[name] = device
        return device

    def rows(self, values: list[int], group: Any, name: str, width: int) -> list[list[int]]:
        torch = self.torch
        mine = torch.tensor(values, dtype=torch.int64, device=self.device(group, name))
        out = [torch.zeros_like(mine) for _ in range(width)]
        with _Inside():
            self.all_gather(out, mine, group=group)
        return [t.cpu().tolist() for t in out]

    def agree(self, record: CallRecord, group: Any, width: int, proposal: int = 1) -> tuple[bool, list[int]]:
        """(every rank's fingerprint equals this rank's, every rank's proposed gap); the call site
        and the proposal may differ."""
        rows = self.rows(record.words(proposal), group, record.group, width)
        return all(row[:-2] == rows[0][:-2] for row in rows), [int(row[-1]) for row in rows]

    def details(self, record: CallRecord, recent: list[str], group: Any, width: int) -> list[tuple[CallRecord, list[str]]]:
        """Every rank's call and recent call sites (two all_gathers: sizes, then padded JSON bytes)."""
        torch = self.torch
        data = record_to_bytes(record, recent)
        sizes = [row[0] for row in self.rows([len(data)], group, record.group, width)]
        padded = torch.zeros(max(sizes), dtype=torch.uint8, device=self.device(group, record.group))
        padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        out = [torch.zeros_like(padded) for _ in range(width)]
        with _Inside():
            self.all_gather(out, padded, group=group)
        return [record_from_bytes(bytes(t[:n].cpu().tolist())) for t, n in zip(out, sizes)]


def peer_rank(dist: Any, group: Any, args: dict[str, Any], key: str) -> Any:
    """src=/dst= are global ranks, group_src=/group_dst= group ranks: one global rank either way."""
    value = args.get(key)
    if value is None and args.get(f"group_{key}") is not None:
        try:
            return int(dist.get_global_rank(group or dist.group.WORLD, int(args[f"group_{key}"])))
        except Exception:
            return f"group rank {args[f'group_{key}']}"
    return int(value) if isinstance(value, int) or hasattr(value, "__index__") else ("any" if value is None else str(value))


def make_record(name: str, bound: dict[str, Any], group_name: str, peer: Callable[[dict, str], Any],
                frame: Any = None) -> CallRecord:
    """The record of one call; ``peer``: its group's src/dst resolver (peer_rank bound to the group);
    ``frame``: its caller's (else found from here)."""
    shaped, typed, params = describe(name, bound, peer)
    if shaped is typed and len(typed) == 1:  # the usual call, one tensor: its facts once, no loops
        facts = tensor_facts(typed[0])
        shapes, dtypes, devices = ((facts[0],), (facts[1],), (facts[2],)) if facts else ((), (), ())
    else:
        typed_info = [t for t in map(tensor_facts, typed) if t]
        shapes = tuple(t[0] for t in (typed_info if shaped is typed else map(tensor_facts, shaped)) if t)
        dtypes, devices = tuple(t[1] for t in typed_info), tuple(t[2] for t in typed_info)
    # Without the caller's frame, start from this function's caller's caller (as call_site(2)).
    where = where_of(frame if frame is not None else sys._getframe(2))
    return CallRecord(name, group_name, -1, shapes, dtypes, devices, params, where=where)
