"""Rendezvous stage: rank 0 reads every rank's check-in and names what the ranks disagree on.

These checks run at rank 0 over ``ctx.world.checkins`` (distdoctor.world.store_exchange.CheckIns): the
check-in of every process that reached the store, keyed by (rank, claim). Rank 0's own check-in
is the reference: its WORLD_SIZE defines the world the others must agree with. Elsewhere (no
world, or a rank other than 0) they skip: the data lives at rank 0.
"""

from __future__ import annotations

from statistics import median
from typing import Any, Iterable, Mapping

from distdoctor.core.context import CheckContext
from distdoctor.core.findings import Finding
from distdoctor.core.registry import SkipCheck, check, finding_kind
from distdoctor.core.rank_groups import MAX_LINES, hosts_text, ranks_label, said_alike
from distdoctor.core.report import format_ranks

RANK_MISSING = finding_kind(
    "rdzv.C004",
    cause="rank_missing",
    title="Ranks never checked in before the deadline",
    hint="Look at the named ranks' logs (crashed, not started, stuck before init); the job cannot start without them",
)
RANK_COLLISION = finding_kind(
    "rdzv.C005",
    cause="rank_config_error",
    title="Two processes claim the same rank",
    hint="Give every process its own RANK: let the launcher set it (torchrun, srun), or fix the script that exports it",
)
WORLD_SIZE_DISAGREES = finding_kind(
    "rdzv.C006",
    cause="rank_config_error",
    title="Ranks disagree about WORLD_SIZE",
    hint="Set the same WORLD_SIZE on every rank (torchrun: the same --nnodes and --nproc-per-node on every node)",
)
RANK_OUT_OF_RANGE = finding_kind(
    "rdzv.C007",
    cause="world_size_mismatch",
    title="A process checked in with a rank outside rank 0's world",
    hint="More processes run than WORLD_SIZE says: fix WORLD_SIZE or start fewer processes",
)
NODE_RANK_COLLISION = finding_kind(
    "rdzv.E008",
    cause="rank_config_error",
    title="Two hosts claim the same node rank",
    hint="Give every node its own --node-rank (or let the c10d rendezvous assign them: --rdzv-backend c10d)",
)
MASTER_DIFFERS = finding_kind(
    "rdzv.W009",
    cause="rank_config_error",
    title="Ranks name the master differently",
    hint="Use one MASTER_ADDR spelling on every rank; a name that resolves differently on one node splits the job",
)
VERSIONS_DIFFER = finding_kind(
    "rdzv.E010",
    cause="version_incompat",
    title="torch, CUDA or NCCL versions differ between ranks",
    hint="Run the same environment (image, venv) on every node; mixed versions hang or corrupt collectives",
)
IFNAME_DIFFERS = finding_kind(
    "rdzv.W011",
    cause="wrong_interface",
    title="A socket-interface setting differs between ranks",
    hint="Set NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME the same way on every rank (a prefix like ^lo,docker fits all)",
)
SETTING_DIFFERS = finding_kind(
    "rdzv.W012",
    cause="rank_config_error",
    title="A NCCL/TORCH/GLOO setting differs between ranks",
    hint="Export the same NCCL_*/TORCH_*/GLOO_* settings on every rank (e.g. in the job script, not per node)",
)
DUPLICATE_GPU = finding_kind(
    "rdzv.E013",
    cause="duplicate_gpu",
    title="Two ranks are bound to the same physical GPU",
    hint="Bind each rank to its own GPU: torch.cuda.set_device(local_rank), and one CUDA_VISIBLE_DEVICES entry per rank",
)
LATE_CHECKIN = finding_kind(
    "rdzv.W014",
    cause="straggler_rank",
    title="A rank checked in far later than the others",
    hint="Find out what delays that rank's start (slow node, image pull, data loading before init); others wait for it",
)
CHECKIN_UNREADABLE = finding_kind(
    "rdzv.W015",
    cause="unknown",
    title="A rank's check-in could not be read",
    hint="Run the same distdoctor version on every rank; the detail says what was wrong with the message",
)

# A rank this much later than the median arrival is a straggler (seconds, and share of the
# rendezvous wait): container starts differ by a few seconds on healthy clusters.
STRAGGLER_MIN_S = 5.0
STRAGGLER_SHARE = 0.25
# Settings compared across ranks; the launchers set some of them per rank on purpose.
COMPARED_PREFIXES = ("NCCL_", "TORCH_", "GLOO_")
PER_RANK_SETTINGS = frozenset({"TORCHELASTIC_RUN_ID"})
IFNAME_SETTINGS = frozenset({"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_IB_HCA"})


