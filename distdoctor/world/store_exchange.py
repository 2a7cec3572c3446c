"""Rendezvous and exchange between ranks over the c10d store (JSON with a size bound, never pickle).

Who hosts the store:
- under torchrun the elastic agent already hosts one on MASTER_ADDR:MASTER_PORT and tells its
  workers so with TORCHELASTIC_USE_AGENT_STORE=True; every rank connects to it as a client, exactly
  as torch.distributed.rendezvous._create_c10d_store does, so distdoctor never takes the agent's
  port. The self-test supervisor (distdoctor.world.selftest) plays the agent's part and says so the same way.
- otherwise (srun, mpirun, variables set by hand) rank 0 hosts a TCPStore on MASTER_PORT and the
  other ranks connect to it; the store is released when rank 0 is done.

What crosses the wire (every key under one namespace, ``distdoctor/<run>``):
- ``claim/<rank>``     a counter every process claiming that rank adds 1 to; the answer tells a
                       process whether it is the first claimant (1) or a duplicate (2, 3, ...).
- ``checkin/<rank>/<claim>``  that process's check-in (JSON, bounded), so duplicates never
                       overwrite each other.
- ``roster``           one appended line per process (``rank:claim;``): rank 0 reads every
                       arrival with one request, whatever the world size.
- ``decision``         rank 0's verdict after the rendezvous stage, the same for every rank.
- ``done/<stage>`` + ``results/<stage>/<rank>``  who finished a stage, and with what.
- ``final``            the exit code rank 0 settled on; the others exit with it after rank 0 printed.
Messages at rank 0 are O(1) per poll plus one multi_get per phase; bytes are O(world size).
Every operation has a deadline: waits poll ``check`` (never a blocking get on a missing key).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Iterable, Mapping, Sequence

from distdoctor.core.progress import PROGRESS
from distdoctor.core.context import WorldError
from distdoctor.machine.launchers import TORCHRUN, LaunchInfo

# A check-in carries findings and a snapshot; 64 KiB is ~10x a typical one, and keeps a
# 1024-rank gather at rank 0 under 64 MiB even when every rank is at the bound.
MAX_MESSAGE_BYTES = 64 * 1024
# Polling back-off for waits: quick first answers on a healthy world, little load on a slow one.
POLL_FIRST_S, POLL_MAX_S = 0.005, 0.1
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
RUN_ID_ENV = "DISTDOCTOR_RUN_ID"


# -- wire format ------------------------------------------------------------------------------
def encode(obj: Any, limit: int = MAX_MESSAGE_BYTES) -> bytes:
    raw = json.dumps(obj, separators=(",", ":"), default=str).encode("utf-8")
    if len(raw) > limit:
        raise WorldError(f"message of {len(raw)} bytes exceeds the {limit}-byte bound", cause="unknown")
    return raw


def decode(raw: bytes | str, limit: int = MAX_MESSAGE_BYTES) -> Any:
    """Parse a message from another rank; an oversized or malformed one is refused, not trusted."""
    if len(raw) > limit:
        raise WorldError(f"message of {len(raw)} bytes exceeds the {limit}-byte bound", cause="unknown")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WorldError(f"message is not valid JSON: {exc}", cause="unknown") from None


def fit(payload: Mapping[str, Any], limit: int = MAX_MESSAGE_BYTES, droppable: Iterable[str] = ()) -> dict[str, Any]:
    """Drop the bulkiest optional fields (in the given order) until the payload fits the bound."""
    out = dict(payload)
    dropped: list[str] = []
    for name in droppable:
        if len(json.dumps(out, separators=(",", ":"), default=str).encode()) <= limit:
            break
        if name in out:
            out[name] = None
            dropped.append(name)
    if dropped:
        out["truncated"] = dropped
    return out


# -- where the world is -----------------------------------------------------------------------
@dataclass(frozen=True)
class WorldSpec:
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    # "agent": a launcher process hosts the store (torchrun agent, self-test supervisor);
    # "rank0": rank 0 hosts it on MASTER_PORT (srun, mpirun, by hand).
    store_host: str
    namespace: str
    launcher: str

    @classmethod
    def from_launch(cls, launch: LaunchInfo, env: Mapping[str, str]) -> "WorldSpec | None":
        """The world the environment describes, or None when it describes none usable."""
        if not launch.world_configured:
            return None
        # The same test as torch.distributed.rendezvous._torchelastic_use_agent_store().
        agent = env.get(AGENT_STORE_ENV) == str(True)
        if launch.launcher == TORCHRUN and env.get("TORCHELASTIC_RUN_ID"):
            # The agent's store outlives a restart of the workers; a fresh namespace per attempt.
            run = f"{env['TORCHELASTIC_RUN_ID']}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        else:
            run = env.get(RUN_ID_ENV, "default")
        return cls(
            rank=int(launch.rank.value),  # type: ignore[arg-type]
            world_size=int(launch.world_size.value),  # type: ignore[arg-type]
            master_addr=str(launch.master_addr).strip(),
            master_port=int(launch.master_port.value),  # type: ignore[arg-type]
            store_host="agent" if agent else "rank0",
            namespace=f"distdoctor/{run}",
            launcher=launch.launcher,
        )


@dataclass(frozen=True)
class Unanswered:
    """Why nothing listening was reached at host:port before the deadline.

    ``kind``: ``refused`` (a host answered, nothing listens), ``no_host`` (nobody answers ARP
    for the address), ``no_route`` (the kernel has no path), ``timeout`` (connects got no
    answer at all: packets dropped), ``unresolvable``, ``error``.
    """

    kind: str
    detail: str
    address: str | None = None
    attempts: int = 0

    @property
    def cause(self) -> str:
        return "firewall" if self.kind == "timeout" else "master_unreachable"

    def __str__(self) -> str:
        return self.detail


# One connect attempt waits at most this long; refused and no-route answers come back at once.
CONNECT_ATTEMPT_S = 2.0


def wait_for_listener(host: str, port: int, deadline: float, clock: Callable[[], float] = time.monotonic,
                      probes: Any = None) -> Unanswered | None:
    """Poll a TCP connect until something listens (None) or the deadline passes (why not).

    torch's TCPStore client cannot tell these apart: it retries refused connects until its own
    timeout and then says "timed out" whatever happened, and logs a C++ stack for every failed
    try. A plain socket probe keeps the terminal clean and the answer precise. How the attempts
    are judged: one refusal shows a host is there (master_unreachable: nothing listens); an
    unanswered ARP or a kernel "no route" from the start shows nobody is there
    (master_unreachable); connects that time out while the address resolved on the link (or
    through a gateway) are packets dropped on the way (firewall) -- also when, later, a partition
    makes the kernel's neighbour entry fail too.
    """
    probes = _probes(probes)
    delay = 0.02
    attempts: list[tuple[str, str, str | None]] = []  # (kind, detail, address)
    while True:
        left = deadline - clock()
        if left <= 0:
            return _verdict(attempts)
        attempt = _attempt(host, port, min(max(left, 0.05), CONNECT_ATTEMPT_S), probes)
        if attempt is None:
            return None
        attempts.append(attempt)
        time.sleep(max(min(delay, deadline - clock()), 0))
        delay = min(delay * 2, 0.1)


def probe_once(host: str, port: int, timeout: float, probes: Any = None) -> Unanswered | None:
    """One connect attempt: None when something listens, else why not."""
    attempt = _attempt(host, port, timeout, _probes(probes))
    return None if attempt is None else _verdict([attempt])


def _probes(probes: Any) -> Any:
    if probes is None:
        from distdoctor.machine.probes import Probes

        probes = Probes()
    return probes


def _attempt(host: str, port: int, timeout: float, probes: Any) -> tuple[str, str, str | None] | None:
    result = probes.connect(host, port, timeout)
    status = getattr(result, "status", None)
    if status == "open":
        return None
    address = getattr(result, "address", None)
    detail = getattr(result, "detail", "") or str(result)
    if status == "timeout":
        if address and probes.arp_unanswered(address) is True:
            return "no_host", f"no host answers ARP for {address}", address
        return "timeout", f"connects to {address or host} got no answer ({detail})", address
    if status in ("refused", "no_route", "unresolvable"):
        return status, detail, address
    return "error", detail or f"could not connect: {result}", address


def _verdict(attempts: list[tuple[str, str, str | None]]) -> Unanswered:
    if not attempts:
        return Unanswered("error", "no attempt made before the deadline", None, 0)
    kinds = [kind for kind, _, _ in attempts]
    # A refusal is the strongest evidence: a host answered. Otherwise the first attempt tells
    # what the path was like when the rank started (a partition later also fails the ARP entry).
    chosen = next(a for a in attempts if a[0] == "refused") if "refused" in kinds else attempts[0]
    kind, detail, address = chosen
    later = sorted({k for k in kinds if k != kind})
    text = f"{detail}; {len(attempts)} attempt{'s' if len(attempts) != 1 else ''}"
    if later:
        text += f" (also seen: {', '.join(later)})"
    return Unanswered(kind, text, address, len(attempts))


def _tcp_store(host: str, port: int, *, is_master: bool, timeout_s: float) -> Any:
    from torch.distributed import TCPStore

    kwargs: dict[str, Any] = {"timeout": timedelta(seconds=max(timeout_s, 0.1))}
    if is_master:
        # wait_for_workers=False: rank 0 counts arrivals itself, with its own deadline.
        kwargs.update(world_size=None, wait_for_workers=False, multi_tenant=True)
    return TCPStore(host, port, is_master=is_master, **kwargs)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _port_taken(message: str) -> bool:
    # torch: "The server socket has failed to listen on any local network address. port: 29500,
    # useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
    return "EADDRINUSE" in message or "address already in use" in message.lower()


def _local_addresses_of(host: str, probes: Any) -> tuple[list[str], bool | None]:
    """MASTER_ADDR's addresses, and whether one of them belongs to this host (None: cannot tell)."""
    resolved = probes.resolve(host, 3.0)
    addresses = list(getattr(resolved, "addresses", ()) or ())
    if not addresses:
        return [], None
    return addresses, any(probes.is_local_address(a) is True for a in addresses)


