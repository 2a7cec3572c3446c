"""When every rank waits: whether point-to-point waits can ever match, and whether a collective still moves data."""

# Every rank waiting is "cannot finish" only with proof (diagnosis.diagnose names it):
#   - point-to-point waits are followed from each rank to its peer, its peer's peer ...: a cycle (two
#     ranks receiving from each other, 0 -> 1 -> 2 -> 0) or a peer waiting in a collective is a
#     deadlock; a send and the receive that matches it are not, however slow (they are judged like
#     one collective); without peers (py-spy's stacks) only every rank receiving, or every rank
#     sending, is a deadlock;
#   - a collective every rank is in is slow, not stuck, when a rank's backend connections received data
#     within half the stall (1-60 s); it is stuck only when every rank's connections were read
#     (diagnosis.snapshot.Transport: the guard's TCP_INFO, read for the stalled group's own backend)
#     and none received data for at least PROOF_FLOOR_S (or half the stall, when longer), and every
#     rank has been in it that long (the last one may have just arrived). In between nothing is
#     proven: a link that drops packets for a few seconds and then passes them is silent for longer
#     than the outage (TCP retransmits after 0.2 s, then 0.4, 0.8, 1.6 ... s: the first data after an
#     outage of T s arrives up to about T s later), and ending such a job would end one that finishes.

from __future__ import annotations

from typing import Sequence

from distdoctor.core.report import format_ranks
from distdoctor.diagnosis.snapshot import PendingOp, Transport

# Calls that need one matching peer, not the whole group.
POINT_TO_POINT = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list",
                            "recv_object_list", "_coalesced"})
_BOTH_WAYS = frozenset({"batch_isend_irecv", "_coalesced"})

# Point-to-point waits: can they complete?
DEADLOCK, MATCHED, UNKNOWN_WAITS = "deadlock", "matched", "unknown"
# A collective every rank is in: what their connections say.
MOVING, STUCK, UNKNOWN_MOTION = "moving", "stuck", "unknown"


# -- point-to-point waits -------------------------------------------------------------------------

def direction(op: PendingOp) -> str:
    return "both" if op.op in _BOTH_WAYS else "recv" if op.receives else "send"


def p2p_waits(waits: dict[int, PendingOp | None]) -> tuple[str, list[str]]:
    """Whether point-to-point waits can complete: DEADLOCK (each line names waits no peer can match:
    a cycle, a peer waiting in a collective, every rank receiving or every rank sending), MATCHED
    (every chain of waits ends in a send and a receive that match: slow, not stuck) or UNKNOWN_WAITS."""
    verdict, lines, involved = MATCHED, [], set()
    for rank in sorted(waits):
        op = waits[rank]
        if op is None or op.op not in POINT_TO_POINT or rank in involved:
            continue
        found, line, ranks = _chain(rank, waits)
        if found == DEADLOCK:
            verdict = DEADLOCK
            involved |= ranks
            lines.append(line)
        elif found == UNKNOWN_WAITS and verdict == MATCHED:
            verdict = UNKNOWN_WAITS
    ops = [op for op in waits.values() if op is not None]
    directions = {direction(op) for op in ops if op.op in POINT_TO_POINT}
    if verdict != DEADLOCK and len(waits) > 1 and len(ops) == len(waits) \
            and all(op.op in POINT_TO_POINT for op in ops) and directions in ({"recv"}, {"send"}):
        verb, other = ("receives", "sends") if directions == {"recv"} else ("sends", "receives")
        return DEADLOCK, [f"every rank {verb} and none {other}: no call can match"]
    return verdict, lines


