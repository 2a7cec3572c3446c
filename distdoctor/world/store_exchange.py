"""Rendezvous and exchange between ranks over the c10d store (JSON with a size bound, never pickle).

Who hosts the store and how it is reached: distdoctor.world.store_open.

What crosses the wire (every key under one namespace, ``distdoctor/<run>``): the check-in
protocol's keys (distdoctor.world.checkin: ``claim/<rank>``, ``checkin/<rank>/<claim>``,
``roster``, ``decision``, ``final``), and the world's own: ``done/<stage>`` +
``results/<stage>/<rank>`` (who finished a stage, and with what), ``pgfail/<backend>`` (a rank
whose process group failed), ``bye`` (who read the final word). Every value read is checked
against a schema (the store has no authentication); every wait polls with a deadline.
Messages at rank 0 are O(1) per poll plus one multi_get per phase; bytes are O(world size).
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
from distdoctor.core.rank_groups import ranks_label
from distdoctor.world.checkin import (
    CHECKS,
    CLAIM_GRACE_S,
    FINAL,
    FINDINGS,
    MAX_MESSAGE_BYTES,
    MAX_RANK,
    POLL_FIRST_S,
    CheckInProtocol,
    StoreGone,
    boolean,
    first_line,
    integer,
    list_of,
    number,
    obj,
    optional,
    poll_cap,
    text,
)
from distdoctor.world.checkin import decode as protocol_decode
from distdoctor.world.checkin import encode as protocol_encode
from distdoctor.world.store_clients import BURST_FREE, SpareClients, connect_delay
from distdoctor.world.store_open import WorldSpec, open_store

# How much longer than its own delay a rank waits for its spare clients before opening one at once.
SPARE_WAIT_S = 1.0


# -- wire format (the check-in protocol's, with the world's error) ------------------------------
def encode(obj: Any, limit: int = MAX_MESSAGE_BYTES) -> bytes:
    try:
        return protocol_encode(obj, limit)
    except ValueError as exc:
        raise WorldError(str(exc), cause="unknown") from None


def decode(raw: bytes | str, limit: int = MAX_MESSAGE_BYTES) -> Any:
    """Parse a message from another rank; an oversized or malformed one is refused, not trusted."""
    try:
        return protocol_decode(raw, limit)
    except ValueError as exc:
        raise WorldError(f"message is {exc}" if str(exc).startswith("not") else str(exc), cause="unknown") from None


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


# -- the live world ---------------------------------------------------------------------------
class GroupFailedElsewhere(Exception):
    """Another rank could not create the process group: this rank's creation can never finish."""

    def __init__(self, backend: str, failures: Mapping[int, str]) -> None:
        self.backend = backend
        self.failures = dict(failures)
        super().__init__(f"{ranks_label(self.failures)} could not create the {backend} group")


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
        """rank -> the check-in of its first claimant (the lowest claim that checked in: a claim
        counter bumped by something that never checked in does not push a rank out)."""
        out: dict[int, dict[str, Any]] = {}
        for (rank, claim), payload in sorted(self.payloads.items()):
            out.setdefault(rank, payload)
        return out

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


# What rank 0 publishes and the others act on (the world's schemas of the check-in protocol).
def _devices(value: Any) -> bool:
    return isinstance(value, dict) and len(value) <= MAX_RANK and all(
        isinstance(k, str) and type(v) is int and 0 <= v < 4096 for k, v in value.items())


DECISION = ({"skip": optional(text(4096)), "accepted": list_of(integer(0, MAX_RANK), MAX_RANK),
             "size": integer(1, MAX_RANK), "nccl": optional(boolean), "nccl_reason": optional(text(4096)),
             "devices": optional(_devices), "check_timeout_s": optional(number),
             "deadline_note": optional(text(1024))}, ("accepted", "size"))
RESULTS = {"checks": CHECKS, "findings": FINDINGS, "incomplete": optional(boolean), "stuck_check": optional(text(256)),
           "native": optional(obj())}
GROUP_FAILURE = {"rank": integer(0, MAX_RANK), "error": text(4000)}


