"""`distdoctor guard --` names the rank a DDP job waits for, what it costs, where and why: real 2-rank gloo jobs.

Each fault's job runs once and its first verdict is judged: rank 1's read is slower (data loading), rank 1
collects a large heap every 4th step (Python's GC), rank 1 shares its core with a busy process (CPU
contention). Their healthy twin runs once: the same reads and collections on every rank, both ranks on one
core shared with a busy process (every rank contends alike): it names no one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from guard_torchrun import launch, line_of

pytestmark = pytest.mark.multiproc
SCRIPT = Path(__file__).with_name("scripts") / "pace_job.py"
SECONDS = 16
WINDOW = "5"
SLOW_LINE = re.compile(r"^distdoctor guard \(rank 0\): slow rank: (?P<text>.*)$", re.M)
COST = re.compile(r"waits ([\d.]+) ms per step for")


def run(tmp_path: Path, mode: str, *args: str, cores: str) -> tuple[str, dict[int, dict[str, float]]]:
    """The job under `distdoctor guard --`; (its output, each rank's own figures)."""
    cmd = [sys.executable, "-m", "distdoctor", "guard", "--report-dir", str(tmp_path), "--", sys.executable, "-m",
           "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(SCRIPT), mode, str(SECONDS), *args]
    result = launch(cmd, tmp_path, timeout=240, env={"DISTDOCTOR_GUARD_SLOW": "on", "DISTDOCTOR_GUARD_SLOW_WINDOW": WINDOW,
                                                     "DISTDOCTOR_TEST_CORES": cores})
    out = result.stdout
    # torchrun's two ranks may print on one line: each rank's figures are read where they stand.
    figures = {int(m["rank"]): {k: float(v) for k, v in re.findall(r"(\w+_ms) ([\d.]+)", m.group(0))}
               for m in re.finditer(r"rank (?P<rank>\d) injected_ms [\d.]+ varied_ms [\d.]+ rest_ms [\d.]+ "
                                    r"steps \d+ step_ms [\d.]+", out)}
    assert set(figures) == {0, 1}, out[-4000:]
    return out, figures


def verdict(tmp_path: Path) -> tuple[dict, dict]:
    """The run's slow-rank finding (from the guard's JSON report) and slow_ranks.json."""
    [report] = [json.loads(p.read_text()) for p in tmp_path.glob("distdoctor-guard-slow-rank0-*.json")]
    named = [f for f in report["findings"] if f["id"] in ("slow.W001", "slow.W002")]
    assert len(named) == 1, report["findings"]
    return named[0], json.loads((tmp_path / "slow_ranks.json").read_text())


def number(tag: str) -> int:
    return int(line_of(SCRIPT, tag).rsplit(":", 1)[1])


def within(value: float, expected: float, tolerance: float = 0.25) -> bool:
    return abs(value - expected) <= tolerance * expected


def cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def check_named(out: str, tmp_path: Path, expected_ms: float, call: str, inner: str | None, family: str,
                tolerance: float = 0.25) -> dict:
    """The first live line and the run's verdict name rank 1, its cost within ``tolerance`` (25 %), the call where
    its time goes (and the line inside it, unless ``inner`` is None), and the family."""
    lines = SLOW_LINE.findall(out)
    assert lines, out[-4000:]
    first = lines[0]  # the first live verdict: its rank, its line, its family
    assert first.startswith("Rank 1 on ") and f":{number(call)}; why: {family}" in first, first
    # Its cost is that of its first windows; the one compared with the extra the job measured itself over the
    # whole run is the run's verdict (the machine's other load moves both over a run).
    assert float(COST.search(first).group(1)) > 0.3 * expected_ms, (first, expected_ms)
    finding, document = verdict(tmp_path)
    data = finding["data"]
    assert finding["ranks"] == [1] and data["slow"] == [1], finding
    assert within(data["cost_ms_per_step"], expected_ms, tolerance), (data["cost_ms_per_step"], expected_ms)
    assert data["family"] == family, finding["detail"]
    row = data["rows"][0] if data["rows"] else {}
    assert row.get("frame", [None, None])[1] == number(call), finding["detail"]
    if inner is not None:
        assert (row.get("inner") or [None, None])[1] == number(inner), finding["detail"]
    assert document["heard_from"] == [0, 1] and set(document["ranks"]) == {"0", "1"}
    assert (tmp_path / "report.html").exists() and (tmp_path / "trace.json").exists()
    return finding


def test_a_slower_read_on_rank_1_is_named_with_its_cost_line_and_data_loading(tmp_path):
    # Both ranks on one core: they contend alike. The cost expected is the 4 ms the read waits longer (its own
    # wall time also holds the time it then waits for the core, which rank 0's work overlaps).
    out, _ = run(tmp_path, "data", "4", cores=f"{cores()[0]},{cores()[0]}")
    finding = check_named(out, tmp_path, 4.0, "data", "extra", "data loading")
    assert "speedup" in finding["data"] and finding["data"]["speedup"] > 1.0
    assert "Feed the rank faster" in finding["remediation"]


def test_rank_1_collecting_a_large_heap_is_named_with_pythons_gc(tmp_path):
    out, figures = run(tmp_path, "gc", cores=f"{cores()[0]},{cores()[0]}")
    # What the heap costs the job is more than the time in gc.collect(): the same guarded job without the heap
    # (`pace_job.py data 16 0`, twice each, 2026-11-30, a quiet 2-core machine) took 19.55-19.75 ms a step against
    # 23.3-23.6 ms with it, 3.6-4.0 ms for 2.9-3.0 ms in collect (1.2-1.4x; the slower step after a collection of a
    # large heap). So the cost is judged against 1.25x the collections' time, within 40 %.
    finding = check_named(out, tmp_path, 1.25 * figures[1]["injected_ms"], "tidy", "collect", "gc", tolerance=0.4)
    assert finding["data"]["rows"][0]["gc"] > 0.5 and finding["data"]["rows"][0]["only_here"]


def busy(core: int, count: int = 1) -> list[subprocess.Popen]:
    """Busy processes pinned to one core (ended by their PIDs: end()), each in a session of its own: with the
    kernel's autogroups on (sched_autogroup_enabled), a core is shared between sessions, and torchrun starts
    each rank in one of its own, so four busy processes of one session would weigh as one."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True,
                             preexec_fn=lambda: os.sched_setaffinity(0, {core})) for _ in range(count)]


def end(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()


# alone: rank 0 on its own core, rank 1 sharing one with a busy process; the other test worker's jobs landing on
# rank 0's core made rank 0 the slower (named, "cpu contention", in a run of this file beside the suite's).
@pytest.mark.alone
def test_rank_1_sharing_its_core_with_a_busy_process_is_named_with_cpu_contention(tmp_path):
    if len(cores()) < 2:
        pytest.skip("needs 2 cores: rank 0 on one, rank 1 and a busy process on the other")
    first, second = cores()[:2]
    try:  # rank 1 starts the busy process on its own core, in its own session (the script says why)
        out, figures = run(tmp_path, "contend", cores=f"{first},{second}")
    finally:
        pid = tmp_path / "busy.pid"
        if pid.exists():
            try:
                os.kill(int(pid.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    expected = figures[1]["injected_ms"] - figures[0]["injected_ms"]  # the batch's CPU work, longer on rank 1
    assert expected > 1.0, figures
    # The cost within 25 %, as the others'. Rank 0 waits right after 2 ms on a CPU, and the scheduler's run time
    # of a thread lags until a tick: read from schedstat alone its waits read short, and the cost 37-54 % of the
    # job's own extra (CI once 0.667 ms for 1.777); from the thread's CPU clock, 91-105 % in 3 runs alone here.
    finding = check_named(out, tmp_path, expected, "data", None, "cpu contention")
    assert finding["id"] == "slow.W002" and finding["cause"] == "cpu_oversubscription"
    # The line inside is one of the batch's work, not always the loop's: on the contended core the sampler thread
    # runs when the main thread is preempted, and the busy process, woken as the batch begins, preempts it first at
    # `a = torch.randn(96, 96)` (a CI-equivalent run of 2026-11-30 named that line, the loop's the run before).
    assert finding["data"]["rows"][0]["inner"][2] == "make_batch", finding["detail"]


def test_the_healthy_twin_names_no_one(tmp_path):
    # The same reads, collections and CPU work on every rank, both ranks on one core beside a busy process.
    hogs = busy(cores()[0])
    try:
        out, _ = run(tmp_path, "balanced", cores=f"{cores()[0]},{cores()[0]}")
    finally:
        end(hogs)
    assert not SLOW_LINE.findall(out), out[-4000:]
    for path in tmp_path.glob("distdoctor-guard-slow-rank0-*.json"):
        ids = [f["id"] for f in json.loads(path.read_text())["findings"]]
        assert not {"slow.W001", "slow.W002"} & set(ids), ids
    assert "rank 0 done" in out and "rank 1 done" in out
