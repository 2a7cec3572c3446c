"""A bounded check-in before torch's init_process_group, naming what keeps the group from forming.

torch's env:// and tcp:// rendezvous create a TCPStore (rank 0 hosts it on MASTER_PORT, the
others connect) and rank 0 then waits for every worker: a rank that never comes shows up,
after ``timeout`` (10-30 min by default), as "Timed out ... waiting for clients. 1/2 clients
joined" at rank 0 and as a socket timeout elsewhere, without saying which rank is missing.

Before torch's call, every rank here opens the same store with a short deadline and checks in
under ``distdoctor/init/<attempt>/``:
- ``claim/<rank>``: a counter; 2 or more means two processes claim one rank;
- ``rank/<rank>``:  host, pid and the world size this process was given;
- ``decision``:     rank 0's verdict, set once with compare_set, so every rank acts on one
                    decision (a rank that gives up first sets an abort verdict the same way).
Rank 0 waits with a deadline, lists the ranks that are absent and publishes the verdict. The
store is opened with ``multi_tenant=True``, as torch opens it, so torch's own TCPStore in the
same process reuses the listening server: on success torch's call then runs with the user's
arguments unchanged and finds every rank already there. Under torchrun
(TORCHELASTIC_USE_AGENT_STORE=True) the agent hosts the store and every rank is a client.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Mapping
from urllib.parse import parse_qs, urlparse

from distdoctor.core.findings import Finding
from distdoctor.core.registry import finding_kind
from distdoctor.core.report import format_ranks

CHECK = "init_process_group"
POLL_FIRST_S, POLL_MAX_S = 0.005, 0.1

INIT_RANKS_MISSING = finding_kind(
    "init.E001",
    cause="rank_missing",
    title="Some ranks never checked in to the rendezvous",
    hint="Start the missing ranks (check the launcher's logs for a crash) or fix WORLD_SIZE if fewer are meant to run",
)
INIT_MASTER_UNREACHABLE = finding_kind(
    "init.E002",
    cause="master_unreachable",
    title="The rendezvous store at MASTER_ADDR:MASTER_PORT cannot be reached",
    hint="Start rank 0 (it hosts the store) and check MASTER_ADDR/MASTER_PORT point at it",
)
INIT_PORT_IN_USE = finding_kind(
    "init.E003",
    cause="port_in_use",
    title="Rank 0 cannot listen on MASTER_PORT: the port is taken",
    hint="Pick a free MASTER_PORT (or stop the process holding it, e.g. a previous run's rank 0)",
)
INIT_DUPLICATE_RANK = finding_kind(
    "init.E004",
    cause="rank_config_error",
    title="Two processes claim the same rank",
    hint="Give every process its own RANK (torchrun sets it; with srun use SLURM_PROCID)",
)
INIT_WORLD_DISAGREES = finding_kind(
    "init.E005",
    cause="rank_config_error",
    title="Ranks disagree about the world size",
    hint="Launch every node with the same WORLD_SIZE (torchrun --nnodes/--nproc-per-node identical everywhere)",
)
INIT_TORCH_FAILED = finding_kind(
    "init.E006",
    cause="unknown",
    title="torch's init_process_group failed after every rank had checked in",
    hint="Read torch's error in the detail; with a timeout, look at *_SOCKET_IFNAME and the network between hosts",
)
INIT_MASTER_UNRESOLVABLE = finding_kind(
    "init.E007",
    cause="hostname_unresolvable",
    title="MASTER_ADDR does not resolve",
    hint="Set MASTER_ADDR to rank 0's resolvable host name or IP address",
)
INIT_MASTER_FILTERED = finding_kind(
    "init.E008",
    cause="firewall",
    title="Connections to MASTER_ADDR:MASTER_PORT time out (dropped or filtered)",
    hint="Open MASTER_PORT between the nodes (firewall, security group) or use an address on a reachable network",
)


class CheckInFailed(Exception):
    """The group cannot form; ``findings`` say why (the caller raises PreflightError)."""

    def __init__(self, findings: list[Finding]) -> None:
        super().__init__("; ".join(f.title for f in findings))
        self.findings = findings


@dataclass(frozen=True)
class Target:
    """Where and as whom this process joins: what torch's rendezvous handler would use."""

    host: str
    port: int
    rank: int
    world_size: int
    agent_store: bool  # torchrun's agent hosts the store: every rank is a client
    use_libuv: bool = True