class World:
    """One rank's handle on the store-backed world. Thread-safe for the watchdog's reads."""

    def __init__(self, spec: WorldSpec, store: Any, *, hosted: bool = False, clock: Callable[[], float] = time.monotonic,
                 connect_host: str | None = None) -> None:
        # torch at use, as everywhere in this module (see _tcp_store): a World wraps a torch store.
        from torch.distributed import PrefixStore

        self.spec = spec
        self.raw_store = store
        self._store = PrefixStore(spec.namespace, store)
        self.hosted = hosted
        # Where this process's store client connected (rank 0 may use loopback); process groups
        # get their own client there.
        self.connect_host = connect_host or spec.master_addr
        self.clock = clock
        self.claim: int | None = None
        # A second process claiming a rank an earlier claimant holds (see CheckInProtocol.check_in).
        self.duplicate = False
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
        self.protocol = CheckInProtocol(self._store, size=spec.world_size, lock=self._lock, clock=clock)
        # What this rank is doing in the collective stage now, in words (a check cut off by its
        # deadline says it), and why the stage's checks have the deadline they have.
        self.step = ""
        self.deadline_note = ""
        self.spares = SpareClients(self._new_client, spec.rank)

    @property
    def store(self) -> Any:
        return self._store

    @store.setter
    def store(self, value: Any) -> None:
        # The protocol talks to the same store (a benchmark wraps it to count requests).
        self._store = value
        self.protocol.store = value

    # -- identity ------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.spec.rank

    @property
    def size(self) -> int:
        return self.spec.world_size

    @property
    def is_root(self) -> bool:
        return self.spec.rank == 0 and not self.duplicate

    @property
    def is_duplicate(self) -> bool:
        return self.duplicate

    @classmethod
    def open(cls, spec: WorldSpec, deadline: float, clock: Callable[[], float] = time.monotonic,
             probes: Any = None, seen: list | None = None) -> "World":
        if spec.world_size > BURST_FREE and not (spec.store_host == "rank0" and spec.rank == 0):
            # A large world's ranks reach this point together (torchrun starts them at once):
            # each connects at its own slot, bounded by the deadline (store_clients).
            time.sleep(min(connect_delay(spec.rank), max(deadline - clock() - 1.0, 0.0)))
        store, hosted, host = open_store(spec, deadline, clock, probes, seen)
        return cls(spec, store, hosted=hosted, clock=clock, connect_host=host)

    # -- primitives ----------------------------------------------------------------------
    def put(self, key: str, obj: Any, limit: int = MAX_MESSAGE_BYTES) -> None:
        try:
            self.protocol.set(key, obj, limit)
        except ValueError as exc:
            raise WorldError(str(exc), cause="unknown") from None

    def fetch(self, key: str, deadline: float, limit: int = MAX_MESSAGE_BYTES) -> Any:
        """The JSON value under key once it exists; None when the deadline passes first."""
        delay = POLL_FIRST_S
        while not self.protocol.exists(key):
            left = deadline - self.clock()
            if left <= 0:
                return None
            time.sleep(min(delay, left))
            delay = min(delay * 2, poll_cap(self.size))
        with self._lock:
            return decode(self.store.get(key), limit)

    def fetch_first(self, schemas: Mapping[str, tuple[Mapping[str, Any], Sequence[str]]] | Sequence[str],
                    deadline: float) -> tuple[str | None, Any]:
        """(key, value) of the first of these keys to hold a valid value; (None, None) at the deadline.

        ``schemas``: key -> (fields, required) of the check-in protocol; plain keys accept any
        JSON object.

        Never raises: when the store goes away (rank 0 hosted it and has ended), the error is
        kept in ``lost`` and (None, None) returned, so the caller reports what it knows.
        """
        if not isinstance(schemas, Mapping):
            schemas = {key: ({}, ()) for key in schemas}
        try:
            return self.protocol.wait_for(schemas, deadline)
        except StoreGone as exc:
            self.lost = f"the store went away: {exc}"
        except Exception as exc:
            self.lost = f"a message from rank 0 could not be read: {first_line(exc)}"
        return None, None

    def roster(self) -> list[tuple[int, int]]:
        """Every valid (rank, claim) line of the roster so far (the watchdog reads it too)."""
        return self.protocol.roster(self.size)

    # -- check-in ------------------------------------------------------------------------
    def check_in(self, payload: Mapping[str, Any], deadline: float | None = None) -> int:
        """Claim this rank and post the check-in; returns 1 when this process holds the rank, else
        its claim number (a duplicate). ``claim`` keeps the number under which it checked in."""
        deadline = self.clock() + CLAIM_GRACE_S if deadline is None else deadline
        claim, duplicate = self.protocol.check_in(self.rank, {**payload, "nonce": self.nonce}, deadline)
        self.claim, self.duplicate = claim, duplicate
        return claim if duplicate else 1

    def decide(self, decision: Mapping[str, Any]) -> None:
        """Rank 0 publishes the decision every rank follows (it alone decides in a world)."""
        self.decision = self.protocol.decide(decision, *DECISION, authority=True)

    def wait_for_checkins(self, deadline: float, settle_s: float = 0.0) -> CheckIns:
        """Rank 0: poll the roster until every rank 0..size-1 arrived or the deadline passed."""
        seen, waited = self.protocol.wait_roster(self.size, deadline, settle_s,
                                                 on_poll=lambda arrived: PROGRESS.set_ranks(arrived, self.size))
        payloads, unreadable = self.protocol.read_checkins(self.roster())
        arrivals = [Arrival(r, c, seen.get((r, c), waited)) for r, c in sorted(payloads, key=lambda k: seen.get(k, waited))]
        return CheckIns(self.size, arrivals, payloads, unreadable, waited)

    def late_claims(self, known: Iterable[tuple[int, int]]) -> tuple[dict[tuple[int, int], dict[str, Any]], dict[tuple[int, int], str]]:
        """Check-ins that arrived after the check-in phase (late duplicates), read once more."""
        known = set(known)
        fresh = [k for k in self.roster() if k not in known]
        return self.read_checkins(fresh)

    def read_checkins(self, keys: list[tuple[int, int]]) -> tuple[dict[tuple[int, int], dict[str, Any]], dict[tuple[int, int], str]]:
        return self.protocol.read_checkins(keys)

    # -- stages --------------------------------------------------------------------------
    def mark_done(self, stage: str, results: Mapping[str, Any], limit: int = MAX_MESSAGE_BYTES) -> None:
        self.put(f"results/{stage}/{self.rank}", results, limit)
        self.protocol.mark(f"done/{stage}", self.rank)

    def done_ranks(self, stage: str) -> set[int]:
        return self.protocol.marked(f"done/{stage}")

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
            delay = min(delay * 2, poll_cap(self.size))

    def results(self, stage: str, ranks: Iterable[int]) -> dict[int, Any]:
        """Each rank's posted results; a missing or malformed one reads as ``{"unreadable": why}``."""
        keys = {rank: f"results/{stage}/{rank}" for rank in sorted(set(ranks))}
        values = self.protocol.read_many(list(keys.values()), RESULTS)
        return {rank: values[key] if values[key] is not None else
                {"unreadable": f"{key}: {self.protocol.malformed.get(key, 'never posted')}"}
                for rank, key in keys.items()}

    def say_goodbye(self) -> None:
        self.protocol.acknowledge("bye")

    def wait_for_final(self, until: float) -> dict[str, Any] | None:
        """Rank 0's final word, awaited on a client of its own: the store's server wakes it (no
        polling), and this handle stays free for the rank's own flow. None when ``until`` or the
        end of the store comes first, or when the entry is malformed (noted)."""
        # torch at use, as everywhere in this module (see _tcp_store).
        from torch.distributed import PrefixStore

        left = until - self.clock()
        if left <= 0 or self.raw_store is None:
            return None
        try:
            client = PrefixStore(self.spec.namespace, self._group_store(timedelta(seconds=left), "final"))
            client.wait(["final"], timedelta(seconds=max(until - self.clock(), 0.01)))
            raw = client.get("final")
        except Exception:
            return None  # the deadline, or rank 0's store gone: nothing was said
        return self.protocol.parse("final", raw, *FINAL)

    def await_goodbyes(self, expected: int, until: float) -> None:
        """Rank 0 hosting the store: keep it up until ``expected`` others read the final word."""
        self.protocol.await_acks(expected, until, "bye")

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
        self.step = f"forming the {backend} process group (torch's init_process_group)"
        self._mark_quietly(f"pg/{backend}/entered")

        def create() -> None:
            try:
                outcome["group"] = self._create_group(backend, timeout)
                self._mark_quietly(f"pg/{backend}/formed")
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
            delay = min(delay * 2, poll_cap(self.size))
        self.step = ""
        if "error" in outcome:
            exc = outcome["error"]
            try:
                self.report_group_failure(backend, first_line(exc))
            except Exception:
                pass  # the store is gone too; the others find out by their own timeout
            try:
                exc.distdoctor_progress = self.group_progress(backend)  # which ranks got how far: the report says
            except (AttributeError, TypeError):
                pass
            raise exc
        group = outcome["group"]
        with self._lock:
            self.process_groups[backend] = group
        return group

    def _create_group(self, backend: str, timeout: timedelta) -> Any:
        # torch at use, as everywhere in this module (see _tcp_store).
        import torch.distributed as dist
        from torch.distributed import PrefixStore

        if not dist.is_initialized():
            store = PrefixStore(f"{self.spec.namespace}/pg/{backend}", self._group_store(timeout))
            dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.size, timeout=timeout)
            return dist.group.WORLD
        return dist.new_group(backend=backend, timeout=timeout)

    def _group_store(self, timeout: timedelta, name: str = "group") -> Any:
        """Another client of the same store, for the process group or the final-word watcher (any
        other store: itself); the one opened after the check-in when it is ready (store_clients)."""
        if not self._is_tcp_store():
            return self.raw_store
        return self.spares.take(name, timeout, wait_s=connect_delay(self.rank) + SPARE_WAIT_S)

    def _is_tcp_store(self) -> bool:
        # torch at use, as everywhere in this module (see _tcp_store).
        from torch.distributed import TCPStore

        return isinstance(self.raw_store, TCPStore)

    def _new_client(self, timeout: timedelta) -> Any:
        # torch at use, as everywhere in this module (see _tcp_store).
        from torch.distributed import TCPStore

        return TCPStore(self.connect_host, self.raw_store.port, is_master=False, timeout=timeout)

    def open_clients_soon(self, deadline: float) -> None:
        """After the check-in: this rank's extra clients opened in the background, at its own
        moment, so that the ranks' connects make no burst that stalls the store (store_clients)."""
        if self.raw_store is not None and self._is_tcp_store():
            self.spares.open_soon(timedelta(seconds=max(deadline - self.clock(), 1.0)))

    def _mark_quietly(self, key: str) -> None:
        try:
            self.protocol.mark(key, self.rank)
        except Exception:
            pass  # a mark is evidence for the report only; the group's own outcome decides

    def group_progress(self, backend: str, wait_s: float = 0.5) -> str:
        """How far the world got in forming this group, in words: which ranks had not started it
        (still in an earlier check, or late) and which had started but not finished. '' when the
        store cannot tell within ``wait_s`` (its client is held by a stuck call)."""
        if not self._lock.acquire(timeout=wait_s):
            return ""
        self._lock.release()
        try:
            entered = self.protocol.marked(f"pg/{backend}/entered")
            formed = self.protocol.marked(f"pg/{backend}/formed")
        except Exception:
            return ""
        everyone = set(self.decision.get("accepted") or range(self.size))
        absent, forming = sorted(everyone - entered), sorted(entered - formed)
        parts = []
        if absent:
            parts.append(f"{ranks_label(absent)} had not started forming it (still in an earlier check, or late)")
        if forming:
            parts.append(f"{ranks_label(forming)} had started and were waiting in torch's init_process_group "
                         "(store reads, then connections to every other rank)")
        if entered and not absent and not forming:
            parts.append("every rank had formed it")
        return "; ".join(parts)

    def now_doing(self) -> str:
        """What this rank's collective stage is doing now, and how far the others are: for a
        check cut off by its deadline (bounded: '' when the store cannot answer at once)."""
        step = self.step
        if not step:
            return ""
        backend = "nccl" if "nccl" in step else "gloo"
        progress = self.group_progress(backend, wait_s=0.2) if "process group" in step else ""
        return step + (f": {progress}" if progress else "")

    def report_group_failure(self, backend: str, message: str) -> None:
        self.put(f"pgfail/{backend}/{self.rank}", {"rank": self.rank, "error": message[:2000]})
        self.protocol.mark(f"pgfail/{backend}", self.rank)

    def group_failures(self, backend: str) -> dict[int, str]:
        """Other ranks that could not create this group: rank -> their error."""
        out: dict[int, str] = {}
        for rank in sorted(self.protocol.marked(f"pgfail/{backend}") - {self.rank}):
            value = self.protocol.read(f"pgfail/{backend}/{rank}", GROUP_FAILURE)
            out[rank] = str(value["error"]) if value is not None and "error" in value else "(unreadable)"
        return out

    def close(self, destroy_groups: bool = True) -> None:
        """Release the process groups and the store (rank 0's hosted store goes with it)."""
        if destroy_groups and self.process_groups and self.poisoned is None:
            try:
                # torch at use, as everywhere in this module (see _tcp_store).
                import torch.distributed as dist

                if dist.is_initialized():
                    dist.destroy_process_group()
            except Exception:
                pass
        self.process_groups.clear()
        self.spares.discard()
        self.store = None
        self.raw_store = None

