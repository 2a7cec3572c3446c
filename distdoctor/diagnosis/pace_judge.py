"""The cross-rank judgment of the job's pace: which rank the others wait for, what it costs, where and why."""

# Within each process group (ranks of different groups do different work: pipeline stages are
# never compared), from each rank's own waits per step. The rank the group waits for waits least:
# its waits stay at the transfer floor while its peers wait for it. The slow set is the ranks whose
# wait is far below the others' (a few, never half the group); its cost is what the least-waiting
# other rank waits more than the slowest of them, per step. The what-if (the job's step without it) is
# less: each step that other rank would wait less by at most that cost, and by no more than it waited
# above the transfer floor; where the ranks' own jitter is large against the cost, the slow rank hid it
# (it arrived last) and the job still waits for it. So the step saved is the mean over that rank's steps
# of its wait above the floor capped at the cost, read from its histogram of waits per step.
# Ranks that take turns leave no such set: then the job's wait above the transfer floor is the
# spread. A group whose every rank waits for a CPU is contention for all, and no rank is blamed. A
# rank not heard from is not compared, and never named.

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping

from distdoctor.core.findings import Finding
from distdoctor.core.rank_groups import hosts_text, ranks_label, ranges_text
from distdoctor.diagnosis import pace_kinds as kinds
from distdoctor.diagnosis.pace import GroupPace, RankPace, fraction_below, quantile_ms, share_above_integral_ms
from distdoctor.diagnosis.pace_where import differential, frame_text
from distdoctor.diagnosis.pace_why import CONTENTION, why

MIN_STEPS = 10          # measured steps a rank needs in a group to be compared
MIN_SHARE = 0.08        # a slow rank costs at least this share of the step (balanced jobs on a shared host: up to 6 %)
MIN_COST_S = 5e-5
SLOW_FRACTION = 0.25    # a slow rank's wait above the least is under this share of the median's
SPREAD_SHARE = 0.15     # the job waits this share of the step above the floor, no rank to blame
CONTENTION_SHARE = 0.25
CONTENTION_EVEN = 2.5   # ... on every rank, none with more than this many times another's share
STAGE_SHARE = 0.10
MAX_PEERS = 16          # peers whose profiles the slow rank's is compared with


@dataclass
class Verdict:
    findings: list[Finding] = field(default_factory=list)
    named: dict[int, dict[str, Any]] = field(default_factory=dict)   # slow rank -> its figures
    groups: list[dict[str, Any]] = field(default_factory=list)       # every group's figures


@dataclass
class _Member:
    pace: RankPace
    group: GroupPace
    wait_s: float           # mean wait per measured step
    step_s: float           # wall per step


def judge(ranks: Mapping[int, RankPace], world: int | None = None) -> Verdict:
    """Findings from every rank heard from (each over the same span: a horizon, or the whole run)."""
    verdict = Verdict()
    names = sorted({key for pace in ranks.values() for key in pace.groups if key[0] == "collective"})
    for key in names:
        members = _members(ranks, key)
        if len(members) >= 2:
            _judge_group(key[1], members, ranks, world, verdict)
    _stages(ranks, verdict)
    _blind(ranks, verdict)
    return verdict


def _members(ranks: Mapping[int, RankPace], key: tuple[str, str]) -> dict[int, _Member]:
    out = {}
    for rank, pace in ranks.items():
        group = pace.groups.get(key)
        if group is None or group.measured_steps < MIN_STEPS or group.steps < MIN_STEPS or pace.wall_s <= 0:
            continue
        out[rank] = _Member(pace, group, group.waited_s / group.measured_steps, pace.wall_s / group.steps)
    return out


