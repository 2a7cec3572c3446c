"""What a rank tells the others at check-in, and how rank 0 merges the ranks' check results."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from distdoctor.core.context import CheckContext
from distdoctor.core.findings import Finding
from distdoctor.core.stages import STAGES
from distdoctor.core.runner import Runner
from distdoctor.machine.snapshot import collect_snapshot
from distdoctor.world.store_exchange import fit


def device_mapping(ctx: CheckContext) -> dict[str, Any] | None:
    """The GPU this rank will use, as the usual script picks it (cuda:LOCAL_RANK), by UUID."""
    gpus = ctx.gpus()
    if not isinstance(gpus, list) or not gpus:
        return None
    local = ctx.launch.local_rank.value
    if len(gpus) == 1:
        gpu, how = gpus[0], "the only GPU this rank sees"
    elif local is not None and local < len(gpus):
        gpu, how = gpus[local], f"cuda:{local} (LOCAL_RANK) of {len(gpus)} visible GPUs"
    else:
        return None
    return {"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name, "how": how}


def node_rank(ctx: CheckContext) -> int | None:
    launch = ctx.launch
    # machine.launchers reads GROUP_RANK / SLURM_NODEID / NODE_RANK, bounded: never a ValueError.
    return launch.node_rank.value if launch.node_rank is not None else None


def checkin_payload(ctx: CheckContext, runner: Runner) -> dict[str, Any]:
    snapshot = collect_snapshot(ctx)
    payload = {
        "host": snapshot.get("host"),
        "pid": snapshot.get("pid"),
        "snapshot": snapshot,
        "node_rank": node_rank(ctx),
        "local_rank": ctx.launch.local_rank.value,
        "local_world_size": ctx.launch.local_world_size.value,
        "device": device_mapping(ctx),
        "findings": [f.to_dict() for f in runner.state.findings],
        "checks": [r.to_dict() for r in runner.state.results],
    }
    payload["snapshot"] = fit(snapshot, 40 * 1024, droppable=("interfaces", "platform", "gpus", "env"))
    return fit(payload, droppable=("findings",))


def merge_check_entries(entries: Iterable[tuple[Sequence[int], Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One entry per (check, stage, status, reason), with the ranks it holds for."""
    merged: dict[tuple, dict[str, Any]] = {}
    for ranks, entry in entries:
        key = (entry.get("name"), entry.get("stage"), entry.get("status"), entry.get("reason", ""))
        if key not in merged:
            merged[key] = {**entry, "ranks": set(ranks)}
        else:
            target = merged[key]
            target["ranks"].update(ranks)
            target["duration_s"] = max(float(target.get("duration_s", 0.0)), float(entry.get("duration_s", 0.0)))
    out = [{**e, "ranks": sorted(e["ranks"])} for e in merged.values()]
    order = {s: i for i, s in enumerate(STAGES)}
    return sorted(out, key=lambda e: order.get(e.get("stage"), len(order)))


def findings_from(raw: Iterable[Mapping[str, Any]]) -> list[Finding]:
    out = []
    for item in raw or ():
        try:
            out.append(Finding.from_dict(item))
        except (KeyError, ValueError, TypeError):
            continue  # a malformed finding from another rank is dropped, not trusted
    return out
