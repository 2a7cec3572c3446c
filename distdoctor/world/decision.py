"""Rank 0's decision for the collective stage: which groups can form, and whether nccl runs."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from distdoctor.core.config import Config
from distdoctor.core.findings import Severity
from distdoctor.core.rank_groups import said_alike
from distdoctor.world.rank_state import ranks_text
from distdoctor.world.store_exchange import CheckIns


def group_blockers(checkins: CheckIns) -> dict[str, list[str]]:
    """backend -> the ranks whose own local findings show they cannot create that backend's group.

    Only facts that make the creation fail for certain count: *_SOCKET_IFNAME naming an interface
    that does not exist on the rank's host (gloo stops with "Unable to find address for: X"; NCCL
    finds "no socket interface"), the backend not built in. A down interface or one without an
    address is left to the collective stage itself (a rank whose group fails tells the others
    through the store at once).
    """
    found: dict[str, list[tuple[int, str]]] = {"gloo": [], "nccl": []}
    for rank, payload in sorted(checkins.accepted.items()):
        if not 0 <= rank < checkins.expected:
            continue
        host = payload.get("host")
        for raw in payload.get("findings") or ():
            if not isinstance(raw, Mapping):
                continue
            try:
                severe = Severity.parse(raw.get("severity", "info")) >= Severity.ERROR
            except (KeyError, ValueError):
                continue
            if not severe:
                continue
            try:
                blocked = _backends_blocked(raw)
            except (TypeError, AttributeError):
                continue  # a finding of a shape no distdoctor writes: not evidence of anything
            for backend in blocked:
                found[backend].append((rank, f"{f' on {host}' if host else ''}: {raw.get('title')} ({raw.get('id')})"))
    # Ranks with the same finding (but for numbers) said once, as ranges: 4,096 ranks, a few lines.
    return {backend: said_alike(items, lambda label, text, ranks: f"{label}{text}") for backend, items in found.items()}


def _backends_blocked(finding: Mapping[str, Any]) -> tuple[str, ...]:
    data = finding.get("data") if isinstance(finding.get("data"), Mapping) else {}
    cause = finding.get("cause")
    if cause == "wrong_interface":
        existing = data.get("interfaces")
        if not isinstance(existing, list):
            return ()
        if data.get("variable") == "GLOO_SOCKET_IFNAME":
            unusable = data.get("unusable") or []
            return ("gloo",) if any(name not in existing for name in unusable) else ()
        if data.get("variable") == "NCCL_SOCKET_IFNAME" and data.get("matched") == []:
            return ("nccl",)
        return ()
    if cause == "backend_unavailable":
        backend = data.get("backend")
        if backend in ("gloo", "nccl"):
            return (backend,)
        return ("gloo", "nccl") if "backend" not in data and "reason" not in data else ()
    return ()


def nccl_decision(checkins: CheckIns, config: Config, blockers: Sequence[str] = ()) -> dict[str, Any]:
    """Whether every rank runs the nccl collectives (all must agree, or the group would hang)."""
    if config.backend not in (None, "nccl"):
        return {"nccl": False, "nccl_reason": f"skipped: the configured backend is {config.backend}"}
    accepted = {r: p for r, p in checkins.accepted.items() if 0 <= r < checkins.expected}
    if not accepted or checkins.missing:
        return {"nccl": False, "nccl_reason": "skipped: not every rank checked in"}
    if blockers:
        return {"nccl": False, "nccl_reason": "skipped: the nccl group cannot form: " + "; ".join(blockers)}
    without_gpu = sorted(r for r, p in accepted.items() if not isinstance(p.get("device"), dict))
    backends = {r: ((p.get("snapshot") or {}).get("torch") or {}) for r, p in accepted.items()}
    without_nccl = sorted(
        r for r, info in backends.items()
        if not (isinstance(info, dict) and (info.get("backends") or {}).get("nccl"))
    )
    if without_gpu or without_nccl:
        reasons = []
        if without_gpu:
            reasons.append(f"{ranks_text(without_gpu)} {'has' if len(without_gpu) == 1 else 'have'} no GPU")
        if without_nccl:
            reasons.append(f"{ranks_text(without_nccl)} {'has' if len(without_nccl) == 1 else 'have'} no nccl")
        return {"nccl": False, "nccl_reason": "skipped: " + " and ".join(reasons)}
    devices = {str(r): int(p["device"].get("index", 0)) for r, p in accepted.items()}
    return {"nccl": True, "devices": devices}