_ATTEMPTS: dict[tuple[str, int], int] = {}


def resolve_target(init_method: str | None, rank: int, world_size: int, env: Mapping[str, str]) -> Target | None:
    """The store address and identity for env:// and tcp://; None for other init methods."""
    url = init_method or "env://"
    parsed = urlparse(url)
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    use_libuv = query.get("use_libuv", env.get("USE_LIBUV", "1")) != "0"
    try:
        if parsed.scheme == "env":
            host = env["MASTER_ADDR"]
            port = int(env["MASTER_PORT"])
        elif parsed.scheme == "tcp":
            if parsed.hostname is None or parsed.port is None:
                return None
            host, port = parsed.hostname, parsed.port
        else:
            return None
        rank = int(query["rank"]) if "rank" in query else (rank if rank >= 0 else int(env["RANK"]))
        world_size = int(query["world_size"]) if "world_size" in query else (
            world_size if world_size > 0 else int(env["WORLD_SIZE"]))
    except (KeyError, ValueError):
        return None  # torch reports the missing variable itself; the local checks name it too
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return Target(host, port, rank, world_size, agent, use_libuv)


# How long rank 0 keeps its store up after a failing verdict, for the others to read it.
READ_GRACE_S = 1.0


def _poll(done: Any, deadline: float) -> bool:
    delay = POLL_FIRST_S
    while True:
        if done():
            return True
        now = time.monotonic()
        if now >= deadline:
            return False
        time.sleep(min(delay, max(0.0, deadline - now)))
        delay = min(delay * 2, POLL_MAX_S)


def open_store(target: Target, deadline: float, probes: Any = None) -> Any:
    """Open (rank 0) or connect to the store within the deadline, or raise CheckInFailed."""
    from torch.distributed import TCPStore

    is_master = target.rank == 0 and not target.agent_store
    if not is_master:
        # Wait for a listener ourselves: TCPStore's client retries with back-off (about 2x
        # its timeout in all) and logs a C++ traceback per try.
        status = _wait_for_listener(target.host, target.port, deadline, probes)
        if status != "open":
            raise CheckInFailed([_client_failure(target, status, deadline)]) from None
    remaining = max(0.5, deadline - time.monotonic())
    try:
        return TCPStore(
            target.host, target.port, None, is_master, timedelta(seconds=remaining),
            wait_for_workers=False, multi_tenant=True, use_libuv=target.use_libuv,
        )
    except Exception as exc:  # torch raises RuntimeError / DistNetworkError subclasses
        if is_master:
            raise CheckInFailed([_master_failure(target, exc, probes)]) from None
        raise CheckInFailed([_client_failure(target, f"store handshake failed: {type(exc).__name__}", deadline,
                                             str(exc).splitlines()[0][:300] if str(exc) else "")]) from None


def _wait_for_listener(host: str, port: int, deadline: float, probes: Any = None) -> str:
    """Poll a TCP connect until it succeeds or the deadline passes; the last status."""
    status = "refused"
    delay = 0.05
    while True:
        status = _connect_status(host, port, max(0.05, min(1.0, deadline - time.monotonic())), probes)
        if status in ("open", "unresolvable") or time.monotonic() >= deadline:
            return status
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.5)


def _master_failure(target: Target, exc: BaseException, probes: Any) -> Finding:
    text = f"{type(exc).__name__}: {exc}".strip()
    short = text.splitlines()[0][:300]
    where = f"{target.host}:{target.port}"
    lowered = text.lower()
    if "address already in use" in lowered or "errno: 98" in lowered or "eaddrinuse" in lowered:
        holder = _port_holder(target.port, probes)
        return INIT_PORT_IN_USE(
            f"Rank 0 cannot listen on {where}: the port is already in use{holder}",
            detail=f"torch's TCPStore could not bind: {short}",
            ranks=(0,), hosts=(socket.gethostname(),), check=CHECK, data={"port": target.port},
        )
    return INIT_MASTER_UNREACHABLE(
        f"Rank 0 cannot host the rendezvous store on {where}",
        detail=f"torch's TCPStore failed: {short}",
        remediation="Check that MASTER_ADDR is an address of rank 0's host (not another machine's) and the port is free",
        ranks=(0,), check=CHECK,
    )


