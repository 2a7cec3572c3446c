"""The link matrix: point-to-point latency and bandwidth of every rank pair, in O(n) rounds.

Each round of the round-robin schedule (distdoctor.bench.pairing) runs its disjoint pairs at
the same time; a small all_reduce between rounds keeps the ranks in step and carries the
deadline (any rank past it stops everyone). In a pair the lower rank leads: it ping-pongs a
small message (latency = half the round trip) and then a large one (bandwidth = bytes over
half the round trip), and tells its partner how many timed exchanges follow, from a first
untimed one, so that a slow link gets few and a fast one many within the same budget.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

from distdoctor.bench.comm import Comm
from distdoctor.bench.pairing import partner_in, round_robin
from distdoctor.bench.sweep import DEADLINE_STOP

LATENCY_BYTES = 8
LATENCY_BUDGET_S, LATENCY_MAX_ITERS = 0.1, 200
BANDWIDTH_BUDGET_S, BANDWIDTH_MAX_ITERS = 0.3, 50


@dataclass(frozen=True)
class LinkPlan:
    link_bytes: int
    deadline: float


def _exchange(comm: Comm, buf: Any, peer: int, lead: bool) -> None:
    """One round trip: the leader sends then receives, its partner receives then sends."""
    dist, group = comm.dist, comm.group
    if lead:
        dist.send(buf, peer, group=group)
        dist.recv(buf, peer, group=group)
    else:
        dist.recv(buf, peer, group=group)
        dist.send(buf, peer, group=group)


def _round_trips(comm: Comm, buf: Any, peer: int, lead: bool, budget_s: float, max_iters: int) -> list[float]:
    """The leader's timed round trips (seconds); the partner returns [] after taking part."""
    timer = comm.timer()
    timer.start()
    _exchange(comm, buf, peer, lead)  # untimed first exchange: connection set-up, page faults
    first = timer.stop()
    count = comm.full(1, min(max_iters, max(1, int(budget_s / max(first, 1e-9)))) if lead else 0)
    if lead:
        comm.dist.send(count, peer, group=comm.group)
    else:
        comm.dist.recv(count, peer, group=comm.group)
    times = []
    for _ in range(int(count.item())):
        timer.start()
        _exchange(comm, buf, peer, lead)
        times.append(timer.stop())
    return times if lead else []


def measure_pair(comm: Comm, peer: int, lead: bool, plan: LinkPlan) -> dict[str, Any] | None:
    small = comm.full(max(LATENCY_BYTES // 4, 1), 0.0)
    rtts = _round_trips(comm, small, peer, lead, LATENCY_BUDGET_S, LATENCY_MAX_ITERS)
    large = comm.full(max(plan.link_bytes // 4, 1), 0.0)
    bw_rtts = _round_trips(comm, large, peer, lead, BANDWIDTH_BUDGET_S, BANDWIDTH_MAX_ITERS)
    if not lead:
        return None
    one_way = statistics.median(bw_rtts) / 2
    return {"a": comm.rank, "b": peer, "lat_us": statistics.median(rtts) / 2 * 1e6,
            "bw_gbs": large.numel() * 4 / one_way / 1e9, "bytes": large.numel() * 4,
            "iters": {"latency": len(rtts), "bandwidth": len(bw_rtts)}}


def run_link_matrix(comm: Comm, plan: LinkPlan, progress: Callable[[str], None] = lambda _: None,
                    clock: Callable[[], float] = time.monotonic) -> tuple[list[dict[str, Any]], str | None]:
    """This rank's measured links (the pairs it led), and why the matrix stopped early if it did."""
    rounds = round_robin(comm.size)
    links: list[dict[str, Any]] = []
    for index, pairs in enumerate(rounds):
        progress(f"round {index + 1}/{len(rounds)}")
        try:
            (stop,) = comm.agree_max([1.0 if clock() > plan.deadline else 0.0])
            if stop:
                return links, f"{DEADLINE_STOP} round {index + 1} of {len(rounds)} of the link matrix"
            peer, lead = partner_in(pairs, comm.rank)
            if peer is not None:
                link = measure_pair(comm, peer, lead, plan)
                if link is not None:
                    links.append(link)
        except Exception as exc:  # a peer went away: the group cannot go on
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return links, f"round {index + 1} failed: {text}"
    return links, None