def _judge_group(name: str, members: dict[int, _Member], ranks: Mapping[int, RankPace], world: int | None,
                 verdict: Verdict) -> None:
    waits = {r: m.wait_s for r, m in members.items()}
    step = statistics.median(m.step_s for m in members.values())
    least = min(waits.values())
    above = {r: w - least for r, w in waits.items()}
    middle = statistics.median(above.values())
    slow = sorted(r for r, e in above.items() if e <= SLOW_FRACTION * middle)
    if len(slow) > max(1, len(members) // 2):
        slow = []
    others = [r for r in members if r not in slow]
    cost = (min(waits[r] for r in others) - max(waits[r] for r in slow)) if slow and others else 0.0
    floor_ms = min((quantile_ms(m.group.hist, 0.1) or 0.0) for m in members.values())
    figures = {"group": name, "ranks": sorted(members), "step_ms": round(step * 1e3, 3), "floor_ms": round(floor_ms, 3),
               "waits_ms": {str(r): round(w * 1e3, 3) for r, w in sorted(waits.items())}, "slow": slow,
               "cost_ms": round(cost * 1e3, 3), "share": round(cost / step, 4) if step else 0.0}
    verdict.groups.append(figures)
    runq = {r: (m.pace.runq_s or 0.0) / m.pace.wall_s for r, m in members.items() if m.pace.runq_s is not None}
    if slow and cost >= MIN_COST_S and step and cost / step >= MIN_SHARE:
        _name(name, slow, others, members, cost, step, floor_ms, ranks, world, verdict)
    elif len(runq) == len(members) and min(runq.values()) >= CONTENTION_SHARE \
            and max(runq.values()) <= CONTENTION_EVEN * min(runq.values()):
        verdict.findings.append(_contention_all(name, runq, members))
    elif step and (statistics.median(waits.values()) - floor_ms / 1e3) / step >= SPREAD_SHARE:
        verdict.findings.append(_spread(name, members, waits, step, floor_ms))


def _name(group: str, slow: list[int], others: list[int], members: dict[int, _Member], cost: float, step: float,
          floor_ms: float, ranks: Mapping[int, RankPace], world: int | None, verdict: Verdict) -> None:
    first = members[slow[0]]
    peer_ids = [others[i * len(others) // min(len(others), MAX_PEERS)] for i in range(min(len(others), MAX_PEERS))]
    peers = [members[r] for r in peer_ids]
    rows = differential(first.pace, first.group.steps, [(m.pace, m.group.steps) for m in peers])
    reason = why(_timed(first), [_timed(m) for m in peers], rows)
    last = fraction_below(first.group.hist, floor_ms + cost * 1e3 / 2) or 0.0
    steps = sum(members[r].group.measured_steps for r in slow)
    saved = _saved_per_step(members[min(others, key=lambda r: members[r].wait_s)], floor_ms, cost)
    speedup = step / (step - saved) if step > saved > 0 else None
    hosts = list(dict.fromkeys(ranks[r].host for r in slow if ranks[r].host))
    who = ranks_label(slow, capital=True) + (f" on {hosts_text(hosts)}" if hosts else "")
    n_others = len(others)
    them = f"the other {'rank waits' if n_others == 1 else f'{n_others} ranks wait'}"
    title = (f"{who} make{'s' if len(slow) == 1 else ''} every step wait: {them} {cost * 1e3:.1f} ms per step for "
             f"{'it' if len(slow) == 1 else 'them'} ({cost / step:.0%} of step time)"
             + (f"; without {'it' if len(slow) == 1 else 'them'} a step would take {saved * 1e3:.1f} ms less "
                f"({speedup:.2f}x faster)" if speedup else ""))
    detail = _detail(group, slow, others, members, step, floor_ms, last, steps, rows, reason.text)
    kind = kinds.CONTENDED if reason.family == CONTENTION else kinds.SLOW_RANK
    data = {"group": group, "slow": slow, "cost_ms_per_step": round(cost * 1e3, 3), "share": round(cost / step, 4),
            "saved_ms_per_step": round(saved * 1e3, 3), "speedup": round(speedup, 4) if speedup else None,
            "step_ms": round(step * 1e3, 3),
            "last_share": round(last, 3), "steps": steps, "family": reason.family,
            "parts_ms": {k: round(v * 1e3, 3) for k, v in reason.parts.items()},
            "rows": [_row_data(r) for r in rows], "waits_ms": {str(r): round(members[r].wait_s * 1e3, 3) for r in members},
            "compared": len(members), "heard_from": len(ranks), "world": world}
    verdict.findings.append(kind(title, detail=detail, remediation=reason.fix, ranks=slow, hosts=hosts, data=data,
                                 check=kinds.CHECK))
    for rank in slow:
        verdict.named[rank] = {**data, "rank": rank, "line": frame_text(rows[0].frame) if rows else None}


def _saved_per_step(latest: _Member, floor_ms: float, cost: float) -> float:
    """The step (s) the job would save without the slow set: E[min(X, cost)], X the least-waiting other rank's
    wait above the transfer floor per step, from its histogram (without one, the cost).

    Read two ways: the integral of its waits' share above s from the floor to floor + cost, and its mean wait
    above the floor (exact) less the integral above floor + cost. A bin is 1.8x wide and read as filled evenly,
    which moves a narrow spread of waits down or up inside it: the first reads low where the waits sit in a
    bin's upper part below floor + cost, the second where they sit in its lower part above it (each within 2 %
    where the other is off by 8-30 %, waits drawn with a known saving). The larger of the two, never above cost.
    """
    hist, cap_ms = latest.group.hist, floor_ms + cost * 1e3
    direct = share_above_integral_ms(hist, floor_ms, cap_ms)
    beyond = share_above_integral_ms(hist, cap_ms, math.inf)
    if direct is None or beyond is None:
        return cost
    below_floor = floor_ms - share_above_integral_ms(hist, 0.0, floor_ms)   # E[max(floor - W, 0)]
    mean_above = latest.wait_s * 1e3 - floor_ms + below_floor
    return min(cost, max(direct, mean_above - beyond) / 1e3)


def _timed(member: _Member) -> tuple[RankPace, float, float]:
    waited = sum(g.waited_s for g in member.pace.groups.values())
    return member.pace, float(member.group.steps), waited


def _detail(group: str, slow: list[int], others: list[int], members: dict[int, _Member], step: float, floor_ms: float,
            last: float, steps: int, rows: list[Any], why_text: str) -> str:
    def span(ranks: list[int]) -> str:
        values = sorted(members[r].wait_s * 1e3 for r in ranks)
        return f"{values[0]:.1f} ms" if values[-1] - values[0] < 0.05 else f"{values[0]:.1f}-{values[-1]:.1f} ms"

    where = "the default group" if group in ("0", "default") else f"group {group}"
    lines = [f"{'it arrives' if len(slow) == 1 else 'they arrive'} last at {last:.0%} of the {steps} steps measured "
             f"in {where} (a wait at the transfer floor, {floor_ms:.2f} ms)",
             f"waits per step: {ranks_label(slow)} {span(slow)}; {ranks_label(others)} {span(others)}; "
             f"a step takes {step * 1e3:.1f} ms",
             f"why: {why_text}"]
    for row in rows:
        inner = f" (inside: {frame_text(row.inner)})" if row.inner and row.inner[:3] != row.frame[:3] else ""
        peers = "only this rank runs it" if row.only_here else f"its peers {row.peers_s * 1e3:.1f} ms there"
        lines.append(f"where: +{row.extra_s * 1e3:.1f} ms per step at {frame_text(row.frame)}{inner}: "
                     f"{row.slow_s * 1e3:.1f} ms per step there, {peers}")
    return "\n".join(lines)


def _row_data(row: Any) -> dict[str, Any]:
    return {"frame": list(row.frame), "extra_ms": round(row.extra_s * 1e3, 3), "slow_ms": round(row.slow_s * 1e3, 3),
            "peers_ms": round(row.peers_s * 1e3, 3), "share": round(row.share, 3), "only_here": row.only_here,
            "inner": list(row.inner) if row.inner else None, "cpu": round(row.cpu, 3), "runq": round(row.runq, 3),
            "blocked": round(row.blocked, 3), "gc": round(row.gc, 3), "data": round(row.data, 3),
            "inner_data": round(row.inner_data, 3)}


def _contention_all(group: str, runq: dict[int, float], members: dict[int, _Member]) -> Finding:
    low, high = min(runq.values()), max(runq.values())
    hosts = list(dict.fromkeys(m.pace.host for m in members.values() if m.pace.host))
    return kinds.CONTENTION_ALL(
        f"{ranks_label(runq, capital=True)} wait for a CPU {low:.0%}-{high:.0%} of the time: the ranks contend for "
        "cores, no one rank to blame", ranks=[], hosts=hosts, check=kinds.CHECK,
        detail=f"runnable but not running, per rank: {ranges_text(runq)} {low:.0%}-{high:.0%} of the wall time",
        data={"group": group, "runq_share": {str(r): round(v, 3) for r, v in sorted(runq.items())}})


def _spread(group: str, members: dict[int, _Member], waits: dict[int, float], step: float, floor_ms: float) -> Finding:
    typical = statistics.median(waits.values())
    share = (typical - floor_ms / 1e3) / step
    return kinds.SPREAD(
        f"{ranks_label(members, capital=True)} take turns making the others wait: {share:.0%} of step time above the "
        f"transfer floor, and no one rank is behind", ranks=[], check=kinds.CHECK,
        detail=f"waits per step {min(waits.values()) * 1e3:.1f}-{max(waits.values()) * 1e3:.1f} ms (median "
               f"{typical * 1e3:.1f} ms), transfer floor {floor_ms:.2f} ms, a step {step * 1e3:.1f} ms",
        data={"group": group, "share": round(share, 4), "waits_ms": {str(r): round(w * 1e3, 3) for r, w in waits.items()},
              "step_ms": round(step * 1e3, 3), "floor_ms": round(floor_ms, 3)})


def _stages(ranks: Mapping[int, RankPace], verdict: Verdict) -> None:
    share = {r: sum(g.waited_s for k, g in p.groups.items() if k[0] == "p2p") / p.wall_s
             for r, p in ranks.items() if p.wall_s > 0}
    waiting = sorted(r for r, s in share.items() if s >= STAGE_SHARE)
    if waiting:
        verdict.findings.append(kinds.STAGES(
            f"{ranks_label(waiting, capital=True)} wait {min(share[r] for r in waiting):.0%}-"
            f"{max(share[r] for r in waiting):.0%} of the time in point-to-point calls: stages waiting on each other",
            ranks=waiting, check=kinds.CHECK, data={"p2p_share": {str(r): round(share[r], 3) for r in waiting}}))


def _blind(ranks: Mapping[int, RankPace], verdict: Verdict) -> None:
    notes: dict[str, list[int]] = {}
    for rank, pace in ranks.items():
        for note in pace.notes:
            notes.setdefault(note, []).append(rank)
    for note, which in sorted(notes.items(), key=lambda kv: min(kv[1])):
        verdict.findings.append(kinds.BLIND(f"{ranks_label(which, capital=True)}: {note}", ranks=which, check=kinds.CHECK,
                                            data={"note": note}))
