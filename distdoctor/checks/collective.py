"""Collective stage: a real process group with a short timeout, and collectives verified for content.

Every accepted rank runs these checks in the same order (registration order), over the world's
gloo group (and an nccl group when rank 0 found that every rank has a GPU and nccl). Each
collective moves known values and every rank verifies what it received, so a transport that
"completes" with wrong data is caught, not just one that hangs. Each operation waits with its
own deadline (``Work.wait(timeout)``); an operation that did not complete leaves the group out of
step, so the later checks on it are skipped with that reason rather than paired up wrongly.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import timedelta
from statistics import median
from typing import Any, Callable

from distdoctor.core.context import CheckContext
from distdoctor.core.findings import Finding
from distdoctor.core.registry import SkipCheck, check, finding_kind
from distdoctor.core.report import format_ranks

PG_TIMED_OUT = finding_kind(
    "coll.C001",
    cause="collective_timeout_hang",
    title="The process group could not be created before its deadline",
    hint="A rank could not connect to the others' backend sockets: check *_SOCKET_IFNAME, firewalls between nodes",
)
PG_FAILED = finding_kind(
    "coll.C002",
    cause="unknown",
    title="The process group could not be created",
    hint="Read the backend's error in the detail; run with NCCL_DEBUG=INFO / TORCH_DISTRIBUTED_DEBUG=DETAIL",
)
OP_TIMED_OUT = finding_kind(
    "coll.E003",
    cause="collective_timeout_hang",
    title="A collective did not complete within its deadline",
    hint="Some rank did not join it: look for the ranks named in the report's incomplete or missing lists",
)
OP_FAILED = finding_kind(
    "coll.E004",
    cause="unknown",
    title="A collective failed with an error",
    hint="Read the backend's error in the detail; run with NCCL_DEBUG=INFO / TORCH_DISTRIBUTED_DEBUG=DETAIL",
)
WRONG_VALUES = finding_kind(
    "coll.E005",
    cause="unknown",
    title="A collective completed but delivered wrong values",
    hint="The transport corrupts data: try NCCL_P2P_DISABLE=1 / NCCL_SHM_DISABLE=1 to isolate the path, check driver and firmware",
)
BARRIER_LATE = finding_kind(
    "coll.E006",
    cause="collective_timeout_hang",
    title="Ranks did not reach the monitored barrier in time",
    hint="The named ranks are stuck or far behind: look at what they do before their first collective",
)
PG_NO_INTERFACE = finding_kind(
    "coll.C008",
    cause="wrong_interface",
    title="The process group could not be created: the backend found no address for its interface",
    hint="Set GLOO_SOCKET_IFNAME (NCCL_SOCKET_IFNAME for nccl) to an interface this host has, with an address",
)
BARRIER_STRAGGLER = finding_kind(
    "coll.W007",
    cause="straggler_rank",
    title="A rank reached the barrier far later than the others",
    hint="Find what delays that rank (a slower node, CPU contention, data loading); the others wait for it every step",
)

# A rank this many seconds behind the median at the barrier is a straggler: in this stage every
# rank does identical, tiny work, so a healthy world is in step within milliseconds.
BARRIER_STRAGGLER_S = 2.0
# Share of the per-check deadline an operation may wait, so it reports before the runner gives up.
OP_SHARE = 0.8
_TIMEOUT_WORDS = re.compile(r"tim(ed|e)[ -]?out|deadline|Timeout", re.IGNORECASE)
# torch's texts: "Ranks 1, 2 failed to pass monitoredBarrier in 2000 ms" (wait_all_ranks) and
# "Rank 1 timed out in monitoredBarrier after 2000 ms".
# gloo's text when *_SOCKET_IFNAME (or the address it derives) names no interface here:
# "[enforce fail at .../gloo/transport/tcp/device.cc:84] ifa != nullptr. Unable to find address for: eth0"
_NO_ADDRESS_FOR = re.compile(r"Unable to find address for:?\s*(\S+)")
_MONITORED_RANKS = re.compile(r"Ranks? ([\d,\s]+?) (?:failed to pass|timed out in) monitoredBarrier")


@dataclass
class Ops:
    """What a collective check needs: the dist module, a group and where its tensors live.

    Real checks build it from the world; tests build it with a fake ``dist`` and a CPU device
    (which is how the nccl path is covered on machines without a GPU).
    """

    dist: Any
    torch: Any
    group: Any
    rank: int
    size: int
    device: Any
    timeout_s: float
    backend: str = "gloo"

    def wait(self, work: Any) -> None:
        if work is None:
            return
        # gloo honours the per-wait timeout; nccl waits under the group's own timeout.
        if self.backend == "gloo":
            work.wait(timeout=timedelta(seconds=self.timeout_s))
        else:
            work.wait()
        if self.device is not None and getattr(self.device, "type", "cpu") == "cuda":
            self.torch.cuda.synchronize(self.device)

    def tensor(self, values: Any) -> Any:
        return self.torch.tensor(values, dtype=self.torch.float32, device=self.device)


# -- the operations, each returning a problem description or None ------------------------------
def op_broadcast(ops: Ops) -> str | None:
    expected = [3.0 * i + 1.0 for i in range(16)]
    t = ops.tensor(expected if ops.rank == 0 else [0.0] * 16)
    ops.wait(ops.dist.broadcast(t, src=0, group=ops.group, async_op=True))
    got = t.cpu().tolist()
    return None if got == expected else f"received {_short(got)}, expected {_short(expected)} from rank 0"


def op_all_reduce(ops: Ops) -> str | None:
    t = ops.tensor([float(ops.rank + 1)] * 16)
    ops.wait(ops.dist.all_reduce(t, group=ops.group, async_op=True))
    want = ops.size * (ops.size + 1) / 2.0
    got = t.cpu().tolist()
    return None if all(v == want for v in got) else f"sum of (rank+1) is {_short(got)}, expected {want:g} everywhere"


def op_all_gather(ops: Ops) -> str | None:
    mine = ops.tensor([float(ops.rank)] * 4)
    out = [ops.tensor([-1.0] * 4) for _ in range(ops.size)]
    ops.wait(ops.dist.all_gather(out, mine, group=ops.group, async_op=True))
    wrong = [i for i, t in enumerate(out) if t.cpu().tolist() != [float(i)] * 4]
    return None if not wrong else f"the slots of ranks {format_ranks(wrong)} hold wrong values"


def op_ring(ops: Ops) -> str | None:
    if ops.size < 2:
        return None
    right, left = (ops.rank + 1) % ops.size, (ops.rank - 1) % ops.size
    send = ops.tensor([100.0 + ops.rank] * 8)
    recv = ops.tensor([-1.0] * 8)
    works = [
        ops.dist.isend(send, dst=_global(ops, right), group=ops.group),
        ops.dist.irecv(recv, src=_global(ops, left), group=ops.group),
    ]
    for work in works:
        ops.wait(work)
    got = recv.cpu().tolist()
    want = [100.0 + left] * 8
    return None if got == want else f"from rank {left} received {_short(got)}, expected {_short(want)}"


def op_broadcast_object(ops: Ops) -> str | None:
    expected = {"from": 0, "world_size": ops.size, "values": list(range(8)), "text": "distdoctor"}
    box = [expected if ops.rank == 0 else None]
    ops.dist.broadcast_object_list(box, src=0, group=ops.group, device=ops.device)
    return None if box[0] == expected else f"received {box[0]!r}, expected {expected!r}"


def _global(ops: Ops, group_rank: int) -> int:
    # The groups used here span the whole world in rank order, so group rank == global rank.
    return group_rank


def _short(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values[:6]) + (", ...]" if len(values) > 6 else "]")


def run_op(ops: Ops, name: str, op: Callable[[Ops], str | None], poison: Callable[[str], None]) -> list[Finding]:
    """Run one verified collective; time it; turn what went wrong into a finding."""
    start = time.monotonic()
    try:
        problem = op(ops)
    except Exception as exc:
        elapsed = time.monotonic() - start
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        timed_out = bool(_TIMEOUT_WORDS.search(message)) or elapsed >= ops.timeout_s * 0.95
        poison(f"{ops.backend} {name}")
        kind = OP_TIMED_OUT if timed_out else OP_FAILED
        extra: dict[str, Any] = {}
        if "numpy is not available" in message.lower():
            # torch's bridge to NumPy is broken (backend.E008 names the versions), not the backend.
            extra["remediation"] = ("torch cannot use the installed NumPy (see backend.E008): pip install 'numpy<2' "
                                    "in the job's environment, or a torch release built for NumPy 2")
        return [
            kind(
                f"{ops.backend} {name} " + (f"did not complete within {ops.timeout_s:g}s" if timed_out else f"failed: {message}"),
                detail=f"{type(exc).__name__}: {message}",
                data={"op": name, "backend": ops.backend, "elapsed_s": round(elapsed, 4), "world_size": ops.size},
                **extra,
            )
        ]
    if problem:
        return [
            WRONG_VALUES(
                f"{ops.backend} {name} delivered wrong values on rank {ops.rank}",
                detail=problem,
                data={"op": name, "backend": ops.backend, "elapsed_s": round(time.monotonic() - start, 4)},
            )
        ]
    return []


# -- building Ops from the live world ---------------------------------------------------------
def op_timeout(ctx: CheckContext) -> float:
    return max(OP_SHARE * ctx.config.check_timeout, 0.5)


def _world(ctx: CheckContext) -> Any:
    world = ctx.world
    if world is None or not hasattr(world, "process_group"):
        raise SkipCheck("no cross-rank world")
    poisoned = getattr(world, "poisoned", None)
    if poisoned and str(poisoned).endswith("process group"):
        raise SkipCheck(f"skipped: the {poisoned} could not be created")
    if poisoned:
        raise SkipCheck(f"skipped: an earlier collective ({poisoned}) did not complete; the group is out of step")
    return world


def _poisoner(world: Any) -> Callable[[str], None]:
    def poison(what: str) -> None:
        if not world.poisoned:
            world.poisoned = what

    return poison


def gloo_ops(ctx: CheckContext) -> Ops:
    world = _world(ctx)
    group = world.process_groups.get("gloo")
    if group is None:
        raise SkipCheck("skipped: the gloo process group could not be created")
    import torch  # torch is imported on first use: it costs seconds, and `import distdoctor` must stay cheap
    import torch.distributed as dist  # torch is imported on first use: it costs seconds, and `import distdoctor` must stay cheap

    return Ops(dist, torch, group, world.rank, world.size, torch.device("cpu"), op_timeout(ctx), "gloo")


@check(stage="collective", tags=("collective", "gloo"), emits=(PG_TIMED_OUT, PG_FAILED, PG_NO_INTERFACE))
def process_group(ctx: CheckContext):
    """A gloo process group over the world's store forms within a short timeout."""
    world = _world(ctx)
    start = time.monotonic()
    try:
        world.process_group("gloo", op_timeout(ctx))
    except Exception as exc:
        _poisoner(world)("gloo process group")
        elsewhere = _failed_elsewhere(exc)
        if elsewhere:
            raise SkipCheck(elsewhere) from None
        yield pg_failure(exc, "gloo", time.monotonic() - start, op_timeout(ctx), ctx)