def _client_failure(target: Target, status: str, deadline: float, extra: str = "") -> Finding:
    where = f"{target.host}:{target.port}"
    rank = (target.rank,)
    tail = f" ({extra})" if extra else ""
    if status == "unresolvable":
        return INIT_MASTER_UNRESOLVABLE(
            f"Rank {target.rank} cannot resolve MASTER_ADDR {target.host!r}", ranks=rank, check=CHECK)
    if status == "timeout":
        return INIT_MASTER_FILTERED(
            f"Rank {target.rank}'s connections to {where} time out (no answer at all)",
            detail="Packets are dropped: a firewall, a wrong network, or a host that is down." + tail,
            ranks=rank, check=CHECK,
        )
    reason = "nothing listens there" if status == "refused" else status
    return INIT_MASTER_UNREACHABLE(
        f"Rank {target.rank} found no rendezvous store at {where} before its deadline ({reason}): "
        "rank 0 is missing or MASTER_ADDR/MASTER_PORT point elsewhere",
        detail=("Rank 0 hosts the store on MASTER_PORT once it reaches init_process_group. It was not started, "
                "crashed, is still busy before init, or runs on another host/port." + tail),
        ranks=rank + (0,), check=CHECK,
    )


def _connect_status(host: str, port: int, timeout: float, probes: Any = None) -> str:
    """open, unresolvable, timeout, refused, or "connect error: ..." from the shared bounded probe
    (its name lookup has a deadline too)."""
    if probes is None:
        from distdoctor.machine.probes import Probes

        probes = Probes()
    result = probes.connect(host, port, timeout)
    status = getattr(result, "status", None)
    if status in ("open", "unresolvable", "timeout", "refused"):
        return status
    return f"connect error: {getattr(result, 'detail', '') or result}"


def _port_holder(port: int, probes: Any) -> str:
    if probes is None:
        return ""
    try:
        listeners = probes.listeners(port)
    except Exception:
        return ""
    if not isinstance(listeners, (list, tuple)) or not listeners:
        return ""
    first = listeners[0]  # Probes.listeners: {"pid", "address", "cmdline"}
    pid, cmdline = first.get("pid"), first.get("cmdline")
    return f" (held by {cmdline or 'a process'}{f', pid {pid}' if pid else ''})"


def check_in(store: Any, target: Target, deadline: float, env: Mapping[str, str], rank0_share: float = 0.85) -> None:
    """Every rank checks in; rank 0 decides. Raises CheckInFailed with the same verdict on every rank.

    Rank 0 stops waiting at ``rank0_share`` of the remaining time, so that it (the one that
    can name the missing ranks) decides before the others give up.
    """
    key = (f"{target.host}:{target.port}", target.world_size)
    attempt = _ATTEMPTS[key] = _ATTEMPTS.get(key, 0) + 1
    restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    run = env.get("TORCHELASTIC_RUN_ID", "")
    prefix = f"distdoctor/init/{run}/{restart}/{attempt}"
    decision_key = f"{prefix}/decision"
    me = target.rank

    claims = store.add(f"{prefix}/claim/{me}", 1)
    store.set(f"{prefix}/rank/{me}/{claims}", json.dumps(
        {"host": socket.gethostname(), "pid": os.getpid(), "world_size": target.world_size}))
    if claims > 1:
        # This process is a duplicate of rank `me`: it cannot join; the first claimant goes on.
        raise CheckInFailed([INIT_DUPLICATE_RANK(
            f"Another process already claimed rank {me}; this one (pid {os.getpid()} on {socket.gethostname()}) is a duplicate",
            ranks=(me,), hosts=(socket.gethostname(),), check=CHECK)])

    read_key = f"{prefix}/read"
    if me == 0:
        verdict = _rank0_verdict(store, prefix, target, time.monotonic() + (deadline - time.monotonic()) * rank0_share)
        verdict = _decode(store.compare_set(decision_key, "", json.dumps(verdict)))
        if not verdict.get("ok"):
            # Rank 0 hosts the store and is about to raise: keep it up (bounded) until the others
            # have read the verdict, or they would find the store gone instead of the reason.
            readers = sum(1 for r in range(1, target.world_size) if store.add(f"{prefix}/claim/{r}", 0) > 0)
            _poll(lambda: store.add(read_key, 0) >= readers, min(deadline, time.monotonic() + READ_GRACE_S))
    else:
        try:
            if _poll(lambda: store.check([decision_key]), deadline):
                verdict = _decode(store.get(decision_key))
            else:
                abort = {"ok": False, "findings": [INIT_RANKS_MISSING(
                    f"Rank 0 did not complete the rendezvous within the deadline (rank {me} gave up waiting)",
                    detail="Rank 0 hosts the store but never published its verdict: it is stuck or very slow.",
                    ranks=(0,), check=CHECK).to_dict()]}
                verdict = _decode(store.compare_set(decision_key, "", json.dumps(abort)))
            store.add(read_key, 1)
        except (RuntimeError, OSError) as exc:  # torch's DistNetworkError is a RuntimeError
            raise CheckInFailed([INIT_MASTER_UNREACHABLE(
                f"Rank 0's store at {target.host}:{target.port} closed before rank {me} read its verdict",
                detail=f"Rank 0 ended (or lost its store) during the check-in: {str(exc).splitlines()[0][:200]}",
                ranks=(0,), check=CHECK)]) from None
    if not verdict.get("ok"):
        raise CheckInFailed([Finding.from_dict(f) for f in verdict.get("findings", ())])