# How long rank 0's one connect to a MASTER_ADDR that is not its own may take. Its store already
# listens, so an address that leads here (NAT, a virtual IP) answers within milliseconds; no
# answer within this time is an answer. An address nobody holds is told by its unanswered ARP.
FOREIGN_MASTER_PROBE_S = 1.0


def _host_store(spec: "WorldSpec", deadline: float, clock: Callable[[], float], probes: Any) -> tuple[Any, str]:
    """Rank 0 hosts the store; returns (store, the host its own client used). Raises WorldError."""
    addresses, local = _local_addresses_of(spec.master_addr, probes)
    data = {"master_addr": spec.master_addr, "master_port": spec.master_port, "addresses": addresses}
    # The store listens on every address of this host; its own client connects to MASTER_ADDR.
    # When MASTER_ADDR is not an address here, that client could only come back through NAT or a
    # virtual IP: connect it over loopback, and probe MASTER_ADDR separately to learn the truth.
    client_host = spec.master_addr if local is not False else ("::1" if ":" in addresses[0] else "127.0.0.1")
    try:
        store = _tcp_store(client_host, spec.master_port, is_master=True, timeout_s=deadline - clock())
    except Exception as exc:
        message = _first_line(exc)
        if "EADDRNOTAVAIL" in message or "cannot assign requested address" in message.lower():
            # torch's server binds every address, so this comes from an address it was told to
            # use: MASTER_ADDR is not one of this host's.
            raise WorldError(f"rank 0 could not host the store at {spec.master_addr}:{spec.master_port}: {message}; "
                             f"{spec.master_addr} is not an address of this host",
                             cause="master_unreachable", reason="master_not_here",
                             data={**data, "error": message, "probe": "not_local"}) from None
        if not _port_taken(message):
            raise WorldError(f"rank 0 could not host the store on port {spec.master_port}: {message}",
                             cause="unknown", reason="host_failed", data={**data, "error": message}) from None
        # Port taken: maybe by a second process claiming rank 0 (then join its store as a client).
        problem = wait_for_listener(spec.master_addr, spec.master_port, min(deadline, clock() + 1.0), clock, probes)
        if problem is not None:
            raise WorldError(
                f"rank 0 could not host the store on port {spec.master_port} ({message}) "
                f"and nothing answers there ({problem})",
                cause="port_in_use", reason="port_taken", data={**data, "error": message},
            ) from None
        return None, spec.master_addr
    if local is False:
        problem = probe_once(spec.master_addr, spec.master_port,
                             max(min(deadline - clock(), FOREIGN_MASTER_PROBE_S), 0.05), probes)
        if problem is not None:
            del store  # release the port at once: nobody can reach it through MASTER_ADDR
            raise WorldError(
                f"MASTER_ADDR={spec.master_addr} ({', '.join(addresses)}) is not an address of this host, "
                f"where rank 0 runs, and it does not lead here: {problem}",
                cause="master_unreachable", reason="master_not_here",
                data={**data, "probe": problem.kind, "probe_detail": problem.detail},
            )
    return store, client_host