def _failed_elsewhere(exc: BaseException) -> str | None:
    """The skip reason when another rank's group creation failed (it reports its own finding)."""
    failures = getattr(exc, "failures", None)
    if not isinstance(failures, dict) or not failures:
        return None
    ranks = sorted(failures)
    first = str(failures[ranks[0]]).strip()
    return (f"skipped: rank{'s' if len(ranks) > 1 else ''} {format_ranks(ranks)} could not create the "
            f"{getattr(exc, 'backend', '')} process group, so it cannot form (rank {ranks[0]}: {first[:300]})")


def _interface_suggestion(ctx: CheckContext | None, backend: str, missing: str) -> str:
    variable = "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"
    nics = ctx.probes.interfaces() if ctx is not None else None
    usable = []
    if isinstance(nics, dict):
        usable = [n for n in nics.values() if n.up and n.ipv4 and not n.is_loopback]
    if usable:
        names = ", ".join(f"{n.name} ({n.ipv4[0]})" for n in usable)
        return (f"Set {variable} to an interface this host has, with an address: {names} "
                f"(e.g. export {variable}={usable[0].name} on this host); it names {missing}, which has none here")
    return f"Set {variable} to an interface this host has, with an address (see `ip -br addr`); {missing} has none here"


def pg_failure(exc: BaseException, backend: str, elapsed: float, timeout: float, ctx: CheckContext | None = None) -> Finding:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    no_address = _NO_ADDRESS_FOR.search(message)
    if no_address:
        missing = no_address.group(1)
        variable = "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"
        set_to = ctx.env.get(variable) if ctx is not None else None
        return PG_NO_INTERFACE(
            f"The {backend} process group failed: no address for interface {missing} on this host",
            detail=f"{type(exc).__name__}: {message}. "
            + (f"{variable}={set_to!r} here; " if set_to is not None else "")
            + f"{backend} looks up the address of every interface it is told to use and stops when one has none.",
            remediation=_interface_suggestion(ctx, backend, missing),
            data={"backend": backend, "interface": missing, "variable": variable, "elapsed_s": round(elapsed, 4)},
        )
    timed_out = bool(_TIMEOUT_WORDS.search(message)) or elapsed >= timeout * 0.95
    kind = PG_TIMED_OUT if timed_out else PG_FAILED
    # Which ranks got how far (world.store_exchange marks entering and forming the group), and why
    # the deadline was what it was: a slow stage says what was slow.
    progress = getattr(exc, "distdoctor_progress", "")
    note = getattr(getattr(ctx, "world", None), "deadline_note", "") if ctx is not None else ""
    return kind(
        f"The {backend} process group " + ("was not formed within " + f"{timeout:g}s" if timed_out else f"failed: {message}"),
        detail=f"{type(exc).__name__}: {message}" + (f"\nWhen it gave up: {progress}." if progress else "")
        + (f"\nThe deadline: {note}." if note and timed_out else ""),
        data={"backend": backend, "elapsed_s": round(elapsed, 4), **({"progress": progress} if progress else {})},
    )