def _rank0_verdict(store: Any, prefix: str, target: Target, deadline: float) -> dict[str, Any]:
    world = target.world_size
    keys = [f"{prefix}/rank/{r}/1" for r in range(world)]
    if not _poll(lambda: store.check(keys), deadline):
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        present = world - len(missing)
        label = ("rank " if len(missing) == 1 else "ranks ") + format_ranks(missing)
        finding = INIT_RANKS_MISSING(
            f"{label.capitalize()} never checked in ({present} of {world} ranks arrived)",
            detail=(f"Rank 0 hosted the store at {target.host}:{target.port} and waited for WORLD_SIZE={world} ranks. "
                    "The missing ranks were not started, crashed before init_process_group, or point at another "
                    "MASTER_ADDR/MASTER_PORT."),
            ranks=missing, check=CHECK, data={"missing": missing, "world_size": world},
        )
        return {"ok": False, "findings": [finding.to_dict()] + [f.to_dict() for f in _duplicates(store, prefix, world)]}
    records = [_decode(raw) for raw in store.multi_get(keys)]
    findings: list[Finding] = []
    sizes: dict[int, list[int]] = {}
    for r, record in enumerate(records):
        sizes.setdefault(int(record.get("world_size", world)), []).append(r)
    if len(sizes) > 1:
        spread = "; ".join(f"{('rank ' if len(rs) == 1 else 'ranks ') + format_ranks(rs)}: {s}"
                           for s, rs in sorted(sizes.items(), key=lambda kv: min(kv[1])))
        findings.append(INIT_WORLD_DISAGREES(
            f"Ranks were given different world sizes: {spread}",
            ranks=[r for s, rs in sizes.items() if s != world for r in rs], check=CHECK))
    findings += _duplicates(store, prefix, world)
    return {"ok": not findings, "findings": [f.to_dict() for f in findings]}


def _duplicates(store: Any, prefix: str, world: int) -> list[Finding]:
    """Ranks claimed by more than one process so far (a later duplicate finds the group formed)."""
    duplicates = [r for r in range(world) if store.add(f"{prefix}/claim/{r}", 0) > 1]
    if not duplicates:
        return []
    return [INIT_DUPLICATE_RANK(
        f"Several processes claim {('rank ' if len(duplicates) == 1 else 'ranks ') + format_ranks(duplicates)}",
        ranks=duplicates, check=CHECK)]


def _decode(raw: Any) -> dict[str, Any]:
    try:
        value = json.loads(raw.decode() if isinstance(raw, (bytes, bytearray)) else raw)
        return value if isinstance(value, dict) else {"ok": False, "findings": []}
    except (ValueError, UnicodeDecodeError):
        return {"ok": False, "findings": []}
