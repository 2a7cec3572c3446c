"""The guard's verdict on a stuck or failed job: diagnosis.diagnose over every rank's snapshot."""

# One diagnosis for the whole job (diagnosis.diagnose, job.* findings). The guard adds only what
# a snapshot cannot carry: the point-to-point Works a rank dropped without wait(), from its own
# Work tracking.
#   - A dropped send is paired with a receive only as gloo pairs them: the same group, the same two
#     ranks, the same tag, and the same place in order (the i-th send from S to R with tag T meets R's
#     i-th receive from S with tag T: record.Recorder.next_p2p_seq numbers both). A receive that waits
#     in exactly that place waits for the dropped send. On gloo that send never arrives (measured on
#     torch 2.13: a send whose Work is garbage-collected before the receive is posted is never
#     delivered, and the receive raises at the group's timeout; docs/findings/guard.md): guard.E009,
#     which ends the job. On another backend the send may still complete (NCCL keeps it on its
#     stream): the same finding, not proven, watched.
#   - A receive from any source cannot be paired (which send it takes is not fixed), nor can a
#     receive of a rank that ever received from any source with that tag, nor a place whose numbering
#     was not kept (MAX_P2P_KEYS): never guard.E009.
#   - A dropped send that no receive waits for and none took yet (the receiver's count for that peer
#     and tag is not past it) is a leak: guard.W013, a warning beside the look's verdict, never the
#     reason to end a job. One that a receive took completed (or left that receive to wait, where it is
#     paired when it waits).

from __future__ import annotations

from typing import Any, Mapping

from distdoctor.core.findings import Finding
from distdoctor.core.rank_groups import MAX_LINES
from distdoctor.diagnosis.snapshot import RankSnapshot
from distdoctor.embedded.guard import findings as gf
from distdoctor.embedded.guard.record import CallRecord

RECEIVES = ("recv", "irecv", "recv_object_list")
SENDS = ("send", "isend", "send_object_list")


def _tag(record: CallRecord) -> int:
    tag = record.params.get("tag", 0)
    return tag if isinstance(tag, int) else 0


def _label(record: CallRecord) -> str:
    """'isend #0 to rank 1 (tag 7)': the call and its place in order (the tag when not 0)."""
    return record.label() + (f" (tag {_tag(record)})" if _tag(record) else "")


def _receive_counts(state: Any) -> tuple[dict[tuple, int], bool]:
    """((group, peer, tag) -> receives issued, whether every key is listed) from a rank's answer."""
    raw = state.get("receives") if isinstance(state, dict) else None
    counts: dict[tuple, int] = {}
    for item in (raw or {}).get("counts", ()) if isinstance(raw, dict) else ():
        if isinstance(item, (list, tuple)) and len(item) == 4 and isinstance(item[3], int):
            counts[(str(item[0]), item[1], item[2])] = item[3]
    return counts, bool(isinstance(raw, dict) and raw.get("complete"))


def _dropped_sends(state: Any) -> list[tuple[CallRecord, dict]]:
    out = []
    for raw in (state.get("dropped") or ()) if isinstance(state, dict) else ():
        if isinstance(raw, dict) and str(raw.get("op")) in SENDS:
            out.append((CallRecord.from_dict(raw), raw))
    return out


def _waiting_receives(state: Any) -> list[CallRecord]:
    running = (state.get("running") or ()) if isinstance(state, dict) else ()
    return [c for c in (CallRecord.from_dict(r) for r in running if isinstance(r, dict)) if c.op in RECEIVES]


def _pairing(sent: CallRecord, sender: int, receiver: int, state: Any) -> tuple[CallRecord | None, str]:
    """(the receive of ``receiver`` that waits for the dropped send, or None; why it cannot be paired,
    when it cannot: "" when nothing of it waits)."""
    tag, counts = _tag(sent), _receive_counts(state)
    for call in _waiting_receives(state):
        if call.group != sent.group or _tag(call) != tag:
            continue
        if call.params.get("peer") == "any":
            return None, f"rank {receiver} waits in {call.summary()} from any source: which send it takes cannot be told"
        if call.params.get("peer") != sender or call.seq != sent.seq:
            continue
        if sent.seq < 0:
            return None, "their places in order were not counted (too many peers and tags)"
        known, complete = counts
        if (sent.group, "any", tag) in known or not (complete or (sent.group, sender, tag) in known):
            return None, (f"rank {receiver} received from any source with tag {tag}, or its receives were not all "
                          "counted: which send each receive took cannot be told")
        return call, ""
    return None, ""


def _received(sent: CallRecord, sender: int, state: Any) -> bool | None:
    """Whether the receiver issued a receive for this send's place (None: its counts do not say)."""
    known, complete = _receive_counts(state)
    count = known.get((sent.group, sender, _tag(sent)))
    if count is None:
        return False if complete else None
    return count > sent.seq


def p2p_drops(states: Mapping[int, Any]) -> tuple[Finding | None, list[Finding]]:
    """(a receive waiting for a send its peer dropped: guard.E009, proven only on gloo; the dropped sends
    no receive waits for: one guard.W013) from every rank's answer."""
    paired: Finding | None = None
    leaks: list[tuple[int, CallRecord, dict, str]] = []
    for sender, state in sorted(states.items()):
        for sent, raw in _dropped_sends(state):
            receiver = sent.params.get("peer")
            other = states.get(receiver) if isinstance(receiver, int) else None
            if not isinstance(other, dict) or other.get("absent") or receiver == sender:
                continue  # its receiver was not heard from: nothing is said of it
            call, why = _pairing(sent, sender, receiver, other)
            if call is not None:
                paired = paired or _paired(sender, receiver, sent, raw, call)
            elif _received(sent, sender, other) is False:
                leaks.append((sender, sent, raw, why))
    return paired, ([_leak(leaks)] if leaks else [])