@check(stage="collective", tags=("collective", "gloo"), emits=(BARRIER_LATE, BARRIER_STRAGGLER, OP_FAILED))
def monitored_barrier(ctx: CheckContext):
    """Every rank reaches a monitored barrier; rank 0 names the late ones; no rank is far behind."""
    ops = gloo_ops(ctx)
    yield from barrier_findings(ops, _poisoner(ctx.world))


def barrier_findings(ops: Ops, poison: Callable[[str], None]) -> list[Finding]:
    start = time.monotonic()
    try:
        ops.dist.monitored_barrier(group=ops.group, timeout=timedelta(seconds=ops.timeout_s), wait_all_ranks=True)
    except Exception as exc:
        poison("monitored_barrier")
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        match = _MONITORED_RANKS.search(str(exc))
        late = sorted({int(x) for x in re.findall(r"\d+", match.group(1))}) if match else []
        if ops.rank == 0 and late:
            return [BARRIER_LATE(
                f"Ranks {format_ranks(late)} did not reach the monitored barrier within {ops.timeout_s:g}s",
                detail=message,
                ranks=late,
                data={"late": late, "timeout_s": ops.timeout_s},
            )]
        if _TIMEOUT_WORDS.search(message):
            return [OP_TIMED_OUT(
                f"gloo monitored_barrier did not complete within {ops.timeout_s:g}s",
                detail=f"{type(exc).__name__}: {message}",
                data={"op": "monitored_barrier", "backend": ops.backend},
            )]
        return [OP_FAILED(f"gloo monitored_barrier failed: {message}", detail=f"{type(exc).__name__}: {message}",
                          data={"op": "monitored_barrier", "backend": ops.backend})]
    waited = time.monotonic() - start
    # Who was late: every rank waited for the last arrival, so the rank that waited least came
    # last. The waits are exchanged with one more (verified-shape) collective.
    waits = ops.tensor([0.0] * ops.size)
    waits[ops.rank] = waited
    try:
        ops.wait(ops.dist.all_reduce(waits, group=ops.group, async_op=True))
    except Exception:
        poison("monitored_barrier (timing exchange)")
        return []
    return straggler_findings(waits.cpu().tolist(), ops.rank)


