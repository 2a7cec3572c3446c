"""The bench's figures as tables (rich or Markdown) ahead of the usual report; JSON is the report itself."""

from __future__ import annotations

import statistics
from typing import IO, Any, Mapping

from distdoctor.core.render import make_console, render_json, render_markdown, render_rich
from distdoctor.core.report import Report

SWEEP_COLUMNS = ("op", "size", "count", "iters", "time us", "algbw GB/s", "busbw GB/s", "result")
LINK_COLUMNS = ("link", "ranks", "latency us", "bandwidth GB/s")


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if value < 1:
        return f"{value:.{digits}g}"
    return f"{value:.{digits}f}".rstrip("0").rstrip(".")


def sweep_table(bench: Mapping[str, Any]) -> list[list[str]]:
    return [[r["op"], str(r["size"]), str(r["count"]), str(r["iters"]), _num(r["time_us"], 2), _num(r["algbw_gbs"]),
             _num(r["busbw_gbs"]), "ok" if r["correct"] else f"WRONG on {r['wrong_ranks']}"] for r in bench.get("sweep") or ()]


def link_table(bench: Mapping[str, Any]) -> list[list[str]]:
    """Host pairs one row each; links inside a host summarised per host (median, worst)."""
    links = bench.get("links") or {}
    rows = [[f"{e['a']} <-> {e['b']}", str(len(e["ranks"])), _num(e["lat_us"], 2), _num(e["bw_gbs"])]
            for e in links.get("host_pairs") or ()]
    per_host: dict[str, list[Mapping[str, Any]]] = {}
    for pair in links.get("pairs") or ():
        if pair.get("host_a") == pair.get("host_b"):
            per_host.setdefault(str(pair["host_a"]), []).append(pair)
    for host, pairs in sorted(per_host.items()):
        lat = [p["lat_us"] for p in pairs if p.get("lat_us") is not None]
        bw = [p["bw_gbs"] for p in pairs if p.get("bw_gbs") is not None]
        if not lat or not bw:
            continue
        worst = min(pairs, key=lambda p: p.get("bw_gbs") or 0.0)
        rows.append([f"inside {host} (median; slowest {worst['a']}-{worst['b']})", str(len({r for p in pairs for r in (p["a"], p["b"])})),
                     f"{_num(statistics.median(lat), 2)} (max {_num(max(lat), 2)})",
                     f"{_num(statistics.median(bw))} (min {_num(min(bw))})"])
    return rows


def heading(bench: Mapping[str, Any]) -> str:
    hosts = bench.get("hosts") or {}
    return (f"{bench.get('backend')}, {bench.get('world_size')} ranks on {len(hosts)} host{'s' if len(hosts) != 1 else ''}; "
            "time averaged over ranks, GB/s = 1e9 bytes/s, busbw = algbw x nccl-tests' factor")


def render_bench_rich(report: Report, file: IO[str] | None = None, *, verbose: bool = False) -> None:
    from rich import box  # rich is loaded only when something is rendered
    from rich.table import Table  # rich is loaded only when something is rendered

    console = make_console(file)
    # The sweep table needs ~90 columns; a pipe's default of 80 would fold every row.
    console.width = max(console.width, 100)
    bench = report.data.get("bench") if report.data else None
    if bench:
        console.print(f"Collective sweep ({heading(bench)})")
        for title, columns, rows in (("", SWEEP_COLUMNS, sweep_table(bench)), ("Link matrix", LINK_COLUMNS, link_table(bench))):
            if not rows:
                continue
            table = Table(title=title or None, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
            for column in columns:
                table.add_column(column, no_wrap=column in ("op", "link"))
            for row in rows:
                table.add_row(*row)
            console.print(table)
        for note in (bench.get("links") or {}).get("notes") or ():
            console.print(f"note: {note}")
        console.print()
    render_rich(report, console, verbose=verbose)


def _md_table(columns: tuple[str, ...], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)] + ["| " + " | ".join(r) + " |" for r in rows]


def render_bench_markdown(report: Report) -> str:
    text = render_markdown(report, title="distdoctor bench")
    bench = report.data.get("bench") if report.data else None
    if not bench:
        return text
    lines = ["", "### Collective sweep", "", heading(bench), "", *_md_table(SWEEP_COLUMNS, sweep_table(bench))]
    links = link_table(bench)
    if links:
        lines += ["", "### Link matrix", "", *_md_table(LINK_COLUMNS, links)]
    lines += ["", *[f"_note: {n}_" for n in (bench.get("links") or {}).get("notes") or ()]]
    return text + "\n".join(lines) + "\n"


def render_bench(report: Report, fmt: str, file: IO[str] | None = None, *, verbose: bool = False) -> str | None:
    if fmt == "json":
        return render_json(report)
    if fmt == "markdown":
        return render_bench_markdown(report)
    render_bench_rich(report, file, verbose=verbose)
    return None