def open_store(spec: WorldSpec, deadline: float, clock: Callable[[], float] = time.monotonic,
               probes: Any = None) -> tuple[Any, bool, str]:
    """Connect to (or host) the c10d store; returns (store, hosted_here, the host connected to).

    Raises WorldError, whose ``reason`` and ``cause`` say what went wrong.
    """
    probes = _probes(probes)
    left = deadline - clock()
    if left <= 0:
        raise WorldError("no time was left to reach the store", reason="no_time")
    host = spec.master_addr
    if spec.store_host == "rank0" and spec.rank == 0:
        store, host = _host_store(spec, deadline, clock, probes)
        if store is not None:
            return store, True, host
    else:
        problem = wait_for_listener(spec.master_addr, spec.master_port, deadline, clock, probes)
        if problem is not None:
            who = "the launcher's store" if spec.store_host == "agent" else "rank 0's store"
            verb = "timed out" if problem.kind == "timeout" else "did not answer"
            raise WorldError(
                f"connecting to {who} at {spec.master_addr}:{spec.master_port} {verb} until the deadline: {problem}",
                cause=problem.cause,
                reason="dropped" if problem.kind == "timeout" else "unreachable",
                data={"master_addr": spec.master_addr, "master_port": spec.master_port, "probe": problem.kind,
                      "address": problem.address, "attempts": problem.attempts},
            )
    try:
        return _tcp_store(host, spec.master_port, is_master=False, timeout_s=max(deadline - clock(), 0.5)), False, host
    except Exception as exc:
        raise WorldError(f"connecting to the store at {spec.master_addr}:{spec.master_port} failed: "
                         f"{_first_line(exc)}") from None