def straggler_findings(waits: list[float], rank: int, limit_s: float = BARRIER_STRAGGLER_S) -> list[Finding]:
    """From every rank's wait at the barrier, the ranks far behind the median (reported by rank 0)."""
    if rank != 0 or len(waits) < 2:
        return []
    middle = median(waits)
    late = {r: middle - w for r, w in enumerate(waits) if middle - w > limit_s}
    if not late:
        return []
    ranks = sorted(late)
    return [BARRIER_STRAGGLER(
        f"Ranks {format_ranks(ranks)} reached the barrier {max(late.values()):.1f}s after most ranks",
        detail="; ".join(f"rank {r}: +{s:.1f}s" for r, s in sorted(late.items()))
        + f" (a straggler is more than {limit_s:g}s behind the median).",
        ranks=ranks,
        data={"late_s": {str(r): round(s, 3) for r, s in late.items()}, "waits_s": [round(w, 4) for w in waits]},
    )]


def _gloo_op_check(name: str, op: Callable[[Ops], str | None], doc: str) -> Callable[[CheckContext], Any]:
    def run(ctx: CheckContext):
        ops = gloo_ops(ctx)
        return run_op(ops, name, op, _poisoner(ctx.world))

    run.__name__ = run.__qualname__ = name
    run.__doc__ = doc
    run.__module__ = __name__
    return check(stage="collective", tags=("collective", "gloo"), emits=(OP_TIMED_OUT, OP_FAILED, WRONG_VALUES))(run)


