"""The job's pace in the picture: slow_ranks.json drawn as a lateness strip and a differential profile, counted in trace.json."""

from __future__ import annotations

import json
from pathlib import Path

from trace_format import problems

from distdoctor.diagnosis.pace import SCHEMA
from distdoctor.diagnosis.pace_watch import Watcher
from distdoctor.timeline.html_run import run_page
from distdoctor.timeline.job_report import job_report
from distdoctor.timeline.material import read_material
from distdoctor.timeline.trace import build_trace

HOSTILE = "<script>document.title='pwned'</script>"


def window(rank: int, index: int, wait_ms: float, extra_s: float, line: str) -> dict:
    """A window of 100 steps of 20 ms: this rank waited wait_ms a step; extra_s a step at ``line``."""
    hist = [0] * 25
    hist[10 if wait_ms > 3 else 2] = 100
    frames = [["train.py", 99, "<module>", "main()"], ["train.py", 40, "main", line], ["train.py", 43, "main", "loss.backward()"]]
    return {"schema": SCHEMA, "rank": rank, "host": "node-a", "window": index, "t0": 1_795_000_000.0 + 2 * index,
            "t1": 1_795_000_002.0 + 2 * index, "wall_s": 2.0, "cpu": {"run_s": 1.0, "runq_s": 0.05, "blocked_s": 0.95},
            "gc": {"s": 0.0, "n": 0, "full": 0},
            "waits": [{"group": "0", "kind": "collective", "waited_s": wait_ms / 10, "regions": 100, "measured_regions": 100,
                       "steps": 100, "measured_steps": 100, "hist": hist}],
            "profile": {"samples": 40, "waiting": 0, "s": 1.5 + extra_s * 100, "frames": frames,
                        "paths": [[[0, 1], 20, 0.5 + extra_s * 100, 0.4, 0.01, 0, 20], [[0, 2], 20, 1.0, 0.9, 0.01, 0, 0]]},
            "gpu": False, "notes": []}


def report_dir(root: Path) -> Path:
    watcher = Watcher(world=3, window_s=2)
    for index in range(6):
        watcher.feed({0: window(0, index, 4.3, 0.0, "x, y = next(batches)"),
                      1: window(1, index, 0.3, 0.004, f"x, y = next(batches)  # {HOSTILE}"),
                      2: window(2, index, 4.2, 0.0, "x, y = next(batches)")}, float(index))
    root.mkdir(parents=True)
    (root / "slow_ranks.json").write_text(json.dumps(watcher.document(watcher.final())))
    return root


def test_the_pace_is_drawn_as_a_strip_and_the_slow_ranks_profile(tmp_path):
    material = read_material([report_dir(tmp_path / "R")])
    assert material.pace is not None and not any("flight-recorder" in lack for lack in material.lacks)
    report = job_report(material)
    assert [f.id for f in report.findings] == ["slow.W001"] and report.findings[0].ranks == (1,)
    assert report.data["timeline"]["pace"]["strip"]["1"]
    page = run_page(report)
    assert "<h3>The job's pace</h3>" in page and 'aria-label="lateness strip"' in page
    assert "Where rank 1 spends the time the others wait for (data loading)" in page
    assert "<script" not in page.lower() and "&lt;script&gt;" in page


def test_trace_json_counts_each_ranks_wait_per_step_window_by_window(tmp_path):
    trace = build_trace(read_material([report_dir(tmp_path / "R")]))
    assert problems(trace) == []
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert {e["pid"] for e in counters} == {1, 2, 3} and len(counters) == 18
    late = [e["args"]["waits for its peers (ms per step)"] for e in counters if e["pid"] == 2]
    assert max(late) < 1.0 and all(e["ts"] >= 0 for e in counters)