# -- the live world ---------------------------------------------------------------------------
class GroupFailedElsewhere(Exception):
    """Another rank could not create the process group: this rank's creation can never finish."""

    def __init__(self, backend: str, failures: Mapping[int, str]) -> None:
        self.backend = backend
        self.failures = dict(failures)
        ranks = ", ".join(str(r) for r in sorted(self.failures))
        super().__init__(f"rank{'s' if len(self.failures) > 1 else ''} {ranks} could not create the {backend} group")


@dataclass
class Arrival:
    rank: int
    claim: int
    seen_s: float  # when rank 0 first saw it, seconds since rank 0 started waiting


@dataclass
class CheckIns:
    """What rank 0 knows after the check-in phase."""

    expected: int
    arrivals: list[Arrival]
    payloads: dict[tuple[int, int], dict[str, Any]]
    unreadable: dict[tuple[int, int], str] = field(default_factory=dict)
    waited_s: float = 0.0

    @property
    def accepted(self) -> dict[int, dict[str, Any]]:
        """rank -> the check-in of its first claimant."""
        return {r: p for (r, c), p in self.payloads.items() if c == 1}

    @property
    def reported(self) -> list[int]:
        return sorted({a.rank for a in self.arrivals if 0 <= a.rank < self.expected})

    @property
    def missing(self) -> list[int]:
        seen = {a.rank for a in self.arrivals}
        return [r for r in range(self.expected) if r not in seen]

    @property
    def duplicates(self) -> dict[int, list[int]]:
        """rank -> its claims, for every rank claimed by more than one process."""
        claims: dict[int, list[int]] = {}
        for a in self.arrivals:
            claims.setdefault(a.rank, []).append(a.claim)
        return {r: sorted(c) for r, c in claims.items() if len(c) > 1}


def parse_roster(text: str) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for item in text.split(";"):
        rank, _, claim = item.partition(":")
        if rank.strip().lstrip("-").isdigit() and claim.strip().isdigit():
            out.append((int(rank), int(claim)))
    return out


