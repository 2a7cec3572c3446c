"""The guard's verdict on a stuck or failed job: diagnosis.diagnose over every rank's snapshot."""

# One diagnosis for the whole job (diagnosis.diagnose, job.* findings). The guard adds only what
# a snapshot cannot carry: a receive that waits for a send its peer dropped without wait()
# (guard.E009, from the guard's own Work tracking).

from __future__ import annotations

from typing import Any, Mapping

from distdoctor.core.findings import Finding
from distdoctor.diagnosis.snapshot import RankSnapshot
from distdoctor.embedded.guard import findings as gf
from distdoctor.embedded.guard.record import CallRecord

RECEIVES = ("recv", "irecv", "recv_object_list")


def dropped_send(states: Mapping[int, Any]) -> Finding | None:
    """A rank blocked in a receive from a peer that dropped its matching send without wait()."""
    for rank, state in sorted(states.items()):
        for raw in (state or {}).get("running", ()) if isinstance(state, dict) else ():
            call = CallRecord.from_dict(raw)
            peer = call.params.get("peer")
            if call.op not in RECEIVES or not isinstance(peer, int):
                continue
            for dropped in (states.get(peer) or {}).get("dropped", ()):
                sent = CallRecord.from_dict(dropped)
                if sent.params.get("peer") == rank:
                    title = (f"Rank {peer} dropped {sent.label()} at {sent.site} without wait(); "
                             f"rank {rank} waits in {call.summary()} for it")
                    return gf.DROPPED(title, ranks=[peer], check=gf.CHECK,
                                      data={"send": sent.to_dict(), "receive": call.to_dict()})
    return None


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
    """Findings for ``ranks`` from their published states ({"snapshot", "running", "dropped"})."""
    from distdoctor.diagnosis.diagnose import diagnose  # loaded only when a hang or a failure is diagnosed

    snaps = _snapshots(states, ranks)
    found = diagnose(snaps, world_size=None, waited_s=waited_s) if not world_known else \
        diagnose(_all(snaps, ranks), waited_s=waited_s)
    dropped = dropped_send(states)
    return ([dropped] if dropped is not None else []) + found


def _all(snaps: list[RankSnapshot], ranks: list[int]) -> list[RankSnapshot]:
    """Every rank of the group has a snapshot; one that has none was not heard from (nothing claimed)."""
    from distdoctor.diagnosis.snapshot import NOT_HEARD

    have = {s.rank for s in snaps}
    return snaps + [RankSnapshot(rank=r, status=NOT_HEARD, notes=("no snapshot of this rank",))
                    for r in ranks if r not in have]
