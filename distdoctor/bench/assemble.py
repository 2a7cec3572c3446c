"""Rank 0 turns every rank's figures into the report's data and its findings (nothing here talks)."""

from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence

from distdoctor.bench.compare import compare
from distdoctor.bench.interfaces import suspicious
from distdoctor.bench.kinds import (BENCH_STOPPED, REGRESSION, SLOW_HOST, SLOW_LINK, WRONG_INTERFACE,
                                    WRONG_RESULT, OP_UNSUPPORTED)
from distdoctor.bench.outliers import INTER, Slow, Verdict, judge
from distdoctor.bench.sizes import bus_factor
from distdoctor.core.findings import Finding
from distdoctor.core.report import format_ranks

CHECK = "bench"


def sig(value: float, digits: int = 6) -> float:
    """Rounded to significant digits: GB/s figures of small messages are far below 1e-3."""
    return float(f"{value:.{digits}g}")


def sweep_rows(per_rank: Mapping[int, Sequence[Mapping[str, Any]]], size: int) -> list[dict[str, Any]]:
    """One row per (op, size): time averaged over ranks (nccl-tests' default), algbw, busbw."""
    order: list[tuple[str, int]] = []
    rows: dict[tuple[str, int], list[tuple[int, Mapping[str, Any]]]] = {}
    for rank, own in sorted(per_rank.items()):
        for row in own:
            key = (str(row["op"]), int(row["bytes"]))
            if key not in rows:
                order.append(key)
                rows[key] = []
            rows[key].append((rank, row))
    out = []
    for key in order:
        entries = rows[key]
        op, nbytes = key
        times = [float(r["time_s"]) for _, r in entries]
        mean = statistics.fmean(times)
        algbw = nbytes / mean / 1e9 if mean > 0 else None
        wrong = sorted(rank for rank, r in entries if not r.get("correct", False))
        out.append({
            "op": op, "bytes": nbytes, "size": entries[0][1].get("size"), "count": entries[0][1].get("count"),
            "iters": entries[0][1].get("iters"), "time_us": sig(mean * 1e6),
            "time_us_slowest_rank": sig(max(times) * 1e6),
            "algbw_gbs": None if algbw is None else sig(algbw),
            "busbw_gbs": None if algbw is None else sig(algbw * bus_factor(op, size)),
            "correct": not wrong, "wrong_ranks": wrong, "ranks": len(entries),
        })
    return out


def with_hosts(links: Sequence[Mapping[str, Any]], hosts: Mapping[int, str]) -> list[dict[str, Any]]:
    out = []
    for link in links:
        a, b = int(link["a"]), int(link["b"])
        out.append({**link, "host_a": hosts.get(a, "?"), "host_b": hosts.get(b, "?")})
    return sorted(out, key=lambda l: (l["a"], l["b"]))


def _figure(slow: Slow) -> str:
    if slow.metric == "bandwidth":
        return f"{slow.value:.3g} GB/s against a median of {slow.reference:.3g} GB/s ({slow.ratio:.2g}x)"
    return f"{slow.value:.0f} us latency against a median of {slow.reference:.0f} us ({slow.ratio:.2g}x)"


def _slow_data(slow: Slow) -> dict[str, Any]:
    return {"a": slow.edge.a, "b": slow.edge.b, "kind": slow.edge.kind, "metric": slow.metric,
            "value": sig(slow.value), "median": sig(slow.reference), "ratio": sig(slow.ratio, 4)}


def slow_findings(verdict: Verdict, hosts: Mapping[int, str]) -> list[Finding]:
    findings: list[Finding] = []
    explained = set()
    for node, (kind, slows) in sorted(verdict.slow_nodes.items()):
        explained.update(s.edge for s in slows)
        inter = kind == INTER
        ranks = sorted(r for r, h in hosts.items() if h == node) if inter else [int(node)]
        name = f"host {node}" if inter else f"rank {node} (inside host {hosts.get(int(node), '?')})"
        lines = [f"{s.edge.a} - {s.edge.b}: {_figure(s)}" for s in slows]
        findings.append(SLOW_HOST(
            f"Every link of {name} is much slower than its peers'",
            detail="Links to the others, each against the median of its class:\n" + "\n".join(lines),
            ranks=ranks, hosts=(node,) if inter else (hosts.get(int(node), "?"),), check=CHECK,
            data={"node": node, "kind": kind, "links": [_slow_data(s) for s in slows]},
        ))
    for slow in verdict.slow:
        if slow.edge in explained:
            continue
        inter = slow.edge.kind == INTER
        what = f"hosts {slow.edge.a} and {slow.edge.b}" if inter else f"ranks {slow.edge.a} and {slow.edge.b}"
        findings.append(SLOW_LINK(
            f"The link between {what} is much slower than its peers ({slow.metric})",
            detail=f"{slow.edge.a} - {slow.edge.b}: {_figure(slow)}",
            ranks=slow.edge.ranks, hosts=(slow.edge.a, slow.edge.b) if inter else (hosts.get(slow.edge.ranks[0], "?"),),
            check=CHECK, data=_slow_data(slow),
        ))
    return findings