class World:
    """One rank's handle on the store-backed world. Thread-safe for the watchdog's reads."""

    def __init__(self, spec: WorldSpec, store: Any, *, hosted: bool = False, clock: Callable[[], float] = time.monotonic,
                 connect_host: str | None = None) -> None:
        from torch.distributed import PrefixStore

        self.spec = spec
        self.raw_store = store
        self.store = PrefixStore(spec.namespace, store)
        self.hosted = hosted
        # Where this process's store client connected (rank 0 may use loopback); process groups
        # get their own client there.
        self.connect_host = connect_host or spec.master_addr
        self.clock = clock
        self.claim: int | None = None
        self.nonce = secrets.token_hex(4)
        self.process_groups: dict[str, Any] = {}
        # Set by a collective check whose operation did not complete: the group is out of step
        # and later collectives on it would pair up wrongly, so they are skipped.
        self.poisoned: str | None = None
        # Rank 0: every rank's check-in (for the rendezvous checks). Every rank: rank 0's decision.
        self.checkins: CheckIns | None = None
        self.decision: dict[str, Any] = {}
        # Why the store stopped answering this process (rank 0 that hosted it ended), if it did.
        self.lost: str | None = None
        self._lock = threading.Lock()

    # -- identity ------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.spec.rank

    @property
    def size(self) -> int:
        return self.spec.world_size

    @property
    def is_root(self) -> bool:
        return self.spec.rank == 0 and self.claim in (None, 1)

    @property
    def is_duplicate(self) -> bool:
        return bool(self.claim and self.claim > 1)

    @classmethod
    def open(cls, spec: WorldSpec, deadline: float, clock: Callable[[], float] = time.monotonic,
             probes: Any = None) -> "World":
        store, hosted, host = open_store(spec, deadline, clock, probes)
        return cls(spec, store, hosted=hosted, clock=clock, connect_host=host)

    # -- primitives ----------------------------------------------------------------------
    def put(self, key: str, obj: Any, limit: int = MAX_MESSAGE_BYTES) -> None:
        with self._lock:
            self.store.set(key, encode(obj, limit))

    def fetch(self, key: str, deadline: float, limit: int = MAX_MESSAGE_BYTES) -> Any:
        """The JSON value under key once it exists; None when the deadline passes first."""
        if not self.wait_key(key, deadline):
            return None
        with self._lock:
            return decode(self.store.get(key), limit)

    def fetch_first(self, keys: Sequence[str], deadline: float, limit: int = MAX_MESSAGE_BYTES) -> tuple[str | None, Any]:
        """(key, value) of the first of ``keys`` to exist; (None, None) at the deadline.

        Never raises: when the store goes away (rank 0 hosted it and has ended), the error is
        kept in ``lost`` and (None, None) returned, so the caller reports what it knows.
        """
        delay = POLL_FIRST_S
        try:
            while True:
                for key in keys:
                    with self._lock:
                        if self.store.check([key]):
                            return key, decode(self.store.get(key), limit)
                left = deadline - self.clock()
                if left <= 0:
                    return None, None
                time.sleep(min(delay, left))
                delay = min(delay * 2, POLL_MAX_S)
        except WorldError as exc:
            self.lost = f"a message from rank 0 could not be read: {exc}"
        except Exception as exc:
            self.lost = f"the store went away: {_first_line(exc)}"
        return None, None

    def wait_key(self, key: str, deadline: float) -> bool:
        delay = POLL_FIRST_S
        while True:
            with self._lock:
                if self.store.check([key]):
                    return True
            left = deadline - self.clock()
            if left <= 0:
                return False
            time.sleep(min(delay, left))
            delay = min(delay * 2, POLL_MAX_S)

    def read_text(self, key: str) -> str:
        with self._lock:
            if not self.store.check([key]):
                return ""
            return self.store.get(key).decode("utf-8", "replace")

    # -- check-in ------------------------------------------------------------------------
    def check_in(self, payload: Mapping[str, Any]) -> int:
        """Claim this rank and post the check-in; returns the claim number (1 = first claimant)."""
        with self._lock:
            claim = int(self.store.add(f"claim/{self.rank}", 1))
        self.claim = claim
        body = {**payload, "rank": self.rank, "claim": claim, "nonce": self.nonce}
        self.put(f"checkin/{self.rank}/{claim}", body)
        with self._lock:
            self.store.append("roster", f"{self.rank}:{claim};")
        return claim

    def wait_for_checkins(self, deadline: float, settle_s: float = 0.0) -> CheckIns:
        """Rank 0: poll the roster until every rank 0..size-1 arrived or the deadline passed.

        ``settle_s`` keeps listening that long after the last expected rank arrived, so that a
        second process claiming a rank moments later is still seen.
        """
        start = self.clock()
        seen: dict[tuple[int, int], float] = {}
        delay = POLL_FIRST_S
        complete_at: float | None = None
        while True:
            for rank, claim in parse_roster(self.read_text("roster")):
                seen.setdefault((rank, claim), self.clock() - start)
            now = self.clock()
            have = {r for r, _ in seen}
            PROGRESS.set_ranks(sum(1 for r in have if 0 <= r < self.size), self.size)
            if all(r in have for r in range(self.size)):
                complete_at = complete_at if complete_at is not None else now
                if now - complete_at >= settle_s:
                    break
            if now >= deadline:
                break
            time.sleep(max(min(delay, deadline - now), 0))
            delay = min(delay * 2, POLL_MAX_S)
        arrivals = [Arrival(r, c, t) for (r, c), t in sorted(seen.items(), key=lambda kv: kv[1])]
        payloads, unreadable = self._read_checkins(list(seen))
        return CheckIns(self.size, arrivals, payloads, unreadable, self.clock() - start)

    def late_claims(self, known: Iterable[tuple[int, int]]) -> tuple[dict[tuple[int, int], dict[str, Any]], dict[tuple[int, int], str]]:
        """Check-ins that arrived after the check-in phase (late duplicates), read once more."""
        known = set(known)
        fresh = [k for k in parse_roster(self.read_text("roster")) if k not in known]
        return self._read_checkins(fresh)

    def _read_checkins(self, keys: list[tuple[int, int]]) -> tuple[dict[tuple[int, int], dict[str, Any]], dict[tuple[int, int], str]]:
        payloads: dict[tuple[int, int], dict[str, Any]] = {}
        unreadable: dict[tuple[int, int], str] = {}
        if not keys:
            return payloads, unreadable
        with self._lock:
            # One request for all of them: the roster entry is appended after the payload is set.
            raws = self.store.multi_get([f"checkin/{r}/{c}" for r, c in keys])
        for key, raw in zip(keys, raws):
            try:
                value = decode(raw)
                if not isinstance(value, dict):
                    raise WorldError("check-in is not a JSON object")
                payloads[key] = value
            except WorldError as exc:
                unreadable[key] = str(exc)
        return payloads, unreadable

    # -- stages --------------------------------------------------------------------------
    def mark_done(self, stage: str, results: Mapping[str, Any], limit: int = MAX_MESSAGE_BYTES) -> None:
        self.put(f"results/{stage}/{self.rank}", results, limit)
        with self._lock:
            self.store.append(f"done/{stage}", f"{self.rank};")

    def done_ranks(self, stage: str) -> set[int]:
        return {int(x) for x in self.read_text(f"done/{stage}").split(";") if x.strip().lstrip("-").isdigit()}

    def wait_done(self, stage: str, ranks: Iterable[int], deadline: float) -> set[int]:
        """Rank 0: wait for these ranks to finish a stage; returns those that did."""
        wanted = set(ranks)
        delay = POLL_FIRST_S
        while True:
            done = self.done_ranks(stage) & wanted
            PROGRESS.set_ranks(len(done) + 1, len(wanted) + 1, "done")  # rank 0 waits here, done itself
            left = deadline - self.clock()
            if done == wanted or left <= 0:
                return done
            time.sleep(min(delay, left))
            delay = min(delay * 2, POLL_MAX_S)

    def results(self, stage: str, ranks: Iterable[int]) -> dict[int, Any]:
        ranks = sorted(set(ranks))
        if not ranks:
            return {}
        with self._lock:
            raws = self.store.multi_get([f"results/{stage}/{r}" for r in ranks])
        out: dict[int, Any] = {}
        for rank, raw in zip(ranks, raws):
            try:
                out[rank] = decode(raw)
            except WorldError as exc:
                out[rank] = {"unreadable": str(exc)}
        return out

    def say_goodbye(self) -> None:
        with self._lock:
            self.store.add("bye", 1)

    def goodbyes(self) -> int:
        with self._lock:
            return int(self.store.add("bye", 0))

    def await_goodbyes(self, expected: int, until: float) -> None:
        """Rank 0 hosting the store: keep it up until ``expected`` others read the final word."""
        while self.clock() < until:
            try:
                if self.goodbyes() >= expected:
                    return
            except Exception:
                return
            time.sleep(0.01)

    # -- process groups ------------------------------------------------------------------
    def process_group(self, backend: str, timeout_s: float) -> Any:
        """A process group over this world's store (created once per backend), with a short timeout.

        gloo becomes the default group (what a user's script gets from init_process_group); any
        other backend is a second group. Every rank must call this in the same order.

        Creating a group blocks in C++ until every rank has joined, so it runs in a helper thread
        while this one watches the store: a rank whose creation fails says so under
        ``pgfail/<backend>``, and the others stop waiting at once (:class:`GroupFailedElsewhere`)
        instead of sitting out the group's timeout. The group talks to the store through its own
        client connection: a TCPStore client serializes its requests, and the group's blocking
        wait would otherwise hold up every read of this world's keys (the watchdog's included).
        """
        with self._lock:
            existing = self.process_groups.get(backend)
        if existing is not None:
            return existing
        timeout = timedelta(seconds=max(timeout_s, 0.5))
        outcome: dict[str, Any] = {}

        def create() -> None:
            try:
                outcome["group"] = self._create_group(backend, timeout)
            except BaseException as exc:  # handed to the waiting thread below
                outcome["error"] = exc

        worker = threading.Thread(target=create, name=f"distdoctor-{backend}-group", daemon=True)
        worker.start()
        delay = POLL_FIRST_S
        while True:
            worker.join(delay)
            if not worker.is_alive():
                break
            failed = self.group_failures(backend)
            if failed:
                raise GroupFailedElsewhere(backend, failed)
            delay = min(delay * 2, POLL_MAX_S)
        if "error" in outcome:
            exc = outcome["error"]
            try:
                self.report_group_failure(backend, _first_line(exc))
            except Exception:
                pass  # the store is gone too; the others find out by their own timeout
            raise exc
        group = outcome["group"]
        with self._lock:
            self.process_groups[backend] = group
        return group

    def _create_group(self, backend: str, timeout: timedelta) -> Any:
        import torch.distributed as dist
        from torch.distributed import PrefixStore

        if not dist.is_initialized():
            store = PrefixStore(f"{self.spec.namespace}/pg/{backend}", self._group_store(timeout))
            dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.size, timeout=timeout)
            return dist.group.WORLD
        return dist.new_group(backend=backend, timeout=timeout)

    def _group_store(self, timeout: timedelta) -> Any:
        """A second client of the same store for the process group (any other store: itself)."""
        from torch.distributed import TCPStore

        if not isinstance(self.raw_store, TCPStore):
            return self.raw_store
        return TCPStore(self.connect_host, self.raw_store.port, is_master=False, timeout=timeout)

    def report_group_failure(self, backend: str, message: str) -> None:
        self.put(f"pgfail/{backend}/{self.rank}", {"rank": self.rank, "error": message[:2000]})
        with self._lock:
            self.store.append(f"pgfail/{backend}", f"{self.rank};")

    def group_failures(self, backend: str) -> dict[int, str]:
        """Other ranks that could not create this group: rank -> their error."""
        ranks = sorted({int(x) for x in self.read_text(f"pgfail/{backend}").split(";")
                        if x.strip().lstrip("-").isdigit()} - {self.rank})
        if not ranks:
            return {}
        with self._lock:
            raws = self.store.multi_get([f"pgfail/{backend}/{r}" for r in ranks])
        out: dict[int, str] = {}
        for rank, raw in zip(ranks, raws):
            try:
                value = decode(raw)
                out[rank] = str(value.get("error", "")) if isinstance(value, dict) else ""
            except WorldError as exc:
                out[rank] = f"(unreadable: {exc})"
        return out

    def close(self, destroy_groups: bool = True) -> None:
        """Release the process groups and the store (rank 0's hosted store goes with it)."""
        if destroy_groups and self.process_groups and self.poisoned is None:
            try:
                import torch.distributed as dist

                if dist.is_initialized():
                    dist.destroy_process_group()
            except Exception:
                pass
        self.process_groups.clear()
        self.store = None  # type: ignore[assignment]
        self.raw_store = None

