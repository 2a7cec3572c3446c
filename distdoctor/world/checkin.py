"""The one check-in protocol over a c10d store: claim, post, roster, decision, final word; every read validated, every wait bounded.

Used by the world (distdoctor.world.store_exchange), the bounded init
(distdoctor.embedded.bounded_init) and preflight (distdoctor.embedded.preflight). Keys, relative
to the store (a PrefixStore gives each user its namespace):

- ``claim/<rank>``           a counter each process claiming the rank adds 1 to;
- ``checkin/<rank>/<claim>`` that process's check-in (a JSON object), set before...
- ``roster``                 ...its line ``rank:claim;`` is appended, so every roster line names
                             a check-in that already exists (one read of the roster per poll);
- ``decision``               the verdict every process acts on: set with compare_set, so the first
                             valid proposal wins (rank 0's, or a rank that gave up first), unless
                             the decider is the only authority (the world's rank 0 sets it);
- ``final``                  the last word (the world's exit code), and ``ack/<what>`` counters
                             of processes that read a verdict or the final word.

The c10d store has no authentication: any process that reaches MASTER_PORT can write any key.
So nothing read here is trusted. Every value is parsed against a schema with size bounds (ASCII
digits only, ranks and claims bounded, JSON objects with typed fields); an entry that does not
fit is recorded in ``malformed`` (the key and why), never raised, and the protocol goes on with
what is valid. A roster line without its check-in is waited on until the deadline, not read with
a blocking get. A claim counter that says "someone claimed this rank before" counts only when
that earlier claimant actually checked in. See docs/crossrank.md (threat model).
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

from distdoctor.world.store_api import keys_exist

# A check-in carries findings and a snapshot; 64 KiB is ~10x a typical one, and keeps a
# 1024-rank gather under 64 MiB even when every rank is at the bound.
MAX_MESSAGE_BYTES = 64 * 1024
# Polling back-off for waits: quick first answers on a healthy world, little load on a slow one.
POLL_FIRST_S, POLL_MAX_S = 0.005, 0.1


def poll_cap(size: int) -> float:
    """The longest pause between two polls in a world of ``size`` ranks. Every rank polls the one
    store: a small world can poll often (its answers come sooner: a 2-rank self-test waited up
    to 0.1 s per phase), a large one backs off to POLL_MAX_S so the store's load stays bounded."""
    if size <= 0:  # not known: back off fully
        return POLL_MAX_S
    return min(POLL_MAX_S, max(POLL_FIRST_S, 0.005 * size))
# Ranks and claim numbers in keys and roster lines: ASCII digits, bounded (int() of 5000 digits
# raises, and "²".isdigit() is True in Python).
MAX_RANK = 1 << 20
MAX_CLAIM = 1 << 31
_RANK = re.compile(r"[0-9]{1,7}", re.ASCII)
_DIGITS = re.compile(rb"-?[0-9]+")
_ROSTER_LINE = re.compile(r"([0-9]{1,7}):([0-9]{1,10})", re.ASCII)
# How many distinct roster lines rank 0 tracks: every process of the world, plenty of
# duplicates and out-of-range ranks; more than that cannot come from one job.
ROSTER_SLACK = 256
MAX_CLAIMS_TRACKED = 64
# How long a process with claim > 1 waits for an earlier claimant's check-in before it decides
# the counter was bumped by something that never checked in (then it is the first claimant).
CLAIM_GRACE_S = 2.0
# At most this many malformed keys are kept by name (the count goes on).
MAX_NOTED = 20


class StoreGone(Exception):
    """The store stopped answering (its host ended): the caller reports what it knows."""