def interface_findings(routes: Mapping[int, Mapping[str, Any]], hosts: Mapping[int, str]) -> list[Finding]:
    """One finding per (host, reason) for routes to other hosts that take the wrong way out."""
    grouped: dict[tuple[str, str], dict[str, Any]] = {}
    for rank, info in sorted(routes.items()):
        for peer, route in sorted((info.get("routes") or {}).items()):
            why = suspicious(route, info.get("faster") or [])
            if why:
                entry = grouped.setdefault((hosts.get(rank, "?"), why), {"ranks": set(), "peers": set(), "route": route})
                entry["ranks"].add(rank)
                entry["peers"].add(peer)
    return [WRONG_INTERFACE(
        f"Traffic from {host} to {', '.join(sorted(e['peers']))} goes the wrong way out",
        detail=f"{why.capitalize()}.", ranks=sorted(e["ranks"]), hosts=(host,), check=CHECK,
        data={"route": dict(e["route"]), "peers": sorted(e["peers"])},
    ) for (host, why), e in sorted(grouped.items())]


def result_findings(rows: Sequence[Mapping[str, Any]], stopped: Mapping[int, str]) -> list[Finding]:
    findings = []
    wrong = [r for r in rows if not r["correct"]]
    if wrong:
        ranks = sorted({x for r in wrong for x in r["wrong_ranks"]})
        findings.append(WRONG_RESULT(
            f"{len(wrong)} collective result{'s' if len(wrong) > 1 else ''} did not match the expected values",
            detail="\n".join(f"{r['op']} {r['size']}: wrong on ranks {format_ranks(r['wrong_ranks'])}" for r in wrong),
            ranks=ranks, check=CHECK, data={"wrong": [{"op": r["op"], "bytes": r["bytes"], "ranks": r["wrong_ranks"]} for r in wrong]},
        ))
    if stopped:
        reasons = sorted(set(stopped.values()))
        findings.append(BENCH_STOPPED(
            detail="\n".join(f"ranks {format_ranks([r for r, w in stopped.items() if w == why])}: {why}" for why in reasons),
            ranks=sorted(stopped), check=CHECK, data={"stopped": {str(r): w for r, w in sorted(stopped.items())}},
        ))
    return findings


def unsupported_findings(unsupported: Mapping[str, str], backend: str) -> list[Finding]:
    """The ops this torch's backend cannot run at all: not measured, said once."""
    if not unsupported:
        return []
    ops = sorted(unsupported)
    return [OP_UNSUPPORTED(
        f"Not measured: {', '.join(ops)} (this torch's {backend} cannot run {'it' if len(ops) == 1 else 'them'})",
        detail="\n".join(f"{op}: {unsupported[op]}" for op in ops), check=CHECK, data={"unsupported": dict(unsupported)},
    )]


def regression_findings(bench: Mapping[str, Any], baseline: Mapping[str, Any] | None, tolerance: float) -> tuple[list[Finding], dict[str, Any] | None]:
    if baseline is None:
        return [], None
    regressions, common = compare(bench, baseline, tolerance)
    summary = {"tolerance": tolerance, "compared": common, "regressions": [r.to_dict() for r in regressions]}
    if not regressions:
        return [], summary
    lines = [f"{r.what}: {r.current:.4g} now, {r.baseline:.4g} in the baseline ({r.change:+.0%})" for r in regressions]
    return [REGRESSION(
        f"{len(regressions)} of {common} figures are worse than the baseline by more than {tolerance:.0%}",
        detail="\n".join(lines), check=CHECK, data=summary,
    )], summary


def assemble(*, size: int, hosts: Mapping[int, str], sweeps: Mapping[int, Sequence[Mapping[str, Any]]],
             links: Sequence[Mapping[str, Any]], routes: Mapping[int, Mapping[str, Any]], stopped: Mapping[int, str],
             backend: str, baseline: Mapping[str, Any] | None = None, tolerance: float = 0.2,
             measured_links: bool = True, unsupported: Mapping[str, str] | None = None) -> tuple[dict[str, Any], list[Finding]]:
    """(the report's data.bench, the findings) from what every rank measured."""
    rows = sweep_rows(sweeps, size)
    linked = with_hosts(links, hosts)
    verdict = judge(linked)
    per_host: dict[str, list[int]] = {}
    for rank, host in sorted(hosts.items()):
        per_host.setdefault(host, []).append(rank)
    bench: dict[str, Any] = {
        "backend": backend, "world_size": size, "hosts": per_host, "sweep": rows,
        "links": {
            "measured": measured_links,
            "pairs": [{**{k: l.get(k) for k in ("a", "b", "host_a", "host_b", "bytes", "iters")},
                       **{k: sig(l[k]) if isinstance(l.get(k), float) else l.get(k) for k in ("lat_us", "bw_gbs")}}
                      for l in linked],
            "host_pairs": [e.to_dict() for e in verdict.edges if e.kind == INTER],
            "intra_host": [e.to_dict() for e in verdict.edges if e.kind != INTER],
            "medians": verdict.references, "notes": verdict.notes,
        },
        "interfaces": {str(r): dict(v) for r, v in sorted(routes.items())},
    }
    if unsupported:
        bench["unsupported"] = dict(sorted(unsupported.items()))
    findings = (result_findings(rows, stopped) + unsupported_findings(unsupported or {}, backend)
                + slow_findings(verdict, hosts) + interface_findings(routes, hosts))
    more, summary = regression_findings(bench, baseline, tolerance)
    if summary is not None:
        bench["compare"] = summary
    return bench, findings + more
