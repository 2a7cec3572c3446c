"""Which links and hosts are much slower than their peers: the link matrix judged against its median.

Links are judged within their class (two ranks on one host, or on two hosts), never across:
shared memory or loopback between local ranks is always faster than any NIC.

The reference figure of a class is the median, over the nodes of the class (hosts for links
between hosts, ranks for links inside a host), of each node's own median link. A single slow
host drags down its own figure, and its peers' only halfway, so that the reference stays a
healthy figure even in a 3-host world where two of the three links touch the slow host (the
plain median of those three links would be a slow one).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

INTER, INTRA = "inter_host", "intra_host"
# A link is slow when its bandwidth is below this fraction of the reference (5x slower)...
BW_SLOW_RATIO = 0.2
# ... or its latency above this multiple of the reference and by more than the floor: loopback
# latencies of tens of microseconds jitter by multiples on a loaded machine.
LAT_SLOW_RATIO = 5.0
LAT_FLOOR_US = 500.0


@dataclass(frozen=True)
class Edge:
    """One link between two nodes (hosts or ranks) of a class, with its median figures."""

    a: str
    b: str
    kind: str
    bw_gbs: float | None
    lat_us: float | None
    ranks: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "kind": self.kind, "bw_gbs": _round(self.bw_gbs),
                "lat_us": _round(self.lat_us), "ranks": list(self.ranks)}


@dataclass(frozen=True)
class Slow:
    """An edge (or every edge of a node) much slower than the reference."""

    edge: Edge
    metric: str  # "bandwidth" or "latency"
    value: float
    reference: float

    @property
    def ratio(self) -> float:
        return self.value / self.reference if self.reference else float("inf")


@dataclass
class Verdict:
    edges: list[Edge] = field(default_factory=list)
    slow: list[Slow] = field(default_factory=list)
    # node -> (class, the node's slow edges): nodes all of whose links are slow.
    slow_nodes: dict[str, tuple[str, list[Slow]]] = field(default_factory=dict)
    references: dict[str, dict[str, float | None]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _round(value: float | None, digits: int = 6) -> float | None:
    """Significant digits, not decimals: a throttled link's GB/s is far below 1e-3."""
    return None if value is None else float(f"{float(value):.{digits}g}")


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def host_pair_edges(links: Iterable[Mapping[str, Any]]) -> list[Edge]:
    """Rank-pair links aggregated per host pair (median), for links between two hosts."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for link in links:
        ha, hb = str(link["host_a"]), str(link["host_b"])
        if ha != hb:
            groups.setdefault((min(ha, hb), max(ha, hb)), []).append(link)
    return [Edge(a, b, INTER, _median(l.get("bw_gbs") for l in group), _median(l.get("lat_us") for l in group),
                 tuple(sorted({r for l in group for r in (l["a"], l["b"])})))
            for (a, b), group in sorted(groups.items())]


def rank_pair_edges(links: Iterable[Mapping[str, Any]]) -> list[Edge]:
    """Links between two ranks of one host, one edge each (nodes are the ranks)."""
    return [Edge(str(l["a"]), str(l["b"]), INTRA, l.get("bw_gbs"), l.get("lat_us"), (int(l["a"]), int(l["b"])))
            for l in links if str(l["host_a"]) == str(l["host_b"])]


def _reference(edges: list[Edge], metric: str) -> float | None:
    per_node: dict[str, list[float]] = {}
    for edge in edges:
        value = edge.bw_gbs if metric == "bandwidth" else edge.lat_us
        if value is not None:
            per_node.setdefault(edge.a, []).append(value)
            per_node.setdefault(edge.b, []).append(value)
    return _median(statistics.median(v) for v in per_node.values())


def _is_slow(metric: str, value: float, reference: float) -> bool:
    if metric == "bandwidth":
        return value < BW_SLOW_RATIO * reference
    return value > LAT_SLOW_RATIO * reference and value - reference > LAT_FLOOR_US


def judge_class(edges: list[Edge], kind: str, verdict: Verdict) -> None:
    if len(edges) < 2:
        if edges:
            verdict.notes.append(f"one {kind.replace('_', '-')} link only ({edges[0].a} - {edges[0].b}): "
                                 "no peers to compare it with, so it cannot be called slow or fast")
        return
    refs = {m: _reference(edges, m) for m in ("bandwidth", "latency")}
    verdict.references[kind] = {"bw_gbs": _round(refs["bandwidth"]), "lat_us": _round(refs["latency"])}
    slow_by_edge: dict[Edge, list[Slow]] = {}
    for edge in edges:
        for metric, value in (("bandwidth", edge.bw_gbs), ("latency", edge.lat_us)):
            reference = refs[metric]
            if value is not None and reference and _is_slow(metric, value, reference):
                slow = Slow(edge, metric, value, reference)
                verdict.slow.append(slow)
                slow_by_edge.setdefault(edge, []).append(slow)
    nodes = sorted({n for e in edges for n in (e.a, e.b)})
    for node in nodes:
        own = [e for e in edges if node in (e.a, e.b)]
        others_fine = any(e not in slow_by_edge for e in edges if node not in (e.a, e.b))
        if own and all(e in slow_by_edge for e in own) and others_fine:
            verdict.slow_nodes[node] = (kind, [s for e in own for s in slow_by_edge[e]])


def judge(links: list[Mapping[str, Any]]) -> Verdict:
    """Every link's figures, aggregated per host pair, judged against its class's reference."""
    verdict = Verdict()
    inter = host_pair_edges(links)
    intra = rank_pair_edges(links)
    verdict.edges = inter + intra
    judge_class(inter, INTER, verdict)
    judge_class(intra, INTRA, verdict)
    return verdict