class Prefixed:
    """Any c10d-store-like object seen under a key prefix (torch's PrefixStore needs a torch Store;
    this also takes the test doubles, and keeps torch off the import path)."""

    def __init__(self, store: Any, prefix: str) -> None:
        self.inner, self.prefix = store, prefix

    def set(self, key: str, value: Any) -> None:
        self.inner.set(self.prefix + key, value)

    def get(self, key: str) -> Any:
        return self.inner.get(self.prefix + key)

    def add(self, key: str, amount: int) -> int:
        return self.inner.add(self.prefix + key, amount)

    def append(self, key: str, value: Any) -> None:
        self.inner.append(self.prefix + key, value)

    def check(self, keys: list[str]) -> bool:
        return self.inner.check([self.prefix + k for k in keys])

    def multi_get(self, keys: list[str]) -> list[Any]:
        return self.inner.multi_get([self.prefix + k for k in keys])

    def compare_set(self, key: str, expected: Any, desired: Any) -> Any:
        return self.inner.compare_set(self.prefix + key, expected, desired)


# -- schemas ------------------------------------------------------------------------------------
Validator = Callable[[Any], bool]


def integer(lo: int, hi: int) -> Validator:
    return lambda v: type(v) is int and lo <= v <= hi


def text(limit: int) -> Validator:
    return lambda v: isinstance(v, str) and len(v) <= limit


def optional(ok: Validator) -> Validator:
    return lambda v: v is None or ok(v)


def list_of(ok: Validator, limit: int) -> Validator:
    return lambda v: isinstance(v, list) and len(v) <= limit and all(ok(x) for x in v)


def obj(fields: Mapping[str, Validator] | None = None, required: Sequence[str] = ()) -> Validator:
    return lambda v: invalid(v, fields or {}, required) is None


def number(v: Any) -> bool:
    return type(v) in (int, float)


def boolean(v: Any) -> bool:
    return type(v) is bool


def invalid(value: Any, fields: Mapping[str, Validator], required: Sequence[str] = ()) -> str | None:
    """Why ``value`` does not fit the schema (a JSON object with these typed fields), or None."""
    if not isinstance(value, dict):
        return f"not a JSON object but {type(value).__name__}"
    for name in required:
        if name not in value:
            return f"it lacks {name!r}"
    for name, ok in fields.items():
        if name in value and not ok(value[name]):
            return f"{name!r} has the wrong type or size ({_short(value[name])})"
    return None


def _short(value: Any) -> str:
    raw = repr(value)
    return raw if len(raw) <= 60 else raw[:57] + "..."


RANK_FIELD = integer(-MAX_RANK, MAX_RANK)
SMALL_INT = optional(integer(-MAX_RANK, MAX_RANK))
FINDING = obj({"id": text(64), "title": text(4096), "ranks": optional(list_of(RANK_FIELD, MAX_RANK))}, ("id",))
CHECK_ENTRY = obj({"name": text(256), "stage": text(32), "status": text(32), "reason": optional(text(4096)),
                   "duration_s": optional(number)}, ("name",))
FINDINGS = list_of(FINDING, 10_000)
CHECKS = list_of(CHECK_ENTRY, 10_000)
SNAPSHOT = obj({"torch": optional(obj({"backends": optional(obj())})), "launcher": optional(obj())})
# What every user of the protocol may put in a check-in; unknown fields pass untouched.
CHECKIN = {
    "rank": RANK_FIELD, "claim": integer(1, MAX_CLAIM), "nonce": text(64), "host": optional(text(256)),
    "pid": SMALL_INT, "world_size": SMALL_INT, "node_rank": SMALL_INT, "local_rank": SMALL_INT,
    "local_world_size": SMALL_INT, "device": optional(obj({"index": integer(0, 4096)})),
    "snapshot": optional(SNAPSHOT), "findings": optional(FINDINGS), "checks": optional(CHECKS),
    "blocked": optional(text(4096)),
    # What torch's C++ layer wrote on this rank so far (world.native_output), and how long the
    # rank took from its start to its check-in (world.stage_deadline).
    "native": optional(obj()), "startup_s": optional(number),
}
# The verdict of the bounded init and preflight: ok, or why not.
VERDICT = ({"ok": boolean, "findings": FINDINGS, "arrived": list_of(RANK_FIELD, MAX_RANK)}, ("ok",))
FINAL = ({"exit": integer(0, 255), "claims": list_of(text(32), MAX_RANK)}, ("exit",))