broadcast = _gloo_op_check("broadcast", op_broadcast, "broadcast of a known tensor from rank 0 arrives intact on every rank.")
all_reduce = _gloo_op_check("all_reduce", op_all_reduce, "all_reduce (sum) of known tensors gives the right sum on every rank.")
all_gather = _gloo_op_check("all_gather", op_all_gather, "all_gather puts every rank's tensor in its slot on every rank.")
send_recv_ring = _gloo_op_check("send_recv_ring", op_ring, "isend/irecv around the ring with wait(): each rank gets its left neighbour's tensor.")
broadcast_object_list = _gloo_op_check(
    "broadcast_object_list", op_broadcast_object, "broadcast_object_list of a small object arrives equal on every rank."
)

NCCL_SUITE: tuple[tuple[str, Callable[[Ops], str | None]], ...] = (
    ("broadcast", op_broadcast),
    ("all_reduce", op_all_reduce),
    ("all_gather", op_all_gather),
    ("send_recv_ring", op_ring),
)


def nccl_wanted(world: Any) -> str | None:
    """None when every rank has a GPU and nccl (rank 0 decided it for all), else why not."""
    decision = getattr(world, "decision", None) or {}
    if not decision.get("nccl"):
        return decision.get("nccl_reason") or "skipped: not every rank has a GPU and nccl"
    return None


def run_suite(ops: Ops, poison: Callable[[str], None]) -> list[Finding]:
    findings: list[Finding] = []
    for name, op in NCCL_SUITE:
        findings += run_op(ops, name, op, poison)
        if findings and any(f.id in (OP_TIMED_OUT.id, OP_FAILED.id) for f in findings):
            break  # the group is out of step; the rest would pair up wrongly
    return findings


@check(stage="collective", tags=("collective", "nccl", "gpu"),
       emits=(PG_TIMED_OUT, PG_FAILED, PG_NO_INTERFACE, OP_TIMED_OUT, OP_FAILED, WRONG_VALUES))
def nccl_collectives(ctx: CheckContext):
    """With GPUs on every rank: an nccl group forms and broadcast/all_reduce/all_gather/ring are right."""
    world = _world(ctx)
    reason = nccl_wanted(world)
    if reason:
        raise SkipCheck(reason)
    import torch  # torch is imported on first use: it costs seconds, and `import distdoctor` must stay cheap
    import torch.distributed as dist  # torch is imported on first use: it costs seconds, and `import distdoctor` must stay cheap

    device_index = (world.decision.get("devices") or {}).get(str(world.rank), 0)
    device = torch.device("cuda", int(device_index))
    torch.cuda.set_device(device)
    start = time.monotonic()
    try:
        group = world.process_group("nccl", op_timeout(ctx))
    except Exception as exc:
        _poisoner(world)("nccl process group")
        elsewhere = _failed_elsewhere(exc)
        if elsewhere:
            raise SkipCheck(elsewhere) from None
        return [pg_failure(exc, "nccl", time.monotonic() - start, op_timeout(ctx), ctx)]
    ops = Ops(dist, torch, group, world.rank, world.size, device, op_timeout(ctx), "nccl")
    return run_suite(ops, _poisoner(world))