def _chain(rank: int, waits: dict[int, PendingOp | None]) -> tuple[str, str, set[int]]:
    """Follow the waits from ``rank`` to its peer, its peer's peer ...: (where the chain ends, the
    line that says why it cannot complete, the ranks in it)."""
    seen, current = [rank], rank
    while True:
        op = waits[current]
        assert op is not None
        peer = op.peer
        other = waits.get(peer) if peer is not None else None
        if other is None:
            return UNKNOWN_WAITS, "", set(seen)
        pair = f"rank {current} waits in {op.describe()} while rank {peer} waits in {other.describe()}: neither can complete"
        if other.op not in POINT_TO_POINT:
            return DEADLOCK, pair, {current, peer}
        if other.peer == current:
            ways = {direction(op), direction(other)}
            return (MATCHED, "", set(seen)) if ways == {"send", "recv"} or "both" in ways else (DEADLOCK, pair, {current, peer})
        if other.peer is None:
            return UNKNOWN_WAITS, "", set(seen)
        if peer in seen:
            cycle = seen[seen.index(peer):] + [peer]
            return DEADLOCK, "ranks " + " -> ".join(map(str, cycle)) + " each wait for the next: a cycle no send breaks", set(cycle)
        seen.append(peer)
        current = peer


# -- a collective every rank is in ----------------------------------------------------------------

# No data for this long is the least that proves a collective stuck: TCP's retransmission backoff
# (from 200 ms, doubling) leaves a connection silent for up to about as long as the outage it
# recovers from, so an outage of up to ~15 s, and the silence after it, fit inside it.
PROOF_FLOOR_S = 30.0


def motion_window_s(waited_s: float | None) -> float:
    """How recently a connection must have received data for the collective to count as moving: half
    the stall, at least 1 s and at most 60 s (a slow link's chunk)."""
    return min(60.0, max(1.0, (waited_s or 2.0) / 2))


def proof_window_s(waited_s: float | None) -> float:
    """How long every rank's connections must have received nothing (and every rank been in the
    collective) for it to count as stuck: the motion window, at least PROOF_FLOOR_S."""
    return max(PROOF_FLOOR_S, motion_window_s(waited_s))


def motion(ranks: Sequence[tuple[int, PendingOp | None, Transport | None]], waited_s: float | None) -> tuple[str, str]:
    """(MOVING | STUCK | UNKNOWN_MOTION, the evidence in words; "" when no rank's source reads it) for
    the waiting ranks, each as (rank, the op it waits in, its connections)."""
    window, proof = motion_window_s(waited_s), proof_window_s(waited_s)
    read = [(r, op, t) for r, op, t in ranks if t is not None and t.idle_s is not None]
    moving = [(r, t) for r, _, t in read if t.idle_s < window]
    if moving:
        rank, seen = min(moving, key=lambda m: m[1].idle_s)
        carried = f", {_size(seen.bytes)} so far" if seen.bytes is not None else ""
        return MOVING, (f"it still moves data: rank {rank}'s connections received data {seen.idle_s:.1f} s "
                        f"ago{carried} (data received within {window:.0f} s counts as moving)")
    if read and len(read) == len(ranks):
        idle = min(t.idle_s for _, _, t in read)
        if idle < proof:
            return UNKNOWN_MOTION, (f"no rank's connections received data for {idle:.1f} s: not yet proof that it is "
                                    f"stuck ({proof:.0f} s without data is; TCP's retransmission backoff after a "
                                    "link's outage is silent that long and then delivers)")
        recent = [(r, op.age_s if op else None) for r, op, _ in ranks if op is None or op.age_s is None or op.age_s < proof]
        if recent:  # the last rank may have just arrived: its data may not have reached anyone yet
            rank, age = recent[0]
            since = f"entered it {age:.1f} s ago" if age is not None else "is in it since a time not known"
            return UNKNOWN_MOTION, (f"no rank's connections received data for {idle:.1f} s, but rank {rank} {since}: "
                                    "too recently to tell a stuck collective from one that is starting")
        return STUCK, (f"nothing moves: no rank's connections received data for {idle:.1f} s (every rank's connections "
                       f"read; {proof:.0f} s without data counts as stuck)")
    unread = [(r, t) for r, _, t in ranks if t is None or t.idle_s is None]
    notes = sorted({t.note for _, t in unread if t is not None and t.note})
    if len(unread) == len(ranks) and not notes:
        return UNKNOWN_MOTION, ""
    return UNKNOWN_MOTION, (f"whether it still moves data could not be read on rank{'s' if len(unread) > 1 else ''} "
                            f"{format_ranks([r for r, _ in unread])}" + (f" ({'; '.join(notes)[:300]})" if notes else ""))


def _size(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 100_000 else f"{count} bytes"