def _paired(sender: int, receiver: int, sent: CallRecord, raw: dict, call: CallRecord) -> Finding:
    backend = raw.get("backend")
    proven = backend == "gloo"
    consequence = ("on gloo a send whose Work is dropped before its receive is posted never arrives" if proven else
                   f"on backend {backend or 'not known'} a dropped Work's send may still complete: not proven stuck")
    title = (f"Rank {sender} dropped {_label(sent)} at {sent.site} without wait(); rank {receiver} waits in "
             f"{_label(call)} for it")
    detail = (f"rank {sender} issued {sent.summary()} {raw.get('age_s', '?')} s ago and dropped its Work; rank {receiver} "
              f"waits in {call.summary()}, the receive that takes that send (same group, tag and place in order): "
              f"{consequence}")
    return gf.DROPPED(title, detail=detail, ranks=[sender], check=gf.CHECK,
                      data={"send": sent.to_dict(), "receive": call.to_dict(), "backend": backend, "proven": proven})


def _leak(leaks: list[tuple[int, CallRecord, dict, str]]) -> Finding:
    oldest = max(leaks, key=lambda item: float(item[2].get("age_s") or 0.0))
    sender, sent, raw, _ = oldest
    receiver = sent.params.get("peer")
    more = f" (and {len(leaks) - 1} more dropped sends)" if len(leaks) > 1 else ""
    title = (f"Rank {sender} dropped {_label(sent)} at {sent.site}, {raw.get('age_s', '?')} s ago; no receive waits "
             f"for it{more}")
    lines = [f"rank {s} dropped {_label(c)} at {c.site}, {r.get('age_s', '?')} s ago"
             + (f" ({why})" if why else "")
             for s, c, r, why in leaks[:MAX_LINES]]
    if len(leaks) > MAX_LINES:
        lines.append(f"… and {len(leaks) - MAX_LINES} more")
    lines.append(f"no receive of rank {receiver} waits for it and none took it yet: it is not why the job waits now; "
                 "a receive posted for it later never completes on gloo, and every later send from that rank to that "
                 "peer in the group waits behind it")
    ranks = sorted({s for s, _, _, _ in leaks})
    return gf.LEAK(title, detail="\n".join(lines), ranks=ranks, check=gf.CHECK,
                   data={"sends": [dict(r, rank=s) for s, _, r, _ in leaks[:MAX_LINES]], "count": len(leaks)})


def dropped_send(states: Mapping[int, Any]) -> Finding | None:
    """A rank blocked in a receive that takes a send its peer dropped without wait() (guard.E009)."""
    return p2p_drops(states)[0]


def _snapshots(states: Mapping[int, Any], ranks: list[int]) -> list[RankSnapshot]:
    """The answers' snapshots of ``ranks`` (each read once, as it arrived: embedded.guard.looks.parse_answer)."""
    snaps = []
    for rank in ranks:
        state = states.get(rank)
        raw = state.get("snapshot") if isinstance(state, dict) else None
        snap = raw if isinstance(raw, RankSnapshot) else RankSnapshot.from_dict(raw)
        if snap is not None and snap.rank == rank:
            snaps.append(snap)
    return snaps


def cut_problem(states: Mapping[int, Any], ranks: list[int]) -> str:
    """Why these answers cannot describe one moment of the job ("" when they can: diagnosis.cut)."""
    from distdoctor.diagnosis.cut import impossible  # loaded only when a stall is looked at

    return "; ".join(impossible(_snapshots(states, ranks)))


def decide(states: Mapping[int, Any], ranks: list[int], waited_s: float | None, *,
           world_known: bool = True) -> list[Finding]:
    """Findings for ``ranks`` from their published states ({"snapshot", "running", "dropped", "receives"})."""
    from distdoctor.diagnosis.diagnose import diagnose  # loaded only when a hang or a failure is diagnosed

    snaps = _snapshots(states, ranks)
    found = diagnose(snaps, world_size=None, waited_s=waited_s) if not world_known else \
        diagnose(_all(snaps, ranks), waited_s=waited_s)
    paired, leaks = p2p_drops(states)
    proven = paired is not None and paired.data.get("proven")
    # The proof comes first (it is why the job cannot finish); an unproven pairing is said after the
    # diagnosis, and a leak only beside a verdict (alone, it is no stall).
    verdict = ([paired] if proven else []) + found + ([paired] if paired is not None and not proven else [])
    return verdict + leaks if verdict else []


def _all(snaps: list[RankSnapshot], ranks: list[int]) -> list[RankSnapshot]:
    """Every rank of the group has a snapshot; one that has none was not heard from (nothing claimed)."""
    from distdoctor.diagnosis.snapshot import NOT_HEARD

    have = {s.rank for s in snaps}
    return snaps + [RankSnapshot(rank=r, status=NOT_HEARD, notes=("no snapshot of this rank",))
                    for r in ranks if r not in have]