def _ranks(ranks: Iterable[int]) -> str:
    ranks = sorted(set(ranks))
    return ("rank " if len(ranks) == 1 else "ranks ") + format_ranks(ranks)


def _checkins(ctx: CheckContext) -> Any:
    checkins = getattr(ctx.world, "checkins", None) if ctx.world is not None else None
    if checkins is None:
        raise SkipCheck("runs at rank 0 over every rank's check-in")
    return checkins


def _host(payload: Mapping[str, Any] | None) -> str | None:
    host = (payload or {}).get("host")
    return str(host) if host else None


def _hosts(payloads: Mapping[int, Mapping[str, Any]], ranks: Iterable[int]) -> list[str]:
    return [h for h in dict.fromkeys(_host(payloads.get(r)) for r in sorted(ranks)) if h]


def _launch(payload: Mapping[str, Any]) -> Mapping[str, Any]:
    return (payload.get("snapshot") or {}).get("launcher") or {}


def _group_by(values: Mapping[int, Any]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for rank, value in sorted(values.items()):
        groups.setdefault("unset" if value is None else repr(value), []).append(rank)
    return groups


def _describe_groups(groups: Mapping[str, list[int]], payloads: Mapping[int, Mapping[str, Any]]) -> str:
    parts = []
    for value, ranks in sorted(groups.items(), key=lambda kv: kv[1][0]):
        hosts = _hosts(payloads, ranks)
        label = "rank" if len(ranks) == 1 else "ranks"
        parts.append(f"{value} on {label} {format_ranks(ranks)}" + (f" ({hosts_text(hosts)})" if hosts else ""))
    return "; ".join(parts)


def _odd_ones(groups: Mapping[str, list[int]]) -> list[int]:
    """The ranks outside rank 0's group (all of them when rank 0 is absent)."""
    reference = next((ranks for ranks in groups.values() if 0 in ranks), [])
    return sorted(r for ranks in groups.values() if ranks is not reference for r in ranks)


def _disagreement(kind: Any, what: str, groups: Mapping[str, list[int]], payloads: Mapping[int, Mapping[str, Any]],
                  detail: str, data: Mapping[str, Any]) -> Finding:
    """One value that differs between ranks: named with each value's ranks and hosts; the ranks
    outside rank 0's group are the ones the finding names (rank 0 is the reference)."""
    odd = _odd_ones(groups)
    return kind(
        f"{what} between ranks: {_describe_groups(groups, payloads)}",
        detail=detail,
        ranks=odd,
        hosts=_hosts(payloads, odd),
        data=data,
    )


# -- who is there -----------------------------------------------------------------------------
def missing_rank_hosts(missing: Iterable[int], accepted: Mapping[int, Mapping[str, Any]]) -> dict[int, str]:
    """Where missing ranks would have run, when the launcher's layout tells (LOCAL_WORLD_SIZE
    ranks per node, numbered node by node as torchrun does, and the reported ranks fit that)."""
    sizes = {p.get("local_world_size") for p in accepted.values()}
    if len(sizes) != 1:
        return {}
    per_node = next(iter(sizes))
    if not isinstance(per_node, int) or per_node < 1:
        return {}
    node_host: dict[int, str] = {}
    for rank, payload in accepted.items():
        host = _host(payload)
        if host is None:
            continue
        if node_host.setdefault(rank // per_node, host) != host:
            return {}  # the layout is not node-by-node: no guess
    return {r: node_host[r // per_node] for r in missing if r // per_node in node_host}


@check(stage="rendezvous", tags=("rendezvous",), emits=(RANK_MISSING, CHECKIN_UNREADABLE))
def all_ranks_checked_in(ctx: CheckContext):
    """Every rank 0..WORLD_SIZE-1 checked in through the store before the deadline."""
    checkins = _checkins(ctx)
    for (rank, claim), problem in sorted(checkins.unreadable.items()):
        yield CHECKIN_UNREADABLE(
            f"The check-in of rank {rank} could not be read",
            detail=problem,
            ranks=(rank,),
            data={"rank": rank, "claim": claim},
        )
    missing = checkins.missing
    if not missing:
        return
    accepted = checkins.accepted
    hosts = missing_rank_hosts(missing, accepted)
    where = "; ".join(said_alike(((r, h) for r, h in sorted(hosts.items())),
                                 lambda label, host, ranks: f"{label} expected on {host}"))
    yield RANK_MISSING(
        f"{len(missing)} of {checkins.expected} ranks never checked in: {_ranks(missing)}",
        detail=f"Rank 0 waited {checkins.waited_s:.1f}s for WORLD_SIZE={checkins.expected} ranks; "
        f"ranks {format_ranks(checkins.reported) or 'none'} checked in."
        + (f" From the launcher's layout: {where}." if where else "")
        + " torch's own rendezvous would wait here until its timeout (10-30 minutes) and then fail "
        "with a socket timeout.",
        ranks=missing,
        hosts=dict.fromkeys(hosts.values()),
        data={"missing": missing, "reported": checkins.reported, "waited_s": round(checkins.waited_s, 3),
              "expected_hosts": {str(r): h for r, h in hosts.items()}},
    )


def collision_findings(checkins: Any, only_ranks: Iterable[int] | None = None) -> list[Finding]:
    """Ranks claimed by more than one process, naming every claimant's PID and host."""
    wanted = set(only_ranks) if only_ranks is not None else None
    duplicates = {r: c for r, c in sorted(checkins.duplicates.items()) if wanted is None or r in wanted}
    if len(duplicates) > MAX_LINES:
        return [_collisions_at_scale(checkins, duplicates)]
    out = []
    for rank, claims in duplicates.items():
        claimants = [checkins.payloads.get((rank, c)) or {} for c in claims]
        names = [f"PID {p.get('pid', '?')} on {p.get('host', '?')}" for p in claimants]
        out.append(
            RANK_COLLISION(
                f"Rank {rank} is claimed by {len(claims)} processes: {', '.join(names)}",
                detail=f"Every one of them set RANK={rank}. The first to check in ({names[0]}) took part in "
                "the collective stage; the others were kept out, since a real job's collectives would "
                "pair them up at random and hang or corrupt data.",
                ranks=(rank,),
                hosts=[str(p.get("host")) for p in claimants if p.get("host")],
                data={"rank": rank, "pids": [p.get("pid") for p in claimants],
                      "claimants": [{"pid": p.get("pid"), "host": p.get("host")} for p in claimants]},
                check="rendezvous.unique_ranks",
            )
        )
    return out


def _collisions_at_scale(checkins: Any, duplicates: Mapping[int, list[int]]) -> Finding:
    """Many ranks claimed twice (a second job on the same MASTER_PORT): one finding, ranks grouped."""
    ranks = sorted(duplicates)
    claimants = {r: [checkins.payloads.get((r, c)) or {} for c in claims] for r, claims in duplicates.items()}
    hosts = list(dict.fromkeys(str(p.get("host")) for ps in claimants.values() for p in ps if p.get("host")))
    lines = said_alike(((r, f"claimed by {len(ps)} processes on {hosts_text(dict.fromkeys(str(p.get('host', '?')) for p in ps))}")
                        for r, ps in claimants.items()), lambda label, text, group: f"{label} {text}")
    return RANK_COLLISION(
        f"{ranks_label(ranks, capital=True)} are each claimed by more than one process",
        detail="\n".join(lines) + "\nThe first to check in for each rank took part in the collective stage; the "
        "others were kept out, since a real job's collectives would pair them up at random and hang or corrupt "
        "data (every claimant's PID and host: --format json).",
        ranks=ranks, hosts=hosts,
        data={"ranks": ranks, "claimants": {str(r): [{"pid": p.get("pid"), "host": p.get("host")} for p in ps]
                                            for r, ps in claimants.items()}},
        check="rendezvous.unique_ranks")


@check(stage="rendezvous", tags=("rendezvous",), emits=(RANK_COLLISION, RANK_OUT_OF_RANGE, NODE_RANK_COLLISION))
def unique_ranks(ctx: CheckContext):
    """Each rank is claimed by exactly one process, inside the world, and node ranks are unique per host."""
    checkins = _checkins(ctx)
    yield from collision_findings(checkins)
    outside = sorted({a.rank for a in checkins.arrivals if not 0 <= a.rank < checkins.expected})
    if outside:
        payloads = {r: p for (r, c), p in checkins.payloads.items() if r in outside}
        yield RANK_OUT_OF_RANGE(
            f"{_ranks(outside).capitalize()} checked in, but rank 0's WORLD_SIZE is {checkins.expected}",
            detail=f"Rank 0 expects ranks 0..{checkins.expected - 1}; "
            + "; ".join(said_alike(((r, f"PID {p.get('pid', '?')} on {p.get('host', '?')}, WORLD_SIZE="
                                        f"{_launch(p).get('world_size')}") for r, p in sorted(payloads.items())),
                                   lambda label, text, ranks: f"{label}: {text}")),
            ranks=outside,
            hosts=_hosts(payloads, outside),
            data={"ranks": outside, "world_size": checkins.expected},
        )
    node_hosts: dict[int, dict[str, list[int]]] = {}
    for rank, payload in checkins.accepted.items():
        node, host = payload.get("node_rank"), _host(payload)
        if isinstance(node, int) and host:
            node_hosts.setdefault(node, {}).setdefault(host, []).append(rank)
    for node, by_host in sorted(node_hosts.items()):
        if len(by_host) > 1:
            ranks = sorted(r for rs in by_host.values() for r in rs)
            yield NODE_RANK_COLLISION(
                f"Node rank {node} is claimed by {len(by_host)} hosts: {', '.join(sorted(by_host))}",
                detail="; ".join(f"{h}: ranks {format_ranks(rs)}" for h, rs in sorted(by_host.items())),
                ranks=ranks,
                hosts=sorted(by_host),
                data={"node_rank": node, "hosts": {h: sorted(rs) for h, rs in by_host.items()}},
            )


@check(stage="rendezvous", tags=("rendezvous",), emits=(WORLD_SIZE_DISAGREES, MASTER_DIFFERS))
def world_agreement(ctx: CheckContext):
    """Every rank has rank 0's WORLD_SIZE and names the same master."""
    checkins = _checkins(ctx)
    # Every first claimant, also those outside rank 0's world (unique_ranks names them): their
    # WORLD_SIZE is part of the disagreement.
    everyone = checkins.accepted
    accepted = {r: p for r, p in everyone.items() if 0 <= r < checkins.expected}
    sizes = _group_by({r: _launch(p).get("world_size") for r, p in everyone.items()})
    if len(sizes) > 1:
        yield _disagreement(
            WORLD_SIZE_DISAGREES, "WORLD_SIZE differs", sizes, everyone,
            detail="init_process_group waits for WORLD_SIZE ranks; ranks with another number wait for a "
            "world that never completes (or complete one the others are not in).",
            data={"world_sizes": sizes, "reference": checkins.expected},
        )
    for var, field_name in (("MASTER_ADDR", "master_addr"), ("MASTER_PORT", "master_port")):
        groups = _group_by({r: _launch(p).get(field_name) for r, p in accepted.items()})
        if len(groups) > 1:
            yield _disagreement(
                MASTER_DIFFERS, f"{var} differs", groups, accepted,
                detail="Every rank reached the same store this time, so the names lead to the same place "
                "from where they are used; a value that resolves differently elsewhere (or after a DNS "
                "change) splits the job.",
                data={"variable": var, "values": groups},
            )


@check(stage="rendezvous", tags=("rendezvous", "versions"), emits=(VERSIONS_DIFFER,))
def versions_agree(ctx: CheckContext):
    """torch, CUDA and NCCL versions are the same on every rank."""
    checkins = _checkins(ctx)
    accepted = checkins.accepted
    for name, label in (("torch", "torch"), ("cuda", "CUDA"), ("nccl", "NCCL")):
        values = {}
        for rank, payload in accepted.items():
            info = (payload.get("snapshot") or {}).get("torch")
            values[rank] = info.get(name) if isinstance(info, dict) else "could not tell"
        groups = _group_by(values)
        if len(groups) > 1:
            yield _disagreement(
                VERSIONS_DIFFER, f"{label} versions differ", groups, accepted,
                detail=f"Collectives between different {label} builds may hang, fail or exchange data in "
                "incompatible layouts.",
                data={"component": name, "versions": groups},
            )


@check(stage="rendezvous", tags=("rendezvous", "env"), emits=(IFNAME_DIFFERS, SETTING_DIFFERS))
def settings_agree(ctx: CheckContext):
    """NCCL_*, TORCH_* and GLOO_* settings are the same on every rank."""
    checkins = _checkins(ctx)
    accepted = checkins.accepted
    envs = {r: (p.get("snapshot") or {}).get("env") for r, p in accepted.items()}
    if any(not isinstance(e, dict) for e in envs.values()):
        unknown = sorted(r for r, e in envs.items() if not isinstance(e, dict))
        raise SkipCheck(f"could not tell: ranks {format_ranks(unknown)} sent no settings")
    names = sorted({k for e in envs.values() for k in e if k.startswith(COMPARED_PREFIXES) and k not in PER_RANK_SETTINGS})
    for name in names:
        groups = _group_by({r: e.get(name) for r, e in envs.items()})
        if len(groups) <= 1:
            continue
        kind = IFNAME_DIFFERS if name in IFNAME_SETTINGS else SETTING_DIFFERS
        yield _disagreement(
            kind, f"{name} differs", groups, accepted,
            detail="Ranks that pick different interfaces or protocols cannot connect to each other, or "
            "behave differently under the same fault."
            if kind is IFNAME_DIFFERS
            else "Ranks with different settings behave differently under the same fault (timeouts, "
            "error handling, algorithms).",
            data={"variable": name, "values": groups},
        )


@check(stage="rendezvous", tags=("rendezvous", "device"), emits=(DUPLICATE_GPU,))
def gpu_mapping(ctx: CheckContext):
    """No two ranks will use the same physical GPU (compared by UUID)."""
    checkins = _checkins(ctx)
    # A rank is bound to a GPU when its backend is nccl; a gloo rank's GPU is not used for it.
    accepted = {r: p for r, p in checkins.accepted.items() if (p.get("snapshot") or {}).get("backend") == "nccl"}
    by_uuid: dict[str, list[int]] = {}
    for rank, payload in accepted.items():
        device = payload.get("device")
        if isinstance(device, dict) and device.get("uuid"):
            by_uuid.setdefault(str(device["uuid"]), []).append(rank)
    if not by_uuid:
        raise SkipCheck("no rank binds a GPU it can name by UUID (nccl ranks with GPUs)")
    for uuid, ranks in sorted(by_uuid.items()):
        if len(ranks) < 2:
            continue
        ranks = sorted(ranks)
        hows = "; ".join(said_alike(((r, str(accepted[r]['device'].get('how', '?'))) for r in ranks),
                                    lambda label, how, group: f"{label}: {how}"))
        yield DUPLICATE_GPU(
            f"{_ranks(ranks).capitalize()} are bound to the same GPU {uuid}",
            detail=f"{hows}. Two ranks on one GPU share its memory and serialize its work; NCCL refuses "
            "it (\"Duplicate GPU detected\").",
            ranks=ranks,
            hosts=_hosts(accepted, ranks),
            data={"uuid": uuid, "ranks": ranks},
        )


@check(stage="rendezvous", tags=("rendezvous", "timing"), emits=(LATE_CHECKIN,))
def arrival_spread(ctx: CheckContext):
    """No rank checks in far later than the others (seen by rank 0's clock, so no clock skew)."""
    checkins = _checkins(ctx)
    arrivals = [a for a in checkins.arrivals if a.claim == 1 and 0 <= a.rank < checkins.expected]
    if len(arrivals) < 2:
        raise SkipCheck("fewer than two ranks checked in")
    middle = median(a.seen_s for a in arrivals)
    limit = max(STRAGGLER_MIN_S, STRAGGLER_SHARE * checkins.waited_s)
    late = sorted((a for a in arrivals if a.seen_s - middle > limit), key=lambda a: a.rank)
    if late:
        ranks = [a.rank for a in late]
        yield LATE_CHECKIN(
            f"{_ranks(ranks).capitalize()} checked in {max(a.seen_s for a in late) - middle:.1f}s after most ranks",
            detail="; ".join(said_alike(((a.rank, f"+{a.seen_s - middle:.1f}s") for a in late),
                                        lambda label, text, group: f"{label}: {text}"))
            + f" (median arrival at {middle:.1f}s; a straggler is more than {limit:.1f}s late).",
            ranks=ranks,
            hosts=_hosts(checkins.accepted, ranks),
            data={"late_s": {str(a.rank): round(a.seen_s - middle, 3) for a in late}, "limit_s": limit},
        )
