"""`--compare baseline.json`: this run's figures against a saved bench report, beyond a tolerance."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

DEFAULT_TOLERANCE = 0.2


class BaselineError(ValueError):
    """The baseline cannot be used; the message says why (the CLI turns it into exit 2)."""


@dataclass(frozen=True)
class Regression:
    what: str  # "all_reduce 16M busbw" or "link hosta-hostb bandwidth"
    key: str
    baseline: float
    current: float
    metric: str  # "busbw_gbs", "bw_gbs", "lat_us"

    @property
    def change(self) -> float:
        """Relative change, negative when worse (for latency: a rise counts as a loss)."""
        if self.metric == "lat_us":
            return (self.baseline - self.current) / self.baseline
        return (self.current - self.baseline) / self.baseline

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "key": self.key, "metric": self.metric, "baseline": self.baseline,
                "current": self.current, "change": round(self.change, 4)}


def load_baseline(path: Path) -> dict[str, Any]:
    """The bench figures of a saved `distdoctor bench --format json` report."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise BaselineError(f"cannot read --compare {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise BaselineError(f"--compare {path} is not JSON: {exc}") from None
    bench = (raw.get("data") or {}).get("bench") if isinstance(raw, dict) else None
    if not isinstance(bench, dict) or not isinstance(bench.get("sweep"), list):
        raise BaselineError(f"--compare {path} is not a `distdoctor bench --format json` report "
                            "(no data.bench.sweep in it)")
    return bench


def figures(bench: Mapping[str, Any]) -> dict[str, tuple[str, str, float]]:
    """key -> (label, metric, value) for every comparable figure of a bench run."""
    out: dict[str, tuple[str, str, float]] = {}
    for row in bench.get("sweep") or ():
        if isinstance(row, Mapping) and isinstance(row.get("busbw_gbs"), (int, float)) and row.get("correct", True):
            key = f"sweep/{row.get('op')}/{row.get('bytes')}"
            out[key] = (f"{row.get('op')} {row.get('size')} busbw", "busbw_gbs", float(row["busbw_gbs"]))
    for pair in (bench.get("links") or {}).get("host_pairs") or ():
        if not isinstance(pair, Mapping):
            continue
        name = f"{pair.get('a')}-{pair.get('b')}"
        for metric, label in (("bw_gbs", "bandwidth"), ("lat_us", "latency")):
            value = pair.get(metric)
            if isinstance(value, (int, float)) and value > 0:
                out[f"link/{name}/{metric}"] = (f"link {name} {label}", metric, float(value))
    return out


def compare(current: Mapping[str, Any], baseline: Mapping[str, Any], tolerance: float) -> tuple[list[Regression], int]:
    """Figures worse than the baseline by more than ``tolerance`` (0.2 = 20 %), and how many
    figures the two runs had in common (a comparison of nothing must not read as a pass)."""
    if not 0 <= tolerance < 1:
        raise BaselineError(f"--tolerance must be in [0, 1), got {tolerance}")
    now, before = figures(current), figures(baseline)
    common = sorted(set(now) & set(before))
    regressions = []
    for key in common:
        label, metric, value = now[key]
        base = before[key][2]
        if base <= 0:
            continue
        regression = Regression(label, key, base, value, metric)
        if regression.change < -tolerance:
            regressions.append(regression)
    return regressions, len(common)