# -- the protocol -------------------------------------------------------------------------------
class CheckInProtocol:
    """One process's side of the check-in over ``store`` (thread-safe through ``lock``)."""

    def __init__(self, store: Any, *, size: int = 0, lock: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        # The world's size as this process knows it: roster lines of ranks below it are the world's.
        self.size = size
        self.lock = lock if lock is not None else threading.Lock()
        self.clock = clock
        # key -> why it was refused (a foreign or corrupted writer); the count goes beyond.
        self.malformed: dict[str, str] = {}
        self.malformed_count = 0
        self._roster_len = 0
        self._roster: dict[tuple[int, int], None] = {}
        self._verified: set[tuple[int, int]] = set()
        self._dangling: set[tuple[int, int]] = set()
        self._outside = 0
        # Valid check-ins already read (a malformed one is read again: the real one may replace it).
        self._payloads: dict[tuple[int, int], dict[str, Any]] = {}
        # The roster is parsed incrementally; the watchdog's thread reads it too.
        self._roster_lock = threading.Lock()

    # -- primitives ------------------------------------------------------------------------
    def note(self, key: str, why: str) -> None:
        if key in self.malformed:
            return
        self.malformed_count += 1
        if len(self.malformed) < MAX_NOTED:
            self.malformed[key] = why[:300]

    def _do(self, method: str, *args: Any) -> Any:
        with self.lock:
            return getattr(self.store, method)(*args)

    def set(self, key: str, value: Any, limit: int = MAX_MESSAGE_BYTES) -> None:
        self._do("set", key, encode(value, limit))

    def exists(self, key: str) -> bool:
        return self.all_exist([key])

    def all_exist(self, keys: Sequence[str]) -> bool:
        """Whether every key exists (never waits; see store_api for a torch without Store.check)."""
        with self.lock:
            return keys_exist(self.store, keys)

    def read(self, key: str, fields: Mapping[str, Validator] | None = None, required: Sequence[str] = (),
             limit: int = MAX_MESSAGE_BYTES) -> dict[str, Any] | None:
        """The JSON object under ``key`` if it exists and fits the schema; None otherwise (noted)."""
        if not self.exists(key):
            return None
        return self.parse(key, self._do("get", key), fields, required, limit)

    def read_many(self, keys: Sequence[str], fields: Mapping[str, Validator] | None = None,
                  required: Sequence[str] = ()) -> dict[str, dict[str, Any] | None]:
        """Several JSON objects with one request when they all exist (a missing one: None, never waited on)."""
        if not keys:
            return {}
        if self.all_exist(keys):
            raws = self._do("multi_get", list(keys))
            return {k: self.parse(k, raw, fields, required) for k, raw in zip(keys, raws)}
        return {k: self.read(k, fields, required) for k in keys}

    def parse(self, key: str, raw: Any, fields: Mapping[str, Validator] | None, required: Sequence[str] = (),
              limit: int = MAX_MESSAGE_BYTES) -> dict[str, Any] | None:
        why = None
        try:
            value = decode(raw, limit)
            why = invalid(value, fields or {}, required)
        except ValueError as exc:
            why = str(exc)
        if why is not None:
            self.note(key, why)
            return None
        return value

    def counter(self, key: str, by: int = 0) -> int | None:
        """A counter's value after adding ``by``; None when the entry is not a counter (noted).

        The value is read before it is added to: torch's store server answers an add to a
        non-number by dropping the connection, which would cost this process its store.
        """
        if self.exists(key):
            raw = self._do("get", key)
            if not (0 < len(raw) <= 10 and _DIGITS.fullmatch(raw)):
                self.note(key, f"not a counter ({_short(raw)})")
                return None
        value = int(self._do("add", key, by))
        if not 0 <= value <= MAX_CLAIM:
            self.note(key, f"a counter out of range ({value})")
            return None
        return value

    # -- claim and post --------------------------------------------------------------------
    def check_in(self, rank: int, payload: Mapping[str, Any], deadline: float) -> tuple[int, bool]:
        """Claim ``rank``, post the check-in, list it in the roster; returns (claim, duplicate).

        A duplicate is a process whose rank an earlier claimant holds; a claim counter bumped
        by something that never checked in does not make this process a duplicate.
        """
        claim = self.counter(f"claim/{rank}", 1)
        if claim is None:
            # The counter was overwritten with something else: every process of this rank falls
            # back to the same second counter.
            claim = self.counter(f"claim/{rank}/fallback", 1) or 1
        self.set(f"checkin/{rank}/{claim}", {**payload, "rank": rank, "claim": claim})
        self._do("append", "roster", f"{rank}:{claim};")
        if claim == 1:
            return claim, False
        return claim, self._earlier_claimant(rank, claim, min(deadline, self.clock() + CLAIM_GRACE_S))

    def _earlier_claimant(self, rank: int, claim: int, until: float) -> bool:
        delay = POLL_FIRST_S
        while True:
            earlier = [(r, c) for r, c in self.roster() if r == rank and c < claim]
            payloads, _ = self.read_checkins(earlier)
            if payloads:
                return True
            left = until - self.clock()
            if left <= 0:
                self.note(f"claim/{rank}", f"counted {claim - 1} claim(s) before this process, "
                                           "but no earlier claimant checked in")
                return False
            time.sleep(min(delay, left))
            delay = min(delay * 2, poll_cap(self.size))

    # -- the roster ------------------------------------------------------------------------
    def roster(self, expected: int = 0) -> list[tuple[int, int]]:
        """Every valid roster line so far (rank, claim), in order of arrival, deduplicated.

        The roster only grows, so each read parses just the new text. Lines that are not
        ``<digits>:<digits>`` within the bounds, and lines beyond what one job can write, are noted.
        """
        with self._roster_lock:
            return self._read_roster(max(expected, self.size))

    def _read_roster(self, expected: int) -> list[tuple[int, int]]:
        if not self.exists("roster"):
            return list(self._roster)
        raw = self._do("get", "roster")
        if len(raw) < self._roster_len:
            self.note("roster", "the roster shrank: something overwrote it")
            self._roster_len = 0
        fresh = raw[self._roster_len:]
        cut = fresh.rfind(b";") + 1  # a line still being appended is read next time
        self._roster_len += cut
        bad = 0
        for item in fresh[:cut].split(b";"):
            if not item:
                continue
            match = _ROSTER_LINE.fullmatch(item.decode("latin-1"))
            if match is None or int(match.group(2)) < 1 or int(match.group(2)) > MAX_CLAIM:
                bad += 1
                continue
            entry = (int(match.group(1)), int(match.group(2)))
            if entry not in self._roster:
                # Bounded per rank of the world, and for ranks outside it, so a flood of lines
                # can never push a real rank's line out.
                # (a rank of the world: its claims 1..MAX_CLAIMS_TRACKED, whatever came first;
                # ranks outside it: the first ROSTER_SLACK lines).
                if entry[0] < expected:
                    if entry[1] > MAX_CLAIMS_TRACKED:
                        bad += 1
                        continue
                elif self._outside >= ROSTER_SLACK:
                    bad += 1
                    continue
                else:
                    self._outside += 1
                self._roster[entry] = None
        if bad:
            self.note("roster", f"{bad} line(s) that are not 'rank:claim;' within the bounds "
                                "(or beyond the lines one job can write)")
        return list(self._roster)

    def wait_roster(self, size: int, deadline: float, settle_s: float = 0.0,
                    on_poll: Callable[[int], None] | None = None) -> tuple[dict[tuple[int, int], float], float]:
        """Rank 0: poll until ranks 0..size-1 checked in (roster line and a valid check-in) or
        the deadline passed; returns ((rank, claim) -> seconds after the start, seconds waited).

        ``settle_s`` keeps listening that long after the last expected rank arrived, so that a
        second process claiming a rank moments later is still seen. ``on_poll`` hears how many
        ranks of the world have arrived after each poll (a progress line).
        """
        start = self.clock()
        seen: dict[tuple[int, int], float] = {}
        delay = POLL_FIRST_S
        complete_at: float | None = None
        while True:
            payloads, _ = self.read_checkins(self.roster(size))
            for entry in payloads:
                seen.setdefault(entry, self.clock() - start)
            now = self.clock()
            have = {r for r, _ in seen}
            if on_poll is not None:
                on_poll(sum(1 for r in have if 0 <= r < size))
            if all(r in have for r in range(size)):
                complete_at = complete_at if complete_at is not None else now
                if now - complete_at >= settle_s:
                    break
            if now >= deadline:
                break
            time.sleep(max(min(delay, deadline - now), 0))
            delay = min(delay * 2, poll_cap(self.size))
        return seen, self.clock() - start

    def _present(self, entries: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The roster lines whose check-in exists. A genuine line is appended after its check-in
        was set, over the same connection, so a line without one is never waited on: it is noted
        once and left out."""
        fresh = [e for e in entries if e not in self._verified and e not in self._dangling]
        if fresh and self.all_exist([f"checkin/{r}/{c}" for r, c in fresh]):
            self._verified.update(fresh)
        else:
            for r, c in fresh:
                if self.exists(f"checkin/{r}/{c}"):
                    self._verified.add((r, c))
                else:
                    self._dangling.add((r, c))
                    self.note(f"checkin/{r}/{c}", "the roster names this check-in, but it was never posted")
        return [e for e in entries if e in self._verified]

    def read_checkins(self, keys: Iterable[tuple[int, int]]) -> tuple[dict[tuple[int, int], dict[str, Any]], dict[tuple[int, int], str]]:
        """The check-ins under these (rank, claim) keys: valid payloads, and why the others are not."""
        keys = self._present(list(keys))
        unreadable: dict[tuple[int, int], str] = {}
        todo = [k for k in keys if k not in self._payloads]
        raws = self._do("multi_get", [f"checkin/{r}/{c}" for r, c in todo]) if todo else []
        for (rank, claim), raw in zip(todo, raws):
            key = f"checkin/{rank}/{claim}"
            value = self.parse(key, raw, CHECKIN)
            if value is not None and (value.get("rank", rank), value.get("claim", claim)) != (rank, claim):
                self.note(key, f"it says rank {value.get('rank')} claim {value.get('claim')}")
                value = None
            if value is None:
                unreadable[(rank, claim)] = f"{key}: {self.malformed.get(key, 'malformed')}"
            else:
                self._payloads[(rank, claim)] = value
        return {k: self._payloads[k] for k in keys if k in self._payloads}, unreadable

    # -- decision and final word -----------------------------------------------------------
    def decide(self, proposal: Mapping[str, Any], fields: Mapping[str, Validator], required: Sequence[str] = (),
               authority: bool = False) -> dict[str, Any]:
        """Publish ``proposal`` as the decision unless a valid one is there already; returns the one
        that holds. ``authority``: this process alone decides (the world's rank 0) and overwrites."""
        body = encode(dict(proposal))
        if authority:
            self._do("set", "decision", body)
            return dict(proposal)
        raw = self._do("compare_set", "decision", "", body)
        held = self.parse("decision", raw, fields, required)
        if held is None:
            self._do("set", "decision", body)  # the malformed value is replaced, not obeyed
            return dict(proposal)
        return held

    def wait_for(self, schemas: Mapping[str, tuple[Mapping[str, Validator], Sequence[str]]],
                 deadline: float) -> tuple[str | None, dict[str, Any] | None]:
        """(key, value) of the first of these keys to hold a valid value; (None, None) at the deadline.

        A malformed value is noted and waited past (its writer may be overwritten by the real one).
        Raises StoreGone when the store stops answering.
        """
        delay = POLL_FIRST_S
        bad: dict[str, Any] = {}
        while True:
            try:
                for key, (fields, required) in schemas.items():
                    if not self.exists(key):
                        continue
                    raw = self._do("get", key)
                    if bad.get(key) == raw:
                        continue
                    value = self.parse(key, raw, fields, required)
                    if value is not None:
                        return key, value
                    bad[key] = raw
            except (RuntimeError, OSError) as exc:  # torch's DistNetworkError / DistStoreError
                raise StoreGone(first_line(exc)) from None
            left = deadline - self.clock()
            if left <= 0:
                return None, None
            time.sleep(min(delay, left))
            delay = min(delay * 2, poll_cap(self.size))

    # -- lists of ranks and acknowledgements ----------------------------------------------
    def mark(self, key: str, rank: int) -> None:
        self._do("append", key, f"{rank};")

    def marked(self, key: str) -> set[int]:
        """The ranks appended to ``key`` (``rank;`` lines); malformed lines are noted."""
        if not self.exists(key):
            return set()
        out: set[int] = set()
        bad = 0
        for item in self._do("get", key).split(b";"):
            if item and _RANK.fullmatch(item.decode("latin-1")):
                out.add(int(item))
            elif item:
                bad += 1
        if bad:
            self.note(key, f"{bad} line(s) that are not 'rank;'")
        return out

    def acknowledge(self, key: str = "ack") -> None:
        self.counter(key, 1)

    def await_acks(self, expected: int, until: float, key: str = "ack") -> bool:
        """Keep going (bounded) until ``expected`` processes acknowledged; whether they did."""
        delay = POLL_FIRST_S
        while True:
            try:
                count = self.counter(key)
            except Exception:
                return False  # the store is gone: nobody is left to read
            if count is None or count >= expected:
                return count is not None
            left = until - self.clock()
            if left <= 0:
                return False
            time.sleep(min(delay, left))
            delay = min(delay * 2, poll_cap(self.size))


# -- wire format ------------------------------------------------------------------------------
def encode(value: Any, limit: int = MAX_MESSAGE_BYTES) -> bytes:
    raw = json.dumps(value, separators=(",", ":"), default=str).encode("utf-8")
    if len(raw) > limit:
        raise ValueError(f"message of {len(raw)} bytes exceeds the {limit}-byte bound")
    return raw


def decode(raw: bytes | str, limit: int = MAX_MESSAGE_BYTES) -> Any:
    """Parse a message from another process; an oversized or malformed one raises ValueError."""
    if len(raw) > limit:
        raise ValueError(f"message of {len(raw)} bytes exceeds the {limit}-byte bound")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"not valid JSON: {str(exc)[:120]}") from None


def parse_roster(text: str) -> list[tuple[int, int]]:
    """The valid ``rank:claim;`` lines of a roster (the watchdog's quick read)."""
    out = []
    for item in text.split(";"):
        match = _ROSTER_LINE.fullmatch(item.strip())
        if match is not None and 1 <= int(match.group(2)) <= MAX_CLAIM:
            out.append((int(match.group(1)), int(match.group(2))))
    return out


def first_line(exc: BaseException) -> str:
    message = str(exc).strip()
    return message.splitlines()[0][:300] if message else type(exc).__name__


def malformed_finding(protocol: CheckInProtocol, rank: int, kind: Any, check: str | None = None) -> Any:
    """The finding naming the malformed store entries this process met (None when there were none)."""
    if not protocol.malformed_count:
        return None
    keys = list(protocol.malformed)
    more = protocol.malformed_count - len(keys)
    listed = "; ".join(f"{k}: {why}" for k, why in protocol.malformed.items())
    extra: dict[str, Any] = {"check": check} if check else {}
    return kind(
        f"{protocol.malformed_count} store entr{'y' if protocol.malformed_count == 1 else 'ies'} "
        f"refused as malformed ({', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''})",
        detail=f"Rank {rank} read entries that no distdoctor process writes: {listed}"
        + (f" (and {more} more)" if more > 0 else "")
        + ". They were ignored; the run went on with the valid entries.",
        ranks=(rank,),
        data={"keys": keys, "count": protocol.malformed_count},
        **extra,
    )
