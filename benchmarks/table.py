"""The benchmark table: figures as aligned text or markdown (run.py and every bench script print it).

It reads a figure's fields only (timing.Figure's), so it imports neither run.py nor timing.py.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Sequence


def _seconds(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"


def _ratio(f: Any) -> str:
    if f.ratio_text:
        return f.ratio_text
    return "-" if f.ratio is None else f"{f.ratio:.2f}x"


def rows(figures: Sequence[tuple[str, Any]]) -> list[list[str]]:
    out = []
    for bench, f in figures:
        if f.median_s is None:
            out.append([bench, f.name, "not available yet", "", "", f.target,
                        f.note.removeprefix("not available yet: ")])
            continue
        runs = f"{_seconds(f.median_s)} (n={len(f.runs_s)})"
        base = f.baseline
        if f.baseline_median_s is not None:
            base += f": {_seconds(f.baseline_median_s)}" + (f" (n={len(f.baseline_runs_s)})" if f.baseline_runs_s else "")
        out.append([bench, f.name, runs, base, _ratio(f), f.target, f.subject + (f"; {f.note}" if f.note else "")])
    return out


HEADER = ["bench", "figure", "median", "baseline (median)", "ratio", "target", "subject; note"]


def print_table(figures: Sequence[Any], markdown: bool = False, file=None) -> None:
    """Print (benchmark, figure) pairs; bare figures (a bench script run alone) get "-"."""
    file = file or sys.stdout
    table = rows([item if isinstance(item, tuple) else ("-", item) for item in figures])
    if markdown:
        print("| " + " | ".join(HEADER) + " |", file=file)
        print("|" + "---|" * len(HEADER), file=file)
        for row in table:
            print("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |", file=file)
        return
    widths = [min(max(len(r[i]) for r in [HEADER, *table]), 60) for i in range(len(HEADER) - 1)]
    for row in [HEADER, *table]:
        cells = [row[i].ljust(widths[i]) for i in range(len(HEADER) - 1)] + [row[-1]]
        print("  ".join(cells).rstrip(), file=file)
